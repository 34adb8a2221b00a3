"""Observation: batch metrics recorded anywhere in the tree, flushed to epoch values, queried as trends.

Each graph keeps its own buffers; names are addressed from the root by dotted path (``"encoder.scan.loss"``).
``flush()`` turns every buffer in the tree into one epoch value (the mean), in a deterministic order:
tree order (depth first, registration order), then the order names were first recorded.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import os
import time
from typing import Any

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, PathError
from ..nn import Module
from ..tensor import Tensor
from .paths import PathKind, resolve
from .trend import Trend, TrendGroup

_REDUCERS = ("mean", "sum", "max", "min", "norm", "last")


class _Book:
    """One graph's metric state: batch buffers, epoch histories, modes."""

    __slots__ = ("buffers", "history", "modes", "flush_times")

    def __init__(self) -> None:
        self.buffers: dict[str, list[float]] = {}
        self.history: dict[str, list[float]] = {}
        self.modes: dict[str, str] = {}
        self.flush_times: list[float] = []


def _book(graph: Module) -> _Book:
    book = graph.__dict__.get("_metric_book")
    if book is None:
        book = _Book()
        object.__setattr__(graph, "_metric_book", book)
    return book


def _scalar(value: Any) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise FlowError(f"record: expected a scalar, got a tensor of shape {value.shape}; reduce it first")
        return float(value.item())
    if not isinstance(value, numbers.Real):
        raise FlowError(f"record: value must be a real number or a one-element tensor, got "
                        f"{type(value).__name__} {value!r:.40}")
    return float(value)


def _graph_and_name(root: Module, path: str) -> tuple[Module, str]:
    """The graph owning metric ``path`` and the metric's own name (the last part)."""
    if "." not in path:
        return root, path
    head, _, name = path.rpartition(".")
    kind, graph, last = resolve(root, head)
    if kind is not PathKind.SUBGRAPH:
        raise PathError(f"metric path {path!r}: {head!r} is a tag; metrics live on graphs (labels)")
    return graph.subgraphs()[last], name


def record(graph: Module, name: str, value: Any, mode: str | None = None) -> None:
    """Add one batch value of metric ``name`` to this graph's buffer (``mode="max"`` if higher is better)."""
    if not isinstance(name, str) or not name:
        raise FlowError(f"record: the metric name must be a non-empty str, got {type(name).__name__} {name!r}")
    if "." in name:
        raise FlowError(f"record({name!r}): metric names cannot contain '.'; use record_at for a nested graph")
    book = _book(graph)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise FlowError(f"record: expected a scalar, got a tensor of shape {value.shape}; reduce it first")
        bk = value._backend

        def append(a: Any) -> None:  # one host_call: a step under fg.jit records the value on every replay
            book.buffers.setdefault(name, []).append(float(np.asarray(bk.to_host(a)).reshape(())))

        bk.host_call(append, value.detach()._data, sink=True)
    else:
        book.buffers.setdefault(name, []).append(_scalar(value))
    book.history.setdefault(name, [])
    if mode is not None:
        if mode not in ("min", "max"):
            raise FlowError(f"record: mode must be 'min' or 'max', got {mode!r}")
        book.modes[name] = mode


def record_at(root: Module, path: str, value: Any, mode: str | None = None) -> None:
    """``record`` on the graph at the dotted ``path`` (its last part is the metric name)."""
    graph, name = _graph_and_name(root, path)
    record(graph, name, value, mode)


def collect(graph: Module, tags, reduce: str = "mean") -> dict[str, float]:
    """Scalarise tagged outputs of the last forward and record them as batch values under the tag names."""
    if reduce not in _REDUCERS:
        raise FlowError(f"collect: reduce must be one of {_REDUCERS}, got {reduce!r}")
    names = [tags] if isinstance(tags, str) else list(tags)
    values = getattr(graph, "tag_values", {})
    out = {}
    for name in names:
        if name not in values:
            if name in getattr(graph, "_unkept_tags", ()):
                raise FlowError(f"collect({name!r}): the tag's part is checkpointed with keep_tag_values=False, so "
                                "its value is not kept; call checkpoint_activations(path, keep_tag_values=True) "
                                "to collect it")
            known = sorted(getattr(graph, "tags", {}))
            raise FlowError(f"collect({name!r}): no value for that tag from the last forward; tags: {known}")
        t = values[name]
        with no_grad():
            t = t.float() if not t.dtype.is_floating_point else t
            if reduce == "mean":
                v = t.mean()
            elif reduce == "sum":
                v = t.sum()
            elif reduce == "max":
                v = t.amax()
            elif reduce == "min":
                v = t.amin()
            elif reduce == "norm":
                v = t.norm()
            else:
                v = t.reshape(-1)[-1]
        out[name] = float(v.item())
        record(graph, name, out[name])
    return out


def _graphs_in_order(root: Module) -> list[tuple[str, Module]]:
    """(dotted label path, graph) for the root and every nested labelled graph, depth first."""
    order = [("", root)]
    for label, sub in getattr(root, "subgraphs", dict)().items():
        order.extend((f"{label}.{p}" if p else label, g) for p, g in _graphs_in_order(sub))
    return order


def flush(root: Module) -> dict[str, float]:
    """Turn every batch buffer in the tree into one epoch value (the mean); returns the new epoch values."""
    now = time.perf_counter()
    flushed = {}
    for prefix, graph in _graphs_in_order(root):
        book = _book(graph)
        for name, buf in book.buffers.items():
            if buf:
                value = math.fsum(buf) / len(buf)
                book.history.setdefault(name, []).append(value)
                flushed[f"{prefix}.{name}" if prefix else name] = value
            buf.clear()
    _book(root).flush_times.append(now)
    return flushed


def latest_metrics(root: Module) -> dict[str, float]:
    """The latest epoch value of every metric in the tree, by dotted name, in deterministic order."""
    out = {}
    for prefix, graph in _graphs_in_order(root):
        for name, hist in _book(graph).history.items():
            if hist:
                out[f"{prefix}.{name}" if prefix else name] = hist[-1]
    return out


def history(root: Module, path: str) -> list[float]:
    """All epoch values of metric ``path``."""
    graph, name = _graph_and_name(root, path)
    book = _book(graph)
    if name not in book.history:
        raise FlowError(f"history({path!r}): no metric {name!r} recorded there; known: {sorted(book.history)}")
    return list(book.history[name])


def trend(root: Module, path: str, mode: str | None = None) -> Trend:
    """The ``Trend`` of metric ``path`` (mode from ``record(..., mode=)`` unless given)."""
    graph, name = _graph_and_name(root, path)
    values = history(root, path)
    return Trend(values, mode or _book(graph).modes.get(name, "min"), path)


def trends(root: Module, *paths: str, mode: str | None = None) -> TrendGroup:
    """A ``TrendGroup`` over several metrics."""
    return TrendGroup([trend(root, p, mode) for p in paths])


def eta(root: Module, total_epochs: int) -> float:
    """Seconds left for ``total_epochs`` epochs, from the mean of the recent flush intervals (up to 10)."""
    times = _book(root).flush_times
    done = len(times)
    if done < 2:
        return math.nan
    recent = times[-11:]
    per_epoch = (recent[-1] - recent[0]) / (len(recent) - 1)
    return max(total_epochs - done, 0) * per_epoch


def reset_metrics(root: Module) -> None:
    """Forget every buffer and history in the tree."""
    for _, graph in _graphs_in_order(root):
        object.__setattr__(graph, "_metric_book", _Book())


def plot_html(root: Module, path: str | os.PathLike, names=None) -> str:
    """Write a self-contained HTML page with one SVG chart per metric (no scripts from the network)."""
    metrics = names or list(latest_metrics(root))
    if isinstance(metrics, str):
        metrics = [metrics]
    charts = []
    for name in metrics:
        values = history(root, name)
        charts.append(_svg_chart(name, values))
    title = html.escape(getattr(root, "label", None) or "flowgraph metrics")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + title + "</title><style>"
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222}"
        ".chart{display:inline-block;margin:12px;padding:8px;border:1px solid #ddd;border-radius:6px}"
        "h1{font-size:20px}h2{font-size:14px;margin:4px 0}</style></head><body><h1>" + title + "</h1>"
        + "".join(charts)
        + "<script type='application/json' id='data'>"
        + html.escape(json.dumps({n: history(root, n) for n in metrics}))
        + "</script></body></html>"
    )
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path


def _svg_chart(name: str, values: list[float], width: int = 420, height: int = 220) -> str:
    finite = [v for v in values if math.isfinite(v)]
    pad = 36
    if not finite:
        body = f"<text x='{pad}' y='{height // 2}'>no finite values</text>"
    else:
        lo, hi = min(finite), max(finite)
        if hi == lo:
            hi = lo + 1.0
        n = max(len(values) - 1, 1)

        def xy(i: int, v: float) -> str:
            x = pad + (width - 2 * pad) * i / n
            y = height - pad - (height - 2 * pad) * (v - lo) / (hi - lo)
            return f"{x:.1f},{y:.1f}"

        points = " ".join(xy(i, v) for i, v in enumerate(values) if math.isfinite(v))
        body = (
            f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{points}'/>"
            f"<text x='4' y='{pad}' font-size='11'>{hi:.4g}</text>"
            f"<text x='4' y='{height - pad}' font-size='11'>{lo:.4g}</text>"
            f"<text x='{width - pad}' y='{height - 8}' font-size='11'>epoch {len(values)}</text>"
        )
    return (f"<div class='chart'><h2>{html.escape(name)}</h2><svg width='{width}' height='{height}' "
            f"xmlns='http://www.w3.org/2000/svg'><rect width='100%' height='100%' fill='#fff'/>"
            f"<line x1='{pad}' y1='{height - pad}' x2='{width - pad}' y2='{height - pad}' stroke='#999'/>"
            f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{height - pad}' stroke='#999'/>{body}</svg></div>")
