"""The graph tree: dotted paths, freeze/thaw, safetensors checkpoints, observation and trends.

Labelled graphs nested inside graphs form a tree. This layer sits above the builder, so it adds its
methods to ``Graph`` when it is imported (``import flowgraph`` does that): ``g.freeze("encoder.scan")``,
``g.save_checkpoint(path)``, ``g.trend("loss")`` ... The same functions work on any graph as plain
functions too (``flowgraph.tree.freeze(g, "encoder")``).
"""

from __future__ import annotations

from . import checkpoint, observe, paths, trend
from .checkpoint import (
    LoadReport,
    MigrateReport,
    key_map_by_order,
    load_checkpoint,
    load_safetensors_weights,
    load_subgraph_checkpoint,
    migrate_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from .observe import (
    collect,
    eta,
    flush,
    history,
    latest_metrics,
    plot_html,
    record,
    record_at,
    reset_metrics,
    trends,
)
from .paths import (
    PathKind,
    freeze,
    is_frozen,
    module_at,
    named_parameters_at,
    parameters_at,
    resolve,
    set_training_at,
    subgraph_at,
    thaw,
    trainable_parameters,
    validate_path,
)
from .trend import Trend, TrendGroup

# Graph methods: name -> function(graph, ...). `trend` on a graph takes a metric of that graph or a path.
GRAPH_METHODS = {
    "validate_path": validate_path,
    "freeze": freeze,
    "thaw": thaw,
    "is_frozen": is_frozen,
    "trainable_parameters": trainable_parameters,
    "parameters_at": parameters_at,
    "named_parameters_at": named_parameters_at,
    "set_training_at": set_training_at,
    "subgraph_at": subgraph_at,
    "save_checkpoint": save_checkpoint,
    "load_checkpoint": load_checkpoint,
    "load_subgraph_checkpoint": load_subgraph_checkpoint,
    "record": record,
    "record_at": record_at,
    "collect": collect,
    "flush": flush,
    "latest_metrics": latest_metrics,
    "history": history,
    "trend": observe.trend,
    "trend_at": observe.trend,
    "trends": trends,
    "eta": eta,
    "reset_metrics": reset_metrics,
    "plot_html": plot_html,
}


def install(graph_class: type) -> None:
    """Add the tree methods to ``graph_class`` (done for ``flowgraph.builder.Graph`` on import)."""
    for name, fn in GRAPH_METHODS.items():
        setattr(graph_class, name, fn)


def _install_on_graph() -> None:
    from ..builder import Graph

    install(Graph)


_install_on_graph()

__all__ = [
    "GRAPH_METHODS", "LoadReport", "MigrateReport", "PathKind", "Trend", "TrendGroup", "checkpoint", "collect",
    "eta", "flush", "freeze", "history", "install", "is_frozen", "key_map_by_order", "latest_metrics",
    "load_checkpoint", "load_safetensors_weights", "load_subgraph_checkpoint", "migrate_checkpoint",
    "module_at", "named_parameters_at", "observe", "parameters_at", "paths", "plot_html", "read_checkpoint",
    "record", "record_at", "reset_metrics", "resolve", "save_checkpoint", "set_training_at", "subgraph_at",
    "thaw", "trainable_parameters", "trend", "trends", "validate_path",
]
