"""``Graph``: the ``nn.Module`` that ``FlowBuilder.build()`` returns.

Each node's module is a child module under a stable name (its tag, its label for a labelled graph, else
``<verb>_<k>``), so ``named_parameters()`` and ``state_dict()`` keys do not depend on build order or counters
of other verbs. Forward references (``.using(tag)`` before ``.tag(tag)``) carry the previous call's value.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from ..backends import get_backend
from ..errors import FlowError, ShapeError
from ..nn.module import Module
from ..tensor import Tensor, zeros_like
from ..tree import GraphTree
from .calls import did_you_mean
from .nodes import LoopInfo, Node


class Graph(GraphTree, Module):
    """A built flow: call it like the entry module, ``graph(x)``, plus any ``.input()`` names.

    ``graph(x, a, b)`` or ``graph(x, a=..., b=...)`` for ``.input("a", "b")``. Attributes:

    - ``label``: the name given with ``.label()`` (None without one);
    - ``tags``: tag name -> child-module name that produced it (None when not one module's output);
    - ``tag_values``: every tagged tensor of the last forward (but those of parts checkpointed with
      ``keep_tag_values=False``);
    - ``input_names``: the names declared with ``.input()``, in order.
    """

    def __init__(self, nodes: list[Node], input_names: list[str], output: int, tag_streams: dict[str, int],
                 tag_inits: dict[str, Any], forward_tags: set[str], label: str | None,
                 tags: dict[str, str | None]):
        super().__init__()
        self._nodes = nodes
        self.input_names = list(input_names)
        self._output = output
        self._tag_streams = dict(tag_streams)
        self._stream_tags: dict[int, list[str]] = {}
        for tag, stream in tag_streams.items():
            self._stream_tags.setdefault(stream, []).append(tag)
        self._tag_inits = dict(tag_inits)
        self._forward_tags = set(forward_tags)
        self.label = label
        self.tags = dict(tags)
        self.tag_values: dict[str, Tensor] = {}
        # tags left out of tag_values: checkpointed parts' (checkpoint_activations(..., keep_tag_values=False))
        self._unkept_tags: set[str] = set()
        self._state: dict[str, Tensor] = {}
        self._loop_info: dict[str, LoopInfo] = {}
        self._profiling = False
        self._profile: dict[str, float] = {}
        self._dry_run = False
        for node in nodes:
            for child, module in node.children.items():
                if child not in self._modules:
                    self.add_module(child, module)

    # ------------------------------------------------------------------ calling
    def forward(self, *inputs: Any, **named: Any) -> Any:
        """Run the flow on ``x`` (and the ``.input()`` values, positional or by name)."""
        values = self._bind_inputs(inputs, named)
        for stream in range(len(self.input_names) + 1):
            self._store_tags(stream, values[stream])
        profiling = self._profiling
        if profiling:
            self._profile = {}
            backend = get_backend(_device_of(inputs, named))
        for node in self._nodes:
            if profiling:
                backend.synchronize()
                start = time.perf_counter()
            if self._dry_run:
                out = self._dry_node(node, values)
            else:
                out = node.run(self, values)
            if profiling:
                backend.synchronize()
                self._profile[node.name] = self._profile.get(node.name, 0.0) + time.perf_counter() - start
            values[node.output] = out
            self._store_tags(node.output, out)
        return values[self._output]

    def _bind_inputs(self, inputs: tuple, named: dict) -> dict[int, Any]:
        names = self.input_names
        expected = 1 + len(names)
        if len(inputs) == expected and not named:  # the common call: every input by position (no messages built)
            return dict(enumerate(inputs))
        where = f"graph {self.label!r}" if self.label else "this graph"
        signature = ", ".join(["x"] + names)
        if not inputs:
            raise FlowError(f"{where} takes its main input x as the first positional argument: "
                            f"graph({signature})")
        if len(inputs) > expected:
            raise FlowError(
                f"{where} takes {expected} input(s) ({signature}) but got {len(inputs)} positional ones; "
                + ("declare more with .input(name)" if not names else f"call graph({signature})")
            )
        values: dict[int, Any] = {i: v for i, v in enumerate(inputs)}
        for key, value in named.items():
            if key not in names:
                raise FlowError(
                    f"{where} has no input {key!r}{did_you_mean(key, names) if names else ''}; "
                    f"it takes graph({signature})"
                )
            pos = names.index(key) + 1
            if pos in values:
                raise FlowError(f"{where}: input {key!r} given both by position and by name")
            values[pos] = value
        missing = [names[i - 1] for i in range(1, expected) if i not in values]
        if missing:
            raise FlowError(f"{where} is missing input(s) {missing}; call graph({signature})")
        return values

    def _store_tags(self, stream: int, value: Any) -> None:
        tags = self._stream_tags.get(stream)
        if tags:
            for tag in tags:
                if tag not in self._unkept_tags:
                    self.tag_values[tag] = value
                if tag in self._forward_tags:
                    self._state[tag] = value

    def _resolve_refs(self, node: Node, x: Any, values: dict[int, Any]) -> dict[str, Any]:
        """The keyword arguments for ``node``'s ref receiver (forward refs from the previous call)."""
        if not node.refs:
            return {}
        out = {}
        for tag, ref in node.refs.items():
            if ref.stream is not None:
                out[tag] = values[ref.stream]
            elif tag in self._state:
                value = self._state[tag]
                if (isinstance(value, Tensor) and isinstance(x, Tensor) and value.ndim and x.ndim
                        and value.shape[0] != x.shape[0]):
                    raise FlowError(
                        f"{ref.call.describe()}: the forward ref {tag!r} carries the previous call's value of "
                        f"shape {tuple(value.shape)}, but this call's input has {x.shape[0]} rows; call "
                        "graph.reset_state() when the batch size changes"
                    )
                out[tag] = value
            else:
                init = self._tag_inits.get(tag)
                if init is None:
                    out[tag] = zeros_like(x)
                elif isinstance(init, Tensor):
                    out[tag] = init
                else:
                    out[tag] = init(x)
        return out

    def _dry_node(self, node: Node, values: dict[int, Any]) -> Any:
        try:
            return node.run(self, values)
        except (FlowError, ValueError, TypeError, IndexError) as exc:
            shapes = [tuple(values[s].shape) if isinstance(values.get(s), Tensor) else None
                      for s in node.inputs]
            detail = str(exc)
            prefix = f"{node.call.describe()}: "
            if detail.startswith(prefix):
                detail = detail[len(prefix):]
            raise ShapeError(
                f"build(sample=...): {node.call.describe()} (node {node.name!r}) failed on input shape(s) "
                f"{', '.join(str(s) for s in shapes)}: {detail}"
            ) from exc

    def dry_run(self, *inputs: Any, **named: Any) -> Any:
        """Run once without gradients in eval mode to check shapes; state, tag values, modes restored."""
        from ..autograd.grad_mode import no_grad

        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        self._dry_run = True
        try:
            with no_grad():
                return self(*inputs, **named)
        finally:
            self._dry_run = False
            for m, mode in modes:
                object.__setattr__(m, "training", mode)
            self.reset_state()
            self.tag_values.clear()
            self._loop_info.clear()

    # ------------------------------------------------------------------ state across calls
    def reset_state(self) -> None:
        """Forget forward-reference values (the next call sees zeros or the tag's ``init``), all levels."""
        for m in self.modules():
            if isinstance(m, Graph):
                m._state.clear()

    def detach_state(self) -> None:
        """Cut gradients across calls: keep forward-reference values but detach them, here and below."""
        for m in self.modules():
            if isinstance(m, Graph):
                m._state = {k: (v.detach() if isinstance(v, Tensor) else v) for k, v in m._state.items()}

    def to(self, *args: Any, **kwargs: Any) -> Graph:
        """Move parameters, buffers and carried forward-reference state (see ``nn.Module.to``)."""
        super().to(*args, **kwargs)
        for m in self.modules():
            if isinstance(m, Graph):
                m._state = {k: (v.to(*args, **kwargs) if isinstance(v, Tensor) else v)
                            for k, v in m._state.items()}
                m._tag_inits = {k: (v.to(*args, **kwargs) if isinstance(v, Tensor) else v)
                                for k, v in m._tag_inits.items()}
        return self

    # ------------------------------------------------------------------ memory
    def checkpoint_activations(self, path: str, enabled: bool = True, *, keep_tag_values: bool = True) -> None:
        """Keep only the inputs of the subtree at ``path`` in forward and recompute it in backward (less memory,
        about one more forward of that subtree per step); ``enabled=False`` turns it off.

        ``path`` names a labelled subgraph (``"encoder"``, ``"encoder.scan"``) or a tag on one module's output.
        Gradients are those of the plain run: the recompute restores the random generators (same dropout
        masks) and leaves running statistics and stored tag values as the forward left them. Checkpoint
        several consecutive parts rather than one big one: backward recomputes a part whole, so the peak
        memory is the kept inputs plus the largest part's activations. Nothing changes under ``fg.no_grad()``.

        ``keep_tag_values=False`` also leaves the part's tag values out of ``tag_values`` (the tag ``path``
        names, and every tag inside the part): the graph's record of the last forward would otherwise hold
        each of them until the next forward, through the whole backward, when the checkpoint has already let
        them go (per-block checkpointing of a residual tower: every block's output). ``enabled=False`` records
        them again.
        """
        from .activations import checkpoint_activations

        checkpoint_activations(self, path, enabled, keep_tag_values=keep_tag_values)

    # ------------------------------------------------------------------ loops
    def loop_info(self) -> dict[str, LoopInfo]:
        """Per loop node (by name), what its last forward did: passes, per-row passes, ``max_iter_hit``."""
        return dict(self._loop_info)

    def max_iter_hit(self, name: str | None = None) -> bool:
        """Whether a loop (``name``, or any loop) was stopped by ``max_iter`` in the last forward."""
        if name is None:
            return any(info.max_iter_hit for info in self._loop_info.values())
        if name not in self._loop_info:
            loops = [n.name for n in self._nodes if n.kind == "loop"]
            raise FlowError(f"max_iter_hit({name!r}): no loop of that name ran; loops: {loops}")
        return self._loop_info[name].max_iter_hit

    # ------------------------------------------------------------------ structure
    def nodes(self) -> list[Node]:
        """The executable nodes in execution order."""
        return list(self._nodes)

    def subgraphs(self) -> dict[str, Graph]:
        """The direct labelled child graphs, by label, in registration order."""
        return {name: m for name, m in self._modules.items() if isinstance(m, Graph) and m.label == name}

    def structure(self) -> list[dict]:
        """A JSON-able description of the nodes in execution order (verbs, names, module classes, shapes)."""
        out = []
        for node in self._nodes:
            modules = []
            for child, module in node.children.items():
                entry = {
                    "name": child,
                    "class": type(module).__name__,
                    "params": [[n, list(p.shape)] for n, p in module.named_parameters()],
                }
                if isinstance(module, Graph):
                    entry["label"] = module.label
                    entry["structure"] = module.structure()
                modules.append(entry)
            out.append({
                "verb": node.kind,
                "name": node.name,
                "module": modules[0]["class"] if modules else None,
                "params": [[f"{m['name']}.{n}", s] for m in modules for n, s in m["params"]],
                "tag": node.tags[0] if node.tags else None,
                "tags": list(node.tags),
                "refs": sorted([tag, ref.stream is None] for tag, ref in node.refs.items()),
                "modules": modules,
                "config": node.config(),
            })
        return out

    def structural_hash(self) -> str:
        """sha256 (hex) of ``structure()`` plus the inputs and label; equal for graphs built the same way."""
        doc = {"label": self.label, "inputs": self.input_names, "nodes": self.structure()}
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------ visualisation and profiling
    def dot(self, profile: bool = False) -> str:
        """The graph as Graphviz DOT text (labelled subgraphs drawn as clusters).

        Every node has an ``id`` (``"fg:" + its path``, the SVG element's id) and a tooltip with its path,
        modules, parameter count and frozen state; ``profile=True`` adds the last profiled forward's time
        per node as heat colours (see ``enable_profiling``)."""
        from .visual import to_dot

        if profile and not self._profile:
            raise FlowError("dot(profile=True): no profile yet; call graph.enable_profiling() and run a "
                            "forward first")
        return to_dot(self, profile=self._profile if profile else None)

    def node_details(self, profile: bool = False) -> list[dict]:
        """One dict per node of ``dot()``: ``id``, ``path``, ``kind``, ``name``, ``modules``, ``parameters``,
        ``trainable``, ``frozen`` and, with ``profile=True`` and a profile, ``seconds`` and ``share``."""
        from .visual import node_details

        return node_details(self, self._profile if profile and self._profile else None)

    def svg(self, path: str | None = None) -> str:
        """The graph as SVG text (needs Graphviz's ``dot`` program); also written to ``path`` when given."""
        from .visual import render_svg

        return render_svg(self.dot(), path)

    def enable_profiling(self, enabled: bool = True) -> Graph:
        """Time every node of each forward (synchronising the device before and after each node), in this
        graph and the graphs inside it (their nodes are drawn, and heat-coloured, inside its picture)."""
        for m in self.modules():
            if isinstance(m, Graph):
                m._profiling = bool(enabled)
        return self

    def disable_profiling(self) -> Graph:
        """Stop timing nodes."""
        return self.enable_profiling(False)

    def profile(self) -> dict[str, float]:
        """Seconds per node name in the last profiled forward (empty before one)."""
        return dict(self._profile)

    def svg_with_profile(self, path: str | None = None) -> str:
        """SVG with each node coloured by its share of the last profiled forward's time (white to red)."""
        from .visual import render_svg, to_dot

        if not self._profile:
            raise FlowError("svg_with_profile(): no profile yet; call graph.enable_profiling() and run "
                            "a forward first")
        return render_svg(to_dot(self, profile=self._profile), path)

    def extra_repr(self) -> str:
        return f"label={self.label!r}" if self.label else ""


def _device_of(inputs: tuple, named: dict) -> str:
    for v in list(inputs) + list(named.values()):
        if isinstance(v, Tensor):
            return v.device
    return "cpu"
