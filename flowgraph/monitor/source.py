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
    """The graph's picture for the dashboard: SVG text, or DOT source when Graphviz is unavailable."""

    svg: str | None = None
    dot: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "svg"}``, ``{"kind": "dot", "dot": ..., "error": ...}`` or ``{"kind": "none"}``."""
        if self.svg is not None:
            return {"kind": "svg"}
        if self.dot is not None:
            data: dict[str, Any] = {"kind": "dot", "dot": self.dot}
            if self.error:
                data["error"] = self.error
            return data
        return {"kind": "none"}


def _as_text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else str(value)


def read_picture(graph: Any) -> GraphPicture:
    """``graph.svg()`` if it works, else ``graph.dot()`` (e.g. Graphviz's dot is missing), else nothing."""
    error = None
    if callable(getattr(graph, "svg", None)):
        try:
            svg = graph.svg()
            if svg is not None:
                return GraphPicture(svg=_as_text(svg))
        except Exception as failure:  # Graphviz missing or failing: show the DOT source instead
            error = f"{type(failure).__name__}: {failure}"
    if callable(getattr(graph, "dot", None)):
        try:
            dot = graph.dot()
            if dot is not None:
                return GraphPicture(dot=_as_text(dot), error=error)
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
    return GraphPicture(error=error)
