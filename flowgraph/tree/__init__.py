"""The graph tree: dotted paths, freeze/thaw, safetensors checkpoints, observation and trends.

Labelled graphs nested inside graphs form a tree. This layer sits below the builder: ``Graph`` inherits
the ``GraphTree`` mixin, so ``g.freeze("encoder.scan")``, ``g.save_checkpoint(path)``, ``g.trend("loss")``
... are ordinary methods a reader and a type checker can see. The same functions work on any module as plain
functions too (``flowgraph.tree.freeze(g, "encoder")``).
"""

from __future__ import annotations

from . import checkpoint, observe, paths, trend
from .checkpoint import (
    LoadReport,
    MigrateReport,
    checkpoint_metadata,
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


class GraphTree:
    """The tree methods of every ``Graph`` (``Graph`` inherits this mixin; the tree sits below the builder).

    Each is the function of the same name in this package, bound to the graph: ``g.freeze("encoder.scan")``
    is ``flowgraph.tree.freeze(g, "encoder.scan")``. ``trend``/``trend_at`` take a metric of this graph or a
    dotted path.
    """

    validate_path = paths.validate_path
    freeze = paths.freeze
    thaw = paths.thaw
    is_frozen = paths.is_frozen
    trainable_parameters = paths.trainable_parameters
    parameters_at = paths.parameters_at
    named_parameters_at = paths.named_parameters_at
    set_training_at = paths.set_training_at
    subgraph_at = paths.subgraph_at
    save_checkpoint = checkpoint.save_checkpoint
    load_checkpoint = checkpoint.load_checkpoint
    load_subgraph_checkpoint = checkpoint.load_subgraph_checkpoint
    record = observe.record
    record_at = observe.record_at
    collect = observe.collect
    flush = observe.flush
    latest_metrics = observe.latest_metrics
    history = observe.history
    trend = observe.trend
    trend_at = observe.trend
    trends = observe.trends
    eta = observe.eta
    reset_metrics = observe.reset_metrics
    plot_html = observe.plot_html


__all__ = [
    "GraphTree", "LoadReport", "MigrateReport", "PathKind", "Trend", "TrendGroup", "checkpoint", "checkpoint_metadata",
    "collect",
    "eta", "flush", "freeze", "history", "is_frozen", "key_map_by_order", "latest_metrics",
    "load_checkpoint", "load_safetensors_weights", "load_subgraph_checkpoint", "migrate_checkpoint",
    "module_at", "named_parameters_at", "observe", "parameters_at", "paths", "plot_html", "read_checkpoint",
    "record", "record_at", "reset_metrics", "resolve", "save_checkpoint", "set_training_at", "subgraph_at",
    "thaw", "trainable_parameters", "trend", "trends", "validate_path",
]
