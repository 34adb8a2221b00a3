"""Graph nodes and the backward engine.

Each differentiable op that records produces one ``Node`` for its single output tensor. The node keeps
exactly what backward needs (Chainer's explicit retention): a closure over the saved values, the input
tensors that require grad, and ``(tensor, version)`` pairs for saved tensors so an in-place change
between forward and backward is an error rather than a silently wrong gradient.

The engine collects the nodes reachable from the roots with an explicit stack (no recursion: graphs of
tens of thousands of ops are fine) and runs them in decreasing creation order, which is a valid
topological order because an op can only consume tensors created before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..errors import AnomalyError, FlowError
from .grad_mode import STATE, enable_grad, no_grad

if TYPE_CHECKING:  # pragma: no cover
    from ..tensor.tensor import Tensor

_SEQ = itertools.count()


class Node:
    """A recorded op: ``backward(grad_of_output) -> tuple of input grads`` (``None`` where not needed)."""

    __slots__ = ("backward", "inputs", "name", "seq", "saved", "hooks", "retain", "__weakref__")

    def __init__(self, backward: Callable, inputs: tuple, name: str, saved: tuple = ()):
        self.backward = backward
        self.inputs = inputs
        self.name = name
        self.seq = next(_SEQ)
        self.saved = saved
        self.hooks: list | None = None
        self.retain: Any = None  # weakref to the output when retain_grad() was called

    def __repr__(self) -> str:
        return f"<{self.name}Backward #{self.seq}>"

    def next_functions(self) -> tuple:
        """The nodes feeding this one (``None`` for leaves), like PyTorch's ``grad_fn.next_functions``."""
        return tuple(None if t is None else t._grad_fn for t in self.inputs)


_by_seq = attrgetter("seq")


def _collect(roots: Sequence[Node]) -> list[Node]:
    seen: set[Node] = set(roots)
    order: list[Node] = list(seen)
    stack = list(order)
    push, pop, mark, keep = stack.append, stack.pop, seen.add, order.append
    while stack:
        for t in pop().inputs:
            if t is not None:
                fn = t._grad_fn
                if fn is not None and fn not in seen:
                    mark(fn)
                    keep(fn)
                    push(fn)
    order.sort(key=_by_seq, reverse=True)
    return order


#: How many hooks are registered on leaf tensors (``Tensor.register_hook``). While there are any, backward
#: finishes each hooked leaf (hooks, ``.grad``) right after the last node feeding it ran, not at the end:
#: ``DataParallel`` then starts a bucket's all-reduce while the rest of backward still runs.
LEAF_HOOKS = [0]


def _last_uses(order: list[Node]) -> dict[int, list[Tensor]]:
    """Position in ``order`` -> the hooked leaves whose gradient is complete once that node has run."""
    last: dict[int, tuple[int, Tensor]] = {}
    for pos, node in enumerate(order):
        for t in node.inputs:
            if t is not None and t._grad_fn is None and t._hooks:
                last[id(t)] = (pos, t)
    by_pos: dict[int, list[Tensor]] = {}
    for pos, t in last.values():
        by_pos.setdefault(pos, []).append(t)
    return by_pos


def _check_versions(node: Node) -> None:
    for t, version in node.saved:
        vc = t._vc
        if (0 if vc is None else vc[0]) != version:
            raise FlowError(
                f"a tensor saved by {node.name} for its backward was modified in place afterwards "
                f"(version {version} when saved, {t._version} now); use an out-of-place op "
                f"(e.g. x = x + y instead of x.add_(y)) or .clone() before modifying it"
            )


def _check_finite(value: Tensor, where: str) -> None:
    if value.dtype.is_floating_point and not bool(value.isfinite().all().item()):
        raise AnomalyError(f"{where} produced NaN or infinity (detect_anomaly is on)")


def _apply_hooks(hooks: list | None, grad: Tensor) -> Tensor:
    if hooks:
        for hook in hooks:
            result = hook(grad)
            if result is not None:
                grad = result
    return grad


def run_backward(
    roots: Sequence[Tensor],
    grads: Sequence[Tensor],
    retain_graph: bool = False,
    create_graph: bool = False,
    capture: Sequence[Tensor] | None = None,
    allow_unused: bool = True,
) -> list[Tensor | None] | None:
    """Propagate ``grads`` from ``roots`` back through the graph.

    Without ``capture`` the gradients of leaves that require grad accumulate into ``.grad``. With
    ``capture`` (``fg.autograd.grad``) nothing accumulates: the gradients of those tensors are returned.
    """
    pending: dict[Node, Tensor] = {}
    leaf_grads: dict[int, list] = {}
    capture_nodes: dict[Node, int] = {}
    capture_leaves: dict[int, int] = {}
    captured: list[Tensor | None] = []
    if capture is not None:
        captured = [None] * len(capture)
        for i, t in enumerate(capture):
            if t._grad_fn is not None:
                capture_nodes[t._grad_fn] = i
            else:
                capture_leaves[id(t)] = i

    from ..tensor.tensor import _wrap

    # Sums the engine made itself (array id -> array, which keeps the id from being reused): nobody else
    # holds them, so further contributions can be added in place where the backend offers ``add_into``
    # (a leaf used at every step of an unrolled loop gets one buffer, not one fresh array per step).
    owned: dict[int, Any] = {}

    def accumulate(prev: Tensor, g: Tensor) -> Tensor:
        # the common case runs on the arrays directly: same dtype, no graph to record for the sum
        pd, gd = prev._data, g._data
        if not create_graph and pd.dtype == gd.dtype and prev._backend is g._backend and pd.shape == gd.shape:
            bk = prev._backend
            if owned.get(id(pd)) is pd:
                total = bk.add_into(pd, gd)
                if total is pd:
                    return prev
                del owned[id(pd)]
            else:
                total = bk.add(pd, gd)
            if getattr(bk, "add_into", None) is not None:
                owned[id(total)] = total
            return _wrap(total, bk)
        return prev + g

    def route_leaf(t: Tensor, g: Tensor) -> None:
        entry = leaf_grads.get(id(t))
        if entry is None:
            leaf_grads[id(t)] = [t, g]
        else:
            entry[1] = accumulate(entry[1], g)

    def finish_leaf(t: Tensor, g: Tensor) -> None:
        g = _apply_hooks(t._hooks, g)
        if g.shape != t.shape:
            raise FlowError(f"internal: gradient of shape {g.shape} for a leaf of shape {t.shape}")
        if g._data.dtype != t._data.dtype:  # e.g. a float16 leaf used in a float32 op: grad in float16
            g = g.to(t.dtype)
        if capture is not None:
            i = capture_leaves.get(id(t))
            if i is not None:
                captured[i] = g
            return
        if not create_graph:
            g = g.detach()
        t.grad = g if t.grad is None else t.grad + g

    grad_ctx = enable_grad() if create_graph else no_grad()
    with grad_ctx:
        for t, g in zip(roots, grads):
            fn = t._grad_fn
            if fn is not None:
                prev = pending.get(fn)
                pending[fn] = g if prev is None else accumulate(prev, g)
            elif t.requires_grad:
                route_leaf(t, g)
        anomaly = STATE.anomaly
        pending_pop = pending.pop
        pending_get = pending.get
        order = _collect([t._grad_fn for t in roots if t._grad_fn is not None])
        early = _last_uses(order) if LEAF_HOOKS[0] and capture is None else None
        for pos, node in enumerate(order):
            if early and pos - 1 in early:
                for t in early.pop(pos - 1):
                    entry = leaf_grads.pop(id(t), None)
                    if entry is not None:
                        finish_leaf(*entry)
            g = pending_pop(node, None)
            if g is None:
                continue
            if owned:
                owned.pop(id(g._data), None)  # handed to the node's backward: no longer the engine's alone
            if node.hooks:
                g = _apply_hooks(node.hooks, g)
            if node.retain is not None:
                out = node.retain()
                if out is not None:
                    out.grad = g if out.grad is None else out.grad + g
            if capture_nodes and node in capture_nodes:
                captured[capture_nodes[node]] = g
            backward = node.backward
            if backward is None:
                raise FlowError(
                    f"backward through {node.name} a second time: its saved values were freed after the first "
                    "backward; pass retain_graph=True to the first backward() if you need to run it twice"
                )
            for t, version in node.saved:
                vc = t._vc
                if (0 if vc is None else vc[0]) != version:
                    _check_versions(node)  # raises, naming the op and both versions
            in_grads = backward(g)
            if not retain_graph:
                node.backward = None
                node.saved = ()
            for t, gi in zip(node.inputs, in_grads):
                if gi is None or t is None:
                    continue
                if anomaly:
                    _check_finite(gi, f"the backward of {node.name}")
                if gi._data.dtype != t._data.dtype:
                    # a gradient takes its tensor's dtype (float16 input of a promoting op: float16 gradient)
                    gi = gi.to(t.dtype)
                fn = t._grad_fn
                if fn is not None:
                    prev = pending_get(fn)
                    pending[fn] = gi if prev is None else accumulate(prev, gi)
                elif t.requires_grad:
                    route_leaf(t, gi)
        for t, g in leaf_grads.values():
            finish_leaf(t, g)
    if capture is not None:
        if not allow_unused:
            for i, g in enumerate(captured):
                if g is None:
                    raise FlowError(
                        f"input {i} of autograd.grad is not reachable from the outputs; "
                        "pass allow_unused=True to get None for it"
                    )
        return captured
    return None
