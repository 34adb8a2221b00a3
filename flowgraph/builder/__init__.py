"""The graph builder: ``FlowBuilder`` composes modules into a ``Graph`` (an ``nn.Module``).

    from flowgraph.builder import FlowBuilder, MergeOp

    model = (FlowBuilder.from_(encoder).tag("encoded")
             .split(head_a, head_b).merge(MergeOp.MEAN)
             .loop_body(refine).for_n(3)
             .gate(router, [expert_a, expert_b]).using("encoded")
             .through(head)
             .build())
"""

from .flow import BatchedMap, FlowBuilder, LoopBuilder, MapBuilder
from .graph import Graph
from .merge import MergeOp
from .nodes import LoopInfo

__all__ = ["BatchedMap", "FlowBuilder", "Graph", "LoopBuilder", "LoopInfo", "MapBuilder", "MergeOp"]
