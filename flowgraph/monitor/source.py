"""Reading what ``Monitor.log`` is given: a dict of metrics, or a graph found by duck typing.

The monitor never imports the builder or the tree. A graph is anything with ``latest_metrics()``; its
optional attributes ``label``, ``parameters()``, ``structural_hash()``, ``device``, ``svg()`` and ``dot()``
are read only when present. A metadata attribute that is present but fails is reported once as a
warning and left out: a monitoring problem must not stop a training run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from flowgraph.errors import FlowError


class MetricSource(Protocol):
    """Anything ``Monitor.log`` can read metrics from besides a dict: a graph with ``latest_metrics()``."""

    def latest_metrics(self) -> Mapping[str, Any]:
        """The metrics of the last finished epoch, ``name -> value``."""
        ...


def to_metric_value(name: str, value: Any) -> float | None:
    """A metric value as a float (int, float, NumPy scalar, 0-d tensor); None when missing or not finite."""
    if value is None:
        return None
    if isinstance(value, bool):
        number = float(value)
    else:
        try:
            number = float(value)
        except (TypeError, ValueError) as error:
            raise FlowError(
                f"Monitor.log: metric {name!r} has value {value!r} of type {type(value).__name__}, "
                "which is not a number; pass a float, an int or a 0-d tensor (one element)"
            ) from error
    return number if math.isfinite(number) else None


def read_metrics(source: Any, where: str = "Monitor.log") -> dict[str, float | None]:
    """The ``name -> value`` metrics of a dict, or of an object with ``latest_metrics()``."""
    if isinstance(source, Mapping):
        raw: Any = source
    elif callable(getattr(source, "latest_metrics", None)):
        raw = source.latest_metrics()
        if raw is None:
            raw = {}
    else:
        raise FlowError(
            f"{where}: expected a dict of metric name -> number or a graph with latest_metrics(), "
            f"got {type(source).__name__}; e.g. mon.log(epoch, seconds, {{'loss': 0.12}}) "
            "or mon.log(epoch, seconds, g)"
        )
    pairs: Iterable[tuple[Any, Any]] = raw.items() if isinstance(raw, Mapping) else raw
    metrics: dict[str, float | None] = {}
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError) as error:
            raise FlowError(
                f"{where}: latest_metrics() must return a dict of name -> number, got an item {pair!r}"
            ) from error
        if not isinstance(name, str) or not name:
            raise FlowError(f"{where}: metric names must be non-empty strings, got {name!r}")
        metrics[name] = to_metric_value(name, value)
    return metrics


def is_graph(source: Any) -> bool:
    """True for an object the monitor treats as a graph (not a plain dict of metrics)."""
    return not isinstance(source, Mapping) and callable(getattr(source, "latest_metrics", None))


@dataclass(frozen=True)
class GraphMetadata:
    """What the dashboard shows about the model; every field None when the graph does not provide it."""

    label: str | None = None
    parameters_total: int | None = None
    parameters_trainable: int | None = None
    parameters_frozen: int | None = None
    structural_hash: str | None = None
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields that are known, as a JSON-ready dict."""
        data: dict[str, Any] = {}
        if self.label is not None:
            data["label"] = self.label
        if self.parameters_total is not None:
            data["parameters"] = {
                "total": self.parameters_total,
                "trainable": self.parameters_trainable,
                "frozen": self.parameters_frozen,
            }
        if self.structural_hash is not None:
            data["structural_hash"] = self.structural_hash
        if self.device is not None:
            data["device"] = self.device
        return data


class MetadataReader:
    """Reads a graph's metadata by duck typing, warning once per failing attribute."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def _warn(self, what: str, error: BaseException) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(
                f"Monitor: reading the graph's {what} failed ({type(error).__name__}: {error}); "
                "it is left out of the dashboard",
                RuntimeWarning,
                stacklevel=4,
            )

    def read(self, graph: Any) -> GraphMetadata:
        """Label, parameter counts, structural hash and device of ``graph``, where present."""
        label = None
        if hasattr(graph, "label"):
            raw_label = graph.label
            if callable(raw_label):  # a method rather than an attribute
                raw_label = self._call(raw_label, "label")
            label = None if raw_label is None else str(raw_label)
        total = trainable = None
        if callable(getattr(graph, "parameters", None)):
            counts = self._count_parameters(graph)
            if counts is not None:
                total, trainable = counts
        structural_hash = None
        if callable(getattr(graph, "structural_hash", None)):
            value = self._call(graph.structural_hash, "structural_hash()")
            structural_hash = None if value is None else str(value)
        device = getattr(graph, "device", None)
        return GraphMetadata(
            label=label,
            parameters_total=total,
            parameters_trainable=trainable,
            parameters_frozen=None if total is None or trainable is None else total - trainable,
            structural_hash=structural_hash,
            device=None if device is None else str(device),
        )

    def _call(self, function: Any, what: str) -> Any:
        try:
            return function()
        except Exception as error:  # a failing metadata source is reported and left out
            self._warn(what, error)
            return None

    def _count_parameters(self, graph: Any) -> tuple[int, int] | None:
        try:
            total = trainable = 0
            for parameter in graph.parameters():
                numel = parameter.numel() if callable(getattr(parameter, "numel", None)) else parameter.size
                count = int(numel)
                total += count
                if bool(getattr(parameter, "requires_grad", False)):
                    trainable += count
            return total, trainable
        except Exception as error:  # a failing metadata source is reported and left out
            self._warn("parameters()", error)
            return None


@dataclass(frozen=True)
class GraphPicture:
    """The graph's picture for the dashboard: SVG text (Graphviz's ``dot``), its DOT source (rendered in the
    browser when there is no SVG) and the drawn nodes' details (path, parameters, frozen state, time)."""

    svg: str | None = None
    dot: str | None = None
    error: str | None = None
    nodes: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "svg"}``, ``{"kind": "dot", "dot": ..., "error": ...}`` or ``{"kind": "none"}``, with
        ``"nodes"`` (one dict per drawn node, keyed by ``id``; the SVG element's id is ``"fg:" + id``)."""
        if self.svg is not None:
            data: dict[str, Any] = {"kind": "svg"}
        elif self.dot is not None:
            data = {"kind": "dot", "dot": self.dot}
            if self.error:
                data["error"] = self.error
        else:
            return {"kind": "none"}
        if self.nodes:
            data["nodes"] = self.nodes
        return data


def _as_text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else str(value)


def has_profile(graph: Any) -> bool:
    """Whether ``graph.profile()`` holds per-node times of a profiled forward (``enable_profiling()``)."""
    if not callable(getattr(graph, "profile", None)):
        return False
    try:
        return bool(graph.profile())
    except Exception:  # a graph-like object whose profile() fails has no profile to show
        return False


def _try(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    try:
        return function(*args, **kwargs), None
    except Exception as failure:  # Graphviz missing or failing, a foreign graph: reported, never raised
        return None, f"{type(failure).__name__}: {failure}"


def read_picture(graph: Any) -> GraphPicture:
    """The graph's DOT (``graph.dot()``) and SVG (``graph.svg()``, needs Graphviz's ``dot`` program), both
    with per-node heat colours when the graph holds a profile, and ``graph.node_details()``; what fails is
    left out (no SVG: the dashboard renders the DOT in the browser)."""
    profiled = has_profile(graph)
    dot = svg = nodes = None
    error = dot_error = None
    if callable(getattr(graph, "dot", None)):
        dot, dot_error = _try(graph.dot, profile=True) if profiled else _try(graph.dot)
        if dot_error is not None and profiled:  # a dot() without the profile keyword
            dot, dot_error = _try(graph.dot)
    if profiled and callable(getattr(graph, "svg_with_profile", None)):
        svg, error = _try(graph.svg_with_profile)
    elif callable(getattr(graph, "svg", None)):
        svg, error = _try(graph.svg)
    if callable(getattr(graph, "node_details", None)):
        nodes, _ = _try(graph.node_details, profile=profiled) if profiled else _try(graph.node_details)
    return GraphPicture(
        svg=None if svg is None else _as_text(svg),
        dot=None if dot is None else _as_text(dot),
        error=error if error is not None else dot_error,
        nodes=nodes if isinstance(nodes, list) else None,
    )
