"""The executable nodes of a built ``Graph``: one per builder verb, each running on tensors of one pass.

A node reads its input stream(s) from the pass's value table, resolves the tags it was given with
``.using()`` (same-pass values or the previous call's state), and returns its output tensor.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, ShapeError
from ..nn.containers import Sequential
from ..nn.module import Module
from ..nn.normalization import LayerNorm, layer_norm_residual
from ..tensor import Tensor, arange, cat, int64, stack, where, zeros
from .calls import Call
from .rows import unbind_rows

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph


@dataclass
class Ref:
    """A tag fed to a node: ``stream`` is set for a value of the same pass, else it is a forward reference."""

    tag: str
    stream: int | None
    call: Call


@dataclass
class LoopInfo:
    """What a loop's last forward did: body passes, per-row passes, whether ``max_iter`` stopped it."""

    iterations: int
    max_iter: int | None
    max_iter_hit: bool
    row_iterations: Tensor | None = None


@dataclass(eq=False)
class Node(ABC):
    """Base node: ``kind`` is the verb, ``inputs`` the stream ids read, ``output`` the stream id written."""

    kind: str
    call: Call
    inputs: list[int]
    output: int
    refs: dict[str, Ref] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    name: str = ""
    children: dict[str, Module] = field(default_factory=dict)  # child-module name -> module, set at naming

    # ------------------------------------------------------------------ description
    def roles(self) -> list[tuple[str, Module]]:
        """``(role suffix, module)`` pairs; the suffix is appended to the node's base name."""
        return []

    def ref_receiver(self) -> Any:
        """The module or callable that receives this node's refs as keyword arguments (None: takes none)."""
        return None

    def config(self) -> dict:
        """JSON-able settings that shape the computation (merge op, loop count...), for the structure hash."""
        return {}

    def main_module_name(self) -> str | None:
        """The child name ``graph.tags`` maps a tag on this node's output to (None: not one module)."""
        return None

    # ------------------------------------------------------------------ running
    @abstractmethod
    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        """Compute this node's output for the current pass."""


def call_with_refs(target: Any, x: Any, refs: dict[str, Tensor]) -> Any:
    """``target(x, **refs)``, or ``target(x)`` without refs."""
    return target(x, **refs) if refs else target(x)


class EntryNode(Node):
    """``FlowBuilder.from_(m)``: the entry module applied to the graph's first input."""

    def __init__(self, call: Call, module: Module, output: int):
        super().__init__("from", call, [0], output)
        self.module = module

    def roles(self) -> list[tuple[str, Module]]:
        return [("", self.module)]

    def ref_receiver(self) -> Any:
        return self.module

    def main_module_name(self) -> str | None:
        return self.name

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        return call_with_refs(self.module, x, graph._resolve_refs(self, x, values))


class ModuleNode(Node):
    """``.through(m)``, ``.fork(m)`` and one branch of ``.split(...)``: ``m(x, **refs)``."""

    def __init__(self, kind: str, call: Call, module: Module, source: int, output: int, role: str = ""):
        super().__init__(kind, call, [source], output)
        self.module = module
        self.role = role

    def roles(self) -> list[tuple[str, Module]]:
        return [(self.role, self.module)]

    def ref_receiver(self) -> Any:
        return self.module

    def main_module_name(self) -> str | None:
        return next(iter(self.children), None)

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        return call_with_refs(self.module, x, graph._resolve_refs(self, x, values))


def _wrapped(m: Module) -> bool:
    """Whether ``m``'s call does more than its class's ``forward``: hooks, or a ``forward`` of the instance's own
    (``Graph.checkpoint_activations`` recomputes a block that way)."""
    return bool(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__)


class AlsoNode(ModuleNode):
    """``.also(m)``: the residual ``x + m(x, **refs)``.

    A block that is an ``nn.Sequential`` ending in an ``nn.LayerNorm`` (a transformer-style residual block),
    with no hooks or checkpointing on either and no refs, runs its other modules and then the LayerNorm and
    the residual sum as one op (``nn.normalization.layer_norm_residual``: one kernel on CUDA and OpenCL, the
    sum written in place of the normalised values). Values and gradients are those of ``x + m(x)``.
    """

    def __init__(self, call: Call, module: Module, source: int, output: int):
        super().__init__("also", call, module, source, output)

    def _norm_tail(self) -> tuple[list[Module], LayerNorm] | None:
        """``(modules before the LayerNorm, the LayerNorm)`` when the block is that pattern, else None."""
        m = self.module
        if type(m) is not Sequential or self.refs or _wrapped(m):
            return None
        mods = list(m._modules.values())
        if not mods or type(mods[-1]) is not LayerNorm or _wrapped(mods[-1]):
            return None
        return mods[:-1], mods[-1]

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        tail = self._norm_tail()
        if tail is None or not isinstance(x, Tensor):
            return self.run_modules(graph, values)
        h = x
        for mod in tail[0]:
            h = mod(h)
        if isinstance(h, Tensor) and h.shape == x.shape:
            return layer_norm_residual(h, tail[1], x)
        return self._residual(x, tail[1](h))  # not the shape of x: the error names it

    def run_modules(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        """``x + m(x, **refs)`` through the block's own call (the ONNX exporter's walk: every module called)."""
        x = values[self.inputs[0]]
        return self._residual(x, call_with_refs(self.module, x, graph._resolve_refs(self, x, values)))

    def _residual(self, x: Tensor, y: Any) -> Tensor:
        """``x + y``, or the error naming a block that changed the shape."""
        if isinstance(y, Tensor) and y.shape != x.shape:
            raise ShapeError(
                f"{self.call.describe()}: the residual x + m(x) needs m to keep the shape, but "
                f"{type(self.module).__name__} maps {tuple(x.shape)} to {tuple(y.shape)}; "
                "use .through(m) instead"
            )
        return x + y


class MergeNode(Node):
    """``.merge(op)``: combine the open branch streams."""

    def __init__(self, call: Call, op: Any, inputs: list[int], output: int):
        super().__init__("merge", call, inputs, output)
        self.op = op

    def ref_receiver(self) -> Any:
        from .merge import MergeOp

        return None if isinstance(self.op, MergeOp) else self.op

    def roles(self) -> list[tuple[str, Module]]:
        return [("", self.op)] if isinstance(self.op, Module) else []

    def config(self) -> dict:
        from .merge import MergeOp

        if isinstance(self.op, MergeOp):
            return {"op": self.op.name}
        return {"op": getattr(self.op, "__name__", type(self.op).__name__)}

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        xs = [values[s] for s in self.inputs]
        refs = graph._resolve_refs(self, xs[0], values)
        try:
            return call_with_refs(self.op, xs, refs)
        except ShapeError as exc:
            shapes = [tuple(x.shape) for x in xs]
            raise ShapeError(
                f"{self.call.describe()}: cannot merge branch outputs of shapes {shapes}: {exc}"
            ) from exc


def _halt_mask(c: Any, batch: int, call: Call) -> Tensor:
    """A condition's output as a bool row mask ``(B,)`` (one value per row or for the batch; > 0 halts)."""
    if not isinstance(c, Tensor):
        raise FlowError(
            f"{call.describe()}: the loop condition returned {type(c).__name__}; it must return a Tensor"
        )
    if c.ndim == 0:
        flat = c.reshape(1)
    else:
        flat = c.reshape(c.shape[0], -1)
        if flat.shape[1] != 1:
            raise ShapeError(
                f"{call.describe()}: the loop condition returned shape {tuple(c.shape)}; it must return one "
                f"value per row, shape ({batch},) or ({batch}, 1), or one for the batch, shape ()"
            )
        flat = flat.reshape(-1)
        if flat.shape[0] not in (1, batch):
            raise ShapeError(
                f"{call.describe()}: the loop condition returned {flat.shape[0]} values for a batch of "
                f"{batch} rows"
            )
    halt = flat.detach() > 0
    return halt.expand(batch) if halt.shape[0] != batch else halt


def _row_view(mask: Tensor, like: Tensor) -> Tensor:
    """Reshape a ``(B,)`` mask to broadcast over ``like`` (``(B, 1, 1, ...)``)."""
    return mask.reshape((mask.shape[0],) + (1,) * (like.ndim - 1))


class LoopNode(Node):
    """``.loop_body(b).for_n(n) / .while_cond(c, max_iter) / .until_cond(c, max_iter)``.

    Halting is per row with masks: a stopped row keeps its state (``where``); the body still runs on the
    whole batch while any row is active, and the only host synchronisation is one count per pass.
    """

    def __init__(self, call: Call, body: Module, mode: str, count: int | None, cond: Module | None,
                 max_iter: int | None, source: int, output: int):
        super().__init__("loop", call, [source], output)
        self.body, self.mode, self.count, self.cond, self.max_iter = body, mode, count, cond, max_iter

    def roles(self) -> list[tuple[str, Module]]:
        roles = [("", self.body)]
        if self.cond is not None:
            roles.append(("_cond", self.cond))
        return roles

    def ref_receiver(self) -> Any:
        return self.body

    def main_module_name(self) -> str | None:
        return next(iter(self.children), None)

    def config(self) -> dict:
        return {"mode": self.mode, "n": self.count, "max_iter": self.max_iter}

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        state = values[self.inputs[0]]
        refs = graph._resolve_refs(self, state, values)
        if self.mode == "for_n":
            for _ in range(self.count):
                state = call_with_refs(self.body, state, refs)
            graph._loop_info[self.name] = LoopInfo(self.count, None, False)
            return state
        batch = state.shape[0] if state.ndim else 1
        active = None  # None: every row active
        n_active = batch
        rows = zeros(batch, dtype=int64, device=state.device)
        passes = 0
        hit = False
        for _ in range(self.max_iter):
            if self.mode == "while":
                active, n_active = self._test(state, active, batch)
                if n_active == 0:
                    break
            new = call_with_refs(self.body, state, refs)
            state = self._blend(new, state, active, n_active, batch)
            rows = rows + (1 if active is None else active.to(int64))
            passes += 1
            if self.mode == "until":
                active, n_active = self._test(state, active, batch)
                if n_active == 0:
                    break
        else:
            if self.mode == "while":  # would a pass after the last one still run?
                _, n_left = self._test(state, active, batch)
                hit = n_left > 0
            else:
                hit = n_active > 0
        graph._loop_info[self.name] = LoopInfo(passes, self.max_iter, hit, rows)
        return state

    def _test(self, state: Tensor, active: Tensor | None, batch: int) -> tuple[Tensor, int]:
        with no_grad():
            halt = _halt_mask(self.cond(state), batch, self.call)
            keep = ~halt if active is None else active & ~halt
            return keep, int(keep.sum().item())

    def _blend(self, new: Any, state: Tensor, active: Tensor | None, n_active: int, batch: int) -> Tensor:
        if active is None or n_active == batch:
            return new
        if not isinstance(new, Tensor) or new.shape != state.shape:
            shape = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
            raise ShapeError(
                f"{self.call.describe()}: with a halting condition the body must keep the state's shape "
                f"{tuple(state.shape)} (stopped rows keep their state), but it returned {shape}"
            )
        return where(_row_view(active, state), new, state)


class GateNode(Node):
    """``.gate(router, experts)``: every expert runs; outputs weighted by the router's last dim and summed."""

    def __init__(self, call: Call, router: Module, experts: list[Module], source: int, output: int):
        super().__init__("gate", call, [source], output)
        self.router, self.experts = router, experts

    def roles(self) -> list[tuple[str, Module]]:
        return [("_router", self.router)] + [(f"_expert_{i}", e) for i, e in enumerate(self.experts)]

    def ref_receiver(self) -> Any:
        return self.router

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        weights = call_with_refs(self.router, x, graph._resolve_refs(self, x, values))
        n = len(self.experts)
        if not isinstance(weights, Tensor) or weights.ndim == 0 or weights.shape[-1] != n:
            shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ShapeError(
                f"{self.call.describe()}: the router returned {shape}; it must return one weight per expert "
                f"along the last dim (..., {n})"
            )
        outs = [e(x) for e in self.experts]
        try:
            stacked = stack(outs, -1)  # (..., D, n)
        except ShapeError as exc:
            raise ShapeError(
                f"{self.call.describe()}: experts returned different shapes {[tuple(o.shape) for o in outs]}"
            ) from exc
        w = weights.reshape(tuple(weights.shape[:-1]) + (1,) * (stacked.ndim - weights.ndim) + (n,))
        return (stacked * w).sum(-1)


class SwitchNode(Node):
    """``.switch(selector, branches)``: hard routing, one branch per row (or one for the whole batch).

    Per-row routing groups rows by branch with device ops (a one-hot cumulative count gives each row its
    place), runs each branch once on its rows (``index_select``) and puts the results back in row order;
    the only host synchronisation is one read of the per-branch counts.
    """

    def __init__(self, call: Call, selector: Module, branches: list[Module], source: int, output: int):
        super().__init__("switch", call, [source], output)
        self.selector, self.branches = selector, branches

    def roles(self) -> list[tuple[str, Module]]:
        return [("_selector", self.selector)] + [(f"_branch_{i}", b) for i, b in enumerate(self.branches)]

    def ref_receiver(self) -> Any:
        return self.selector

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        with no_grad():
            idx = call_with_refs(self.selector, x, graph._resolve_refs(self, x, values))
        n = len(self.branches)
        batch = x.shape[0] if x.ndim else 1
        if not isinstance(idx, Tensor):
            raise FlowError(
                f"{self.call.describe()}: the selector returned {type(idx).__name__}; expected a Tensor"
            )
        if idx.dtype.is_floating_point:
            idx = idx.floor()
        flat = idx.reshape(-1)
        if idx.ndim == 0 or (flat.shape[0] == 1 and batch != 1):
            return self._whole(x, int(flat.item()))
        if idx.ndim > 2 or flat.shape[0] != batch:
            raise ShapeError(
                f"{self.call.describe()}: the selector returned shape {tuple(idx.shape)}; it must return one "
                f"index for the batch, shape (), or one per row, shape ({batch},)"
            )
        flat = flat.to(int64)
        onehot = (flat.reshape(batch, 1) == arange(n, device=x.device).reshape(1, n)).to(int64)  # (B, n)
        counts = onehot.sum(0).tolist()
        if sum(counts) != batch:
            raise FlowError(
                f"{self.call.describe()}: the selector returned an index outside 0..{n - 1} for some rows"
            )
        used = [b for b in range(n) if counts[b]]
        if len(used) == 1:
            return self.branches[used[0]](x)
        offsets = [0]
        for c in counts[:-1]:
            offsets.append(offsets[-1] + c)
        # Row r goes to sorted position offset[branch] + (rank of r among its branch's rows).
        rank = (onehot.cumsum(0) * onehot).sum(1) - 1
        dest = rank + (onehot * _int_tensor(offsets, x)).sum(1)
        order = zeros(batch, dtype=int64, device=x.device).scatter(0, dest, arange(batch, device=x.device))
        outs = []
        for b in used:
            rows = order[offsets[b]:offsets[b] + counts[b]]
            outs.append(self.branches[b](x.index_select(0, rows)))
        try:
            merged = cat(outs, 0)
        except ShapeError as exc:
            raise ShapeError(
                f"{self.call.describe()}: branches returned incompatible shapes "
                f"{[tuple(o.shape) for o in outs]}"
            ) from exc
        return merged.index_select(0, dest)

    def _whole(self, x: Tensor, i: int) -> Tensor:
        if not 0 <= i < len(self.branches):
            raise FlowError(
                f"{self.call.describe()}: the selector chose branch {i}, but there are {len(self.branches)} "
                f"(0..{len(self.branches) - 1})"
            )
        return self.branches[i](x)


def _int_tensor(values: list[int], like: Tensor) -> Tensor:
    """An int64 tensor on ``like``'s device."""
    from ..tensor import tensor

    return tensor(values, dtype=int64, device=like.device)


class MapNode(Node):
    """``.map(body).each() / .batched() / .over(tag) / .slices(n)``."""

    def __init__(self, call: Call, body: Module, mode: str, batched: bool, source: int, output: int,
                 slices: int | None = None, over: str | None = None):
        super().__init__("map", call, [source], output)
        self.body, self.mode, self.batched, self.slices, self.over = body, mode, batched, slices, over

    def roles(self) -> list[tuple[str, Module]]:
        return [("", self.body)]

    def main_module_name(self) -> str | None:
        return next(iter(self.children), None)

    def config(self) -> dict:
        return {"mode": self.mode, "batched": self.batched, "slices": self.slices, "over": self.over}

    def run(self, graph: Graph, values: dict[int, Tensor]) -> Tensor:
        x = values[self.inputs[0]]
        if self.mode == "slices":
            return self._slices(x)
        if self.batched:
            return self.body(x)
        if x.ndim == 0:
            raise ShapeError(f"{self.call.describe()}: cannot map over the rows of a 0-d tensor")
        if x.shape[0] == 0:
            return x
        return cat([self.body(row) for row in unbind_rows(x)], 0)

    def _slices(self, x: Tensor) -> Tensor:
        n = self.slices
        if x.ndim == 0 or x.shape[-1] % n:
            raise ShapeError(
                f"{self.call.describe()}: the last dim of shape {tuple(x.shape)} does not split into {n} "
                "equal slices"
            )
        width = x.shape[-1] // n
        lead = tuple(x.shape[:-1])
        if self.batched:
            y = self.body(x.reshape(-1, width))
            return y.reshape(lead + (n * y.shape[-1],))
        return cat([self.body(x[..., k * width:(k + 1) * width]) for k in range(n)], -1)


def accepts_keyword(target: Any, name: str) -> bool:
    """Whether ``target(x, **{name: v})`` is accepted (a Graph: one of its ``.input()`` names)."""
    from .graph import Graph

    if isinstance(target, Graph):
        return name in target.input_names
    fn = target.forward if isinstance(target, Module) else target
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: cannot tell, let the call decide
        return True
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = positional[0] if positional else None
    for p in params:
        if p.kind == p.VAR_KEYWORD:
            return True
        if p.name == name and p is not first and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return True
    return False
