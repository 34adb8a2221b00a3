"""Graph nodes and the backward engine.

Every recorded op produces one ``Node``. A node holds its *edges*, recorded when the op runs: for each
input, the node that produced it (and which of that node's outputs it was) or, for a leaf that requires
grad, the leaf's ``AccumulateGrad`` node. Because edges are fixed at op time, an in-place op that later
gives a tensor a new ``grad_fn`` cannot change what an earlier op's gradient flows to (PyTorch's rule).

A node's ``backward`` reads only what the op saved: ``saved`` holds the tensors and ``versions`` their
version counters when saved, checked before the backward runs, and the tensors are passed to it as
arguments, so an in-place change between forward and backward is an error, never a silently wrong
gradient.

The engine (``run_backward``) works in four parts a reader can hold one at a time:

1. ``_collect``: walk the edges from the roots, counting for each leaf's ``AccumulateGrad`` how many edges
   point at it;
2. ``_prune``: for ``autograd.grad``, keep only the nodes on a path to a requested input;
3. the schedule: decreasing sequence number, a real topological order because edges are fixed when an op
   runs (a node's producers are always older than it), whatever in-place ops did later; a leaf runs the
   moment its last consumer has run, so its hooks (``DataParallel``'s all-reduce) fire while the rest of
   backward runs;
4. gradient buffers (``_Buffers``): contributions to one output are summed, in place where the engine
   owns the sum.
"""

from __future__ import annotations

import itertools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AnomalyError, FlowError
from .grad_mode import STATE, enable_grad, no_grad

if TYPE_CHECKING:  # pragma: no cover
    from ..tensor.tensor import Tensor

_SEQ = itertools.count()

#: An edge: the node a gradient flows to, and which of that node's outputs it is the gradient of.
Edge = tuple  # (Node, int)


def next_seq() -> int:
    """A sequence number: every node recorded after this call has a larger one."""
    return next(_SEQ)


class Node:
    """A recorded op: ``backward(grad, *saved) -> tuple of input grads`` (``None`` where not needed).

    ``edges[i]`` is where the gradient of input ``i`` goes: the producing node itself for its first output (the
    common case, no tuple to allocate), ``(node, i)`` for another output, ``None`` for inputs that need none.
    ``saved`` are the tensors backward reads and ``versions`` their version counters when saved. ``dtypes``
    is the dtype of the op's output (a tuple, one per output, when ``n_out`` > 1): an incoming gradient is
    cast to it. Ops with several outputs (``fg.autograd.Function``) get a tuple of grads in backward.
    """

    __slots__ = ("backward", "edges", "name", "seq", "saved", "versions", "hooks", "retain", "dtypes", "n_out",
                 "__weakref__")

    def __init__(self, backward: Callable | None, edges: tuple, name: str, saved: tuple = (), versions: tuple = (),
                 dtypes=None, n_out: int = 1):
        self.backward = backward
        self.edges = edges
        self.name = name
        self.seq = next(_SEQ)
        self.saved = saved
        self.versions = versions
        self.hooks: dict | None = None  # output index -> hooks run on that output's gradient
        self.retain: dict | None = None  # output index -> weakref of a tensor whose .grad is kept
        self.dtypes = dtypes
        self.n_out = n_out

    def __repr__(self) -> str:
        return f"<{self.name}Backward #{self.seq}>"

    @property
    def next_functions(self) -> tuple:
        """``((node, output_index) or (None, 0), ...)`` per input, like PyTorch's ``grad_fn.next_functions``."""
        return tuple((None, 0) if e is None else e if type(e) is tuple else (e, 0) for e in self.edges)

    def register_hook(self, hook: Callable, index: int = 0) -> None:
        """Run ``hook(grad)`` on the gradient of output ``index`` before this node's backward."""
        if self.hooks is None:
            self.hooks = {}
        self.hooks.setdefault(index, []).append(hook)


class AccumulateGrad(Node):
    """The node of a leaf that requires grad: runs the leaf's hooks and adds the gradient to ``.grad``.

    It holds the leaf weakly (the leaf holds its node): a leaf nobody can see any more gets no gradient.
    """

    __slots__ = ("variable",)

    def __init__(self, leaf: Tensor):
        super().__init__(None, (), "AccumulateGrad", dtypes=leaf._data.dtype)
        self.variable = weakref.ref(leaf)


# ---------------------------------------------------------------------- 1. collect
def _collect(roots: Sequence[Node]) -> dict[Node, int]:
    """Every node reachable from ``roots`` -> for a leaf's ``AccumulateGrad``, how many edges from reachable
    nodes point at it (it runs when they have all run); other nodes map to 1 (the schedule needs no count)."""
    deps: dict[Node, int] = dict.fromkeys(roots, 0)
    stack = list(deps)
    pop, push = stack.pop, stack.append
    get = deps.get
    while stack:
        for e in pop().edges:
            if e is not None:
                m = e[0] if type(e) is tuple else e
                n = get(m)
                if n is None:
                    deps[m] = 1
                    push(m)
                elif type(m) is AccumulateGrad:
                    deps[m] = n + 1
    return deps


# ---------------------------------------------------------------------- 2. prune (autograd.grad)
def _prune(deps: dict[Node, int], targets: set[Node]) -> tuple[dict[Node, int], set[Node]]:
    """Keep the nodes that lie on a path to a target; return their dependency counts and the nodes whose
    backward must run (those with a target below them)."""
    parents: dict[Node, list[Node]] = {}
    for n in deps:
        for e in n.edges:
            if e is not None:
                parents.setdefault(e[0] if type(e) is tuple else e, []).append(n)
    run: set[Node] = set()
    stack = [t for t in targets if t in deps]
    while stack:
        for p in parents.get(stack.pop(), ()):
            if p not in run:
                run.add(p)
                stack.append(p)
    keep = run | (targets & deps.keys())
    pruned = dict.fromkeys(keep, 0)
    for n in run:
        for e in n.edges:
            if e is not None:
                m = e[0] if type(e) is tuple else e
                if m in keep:
                    pruned[m] += 1
    return pruned, run


# ---------------------------------------------------------------------- 4. gradient buffers
class _Buffers:
    """Per-node gradient sums. A sum the engine made itself is added to in place where the backend can
    (``Backend.add_into``): a leaf used at every step of an unrolled loop gets one buffer, not one per step."""

    __slots__ = ("grads", "owned", "create_graph")

    def __init__(self, create_graph: bool):
        self.grads: dict[Node, Any] = {}
        self.owned: dict[int, Any] = {}  # array id -> array (keeps the id from being reused)
        self.create_graph = create_graph

    def add(self, node: Node, index: int, g: Tensor) -> None:
        want = node.dtypes if node.n_out == 1 else node.dtypes[index]
        if want is not None and g._data.dtype != want:  # a gradient takes its tensor's dtype
            g = g.to(_tensor_api().from_numpy_dtype(want))
        grads = self.grads
        if node.n_out == 1:
            prev = grads.get(node)
            grads[node] = g if prev is None else self.sum(prev, g)
        else:
            slot = grads.get(node)
            if slot is None:
                slot = grads[node] = [None] * node.n_out
            prev = slot[index]
            slot[index] = g if prev is None else self.sum(prev, g)

    def take(self, node: Node):
        g = self.grads.pop(node, None)
        if self.owned and g is not None:
            for t in (g if type(g) is list else (g,)):
                if t is not None:
                    self.owned.pop(id(t._data), None)  # handed on: no longer the engine's alone
        return g

    def add_deferred(self, node: Node, g: DeferredGrad) -> Tensor | None:
        """Add the deferred gradient ``g`` into ``node``'s running sum in place where the engine owns that sum
        (None: done); otherwise return it computed, for the caller to add as usual."""
        prev = self.grads.get(node)
        if prev is not None and not self.create_graph:
            pd = prev._data
            if (self.owned.get(id(pd)) is pd and pd.dtype == g.dtype and prev._backend is g.backend
                    and tuple(pd.shape) == g.shape):
                total = g.accumulate(pd)
                if total is not pd:
                    del self.owned[id(pd)]
                    self.owned[id(total)] = total
                    self.grads[node] = _tensor_api().wrap(total, g.backend)
                return None
        return g.tensor()

    def sum(self, prev: Tensor, g: Tensor) -> Tensor:
        pd, gd = prev._data, g._data
        if self.create_graph or pd.dtype != gd.dtype or prev._backend is not g._backend or pd.shape != gd.shape:
            return prev + g
        bk = prev._backend
        owned = self.owned
        if owned.get(id(pd)) is pd:
            total = bk.add_into(pd, gd)
            if total is pd:
                return prev
            del owned[id(pd)]
        else:
            total = bk.add(pd, gd)
        owned[id(total)] = total
        return _tensor_api().wrap(total, bk)


class _TensorAPI:
    """The two tensor-layer functions the engine calls, imported on first use (tensor imports autograd)."""

    def __init__(self) -> None:
        from ..tensor.dtype import from_numpy_dtype
        from ..tensor.tensor import _wrap, gradient_edge

        self.wrap, self.gradient_edge, self.from_numpy_dtype = _wrap, gradient_edge, from_numpy_dtype


_API: list = []


def _tensor_api() -> _TensorAPI:
    if not _API:
        _API.append(_TensorAPI())
    return _API[0]


class DeferredGrad(ABC):
    """A gradient a backward returns not yet computed, so the engine can add it straight into a running sum
    it owns (``accumulate``): a parameter shared by every step of an unrolled loop then costs one kernel per
    step and no separate add. Anywhere else it becomes an ordinary gradient (``tensor()``). Backwards return
    one only on a backend that declares ``accumulates_in_place``, outside ``create_graph``. The kinds are
    ``MatmulGrad`` and ``ColumnSumGrad`` (the engine recognises exactly those, ``_DEFERRED``)."""

    __slots__ = ("backend",)

    shape: tuple
    dtype: Any

    @abstractmethod
    def tensor(self) -> Tensor:
        """The gradient, computed."""

    @abstractmethod
    def accumulate(self, dst: Any) -> Any:
        """``dst + gradient`` (a backend array of the gradient's shape and dtype), in ``dst`` where the backend
        can."""


class MatmulGrad(DeferredGrad):
    """The product ``a @ b`` of two 2-d backend arrays (a linear weight's gradient), added by
    ``Backend.matmul_accumulate``: one GEMM with ``beta = 1``."""

    __slots__ = ("a", "b")

    def __init__(self, backend: Any, a: Any, b: Any):
        self.backend, self.a, self.b = backend, a, b

    @property
    def shape(self) -> tuple:  # noqa: D102 - DeferredGrad's
        return (self.a.shape[0], self.b.shape[-1])

    @property
    def dtype(self) -> Any:  # noqa: D102 - DeferredGrad's
        return self.a.dtype

    def tensor(self) -> Tensor:  # noqa: D102 - DeferredGrad's
        bk = self.backend
        return _tensor_api().wrap(bk.matmul(self.a, self.b), bk)

    def accumulate(self, dst: Any) -> Any:  # noqa: D102 - DeferredGrad's
        return self.backend.matmul_accumulate(dst, self.a, self.b)


class ColumnSumGrad(DeferredGrad):
    """The column sums of a 2-d backend array ``g`` (a linear bias's gradient, ``Backend.bias_grad``), added by
    ``Backend.bias_grad_accumulate``."""

    __slots__ = ("g",)

    def __init__(self, backend: Any, g: Any):
        self.backend, self.g = backend, g

    @property
    def shape(self) -> tuple:  # noqa: D102 - DeferredGrad's
        return (self.g.shape[-1],)

    @property
    def dtype(self) -> Any:  # noqa: D102 - DeferredGrad's
        return self.g.dtype

    def tensor(self) -> Tensor:  # noqa: D102 - DeferredGrad's
        bk = self.backend
        return _tensor_api().wrap(bk.bias_grad(self.g), bk)

    def accumulate(self, dst: Any) -> Any:  # noqa: D102 - DeferredGrad's
        return self.backend.bias_grad_accumulate(dst, self.g)


_DEFERRED = frozenset({MatmulGrad, ColumnSumGrad})


# ---------------------------------------------------------------------- helpers
def check_saved(node: Node) -> None:
    """Raise if a tensor ``node`` saved for its backward was modified in place since."""
    for t, version in zip(node.saved, node.versions):
        vc = t._vc
        if (0 if vc is None else vc[0]) != version:
            raise FlowError(
                f"a tensor saved by {node.name} for its backward was modified in place afterwards (version "
                f"{version} when saved, {t._version} now), so its gradient would be wrong; use an out-of-place op "
                "(x = x + y instead of x.add_(y)) or .clone() the tensor before modifying it"
            )


def _with_history(alias: Tensor, node: Node) -> Tensor:
    """A saved output (see ``tensor._saved_output``) as the output of ``node``, for a differentiable backward."""
    out = _tensor_api().wrap(alias._data, alias._backend)
    out._vc = alias._vc
    out._grad_fn, out._oi, out.requires_grad = node, 0, True
    return out


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


def _finish_leaf(node: AccumulateGrad, g: Tensor, create_graph: bool) -> None:
    """Run the leaf's hooks and add ``g`` to its ``.grad``."""
    t = node.variable()
    if t is None:
        return
    g = _apply_hooks(t._hooks, g)
    if g.shape != t.shape:
        raise FlowError(f"internal: gradient of shape {g.shape} for a leaf of shape {t.shape}")
    if not create_graph:
        g = g.detach()
    t.grad = g if t.grad is None else t.grad + g


# ---------------------------------------------------------------------- the engine
def run_backward(roots: Sequence[Tensor], grads: Sequence[Tensor], *options: Any,
                 **named: Any) -> list[Tensor | None] | None:
    """Propagate ``grads`` from ``roots`` back through the graph: ``run_backward_from_edges`` (same options:
    ``retain_graph``, ``create_graph``, ``capture``, ``allow_unused``) from the roots' gradient edges.

    Without ``capture`` the gradients of leaves that require grad accumulate into ``.grad``. With
    ``capture`` (``fg.autograd.grad``) nothing accumulates: the gradients of those tensors are returned.
    """
    gradient_edge = _tensor_api().gradient_edge
    return run_backward_from_edges([gradient_edge(t) for t in roots], grads, *options, **named)


def run_backward_from_edges(
    root_edges: Sequence[Any],
    grads: Sequence[Tensor],
    retain_graph: bool = False,
    create_graph: bool = False,
    capture: Sequence[Tensor] | None = None,
    allow_unused: bool = True,
) -> list[Tensor | None] | None:
    """``run_backward`` from the roots' gradient edges (``gradient_edge(root)``) instead of the roots: a caller
    that owns the roots (a checkpoint's recomputed outputs) can drop them first, so their buffers are not held
    while the graph behind them runs backward (no backward reads an output it did not save)."""
    gradient_edge = _tensor_api().gradient_edge
    root_edges = [_as_pair(e) for e in root_edges]
    targets: dict[tuple, int] = {}  # edge of a captured tensor -> its position in the result
    captured: list[Tensor | None] = []
    if capture is not None:
        captured = [None] * len(capture)
        for i, t in enumerate(capture):
            e = gradient_edge(t)
            if e is None:
                raise FlowError(f"autograd.grad: input {i} does not require grad")
            targets[_as_pair(e)] = i
    deps = _collect([e[0] for e in root_edges if e is not None])
    run = None
    if capture is not None:
        deps, run = _prune(deps, {e[0] for e in targets})
    buffers = _Buffers(create_graph)
    for e, g in zip(root_edges, grads):
        if e is not None and e[0] in deps:
            buffers.add(e[0], e[1], g)

    anomaly = STATE.anomaly
    # The schedule: decreasing sequence number. Edges are recorded when an op runs, so every node's producers
    # are older than it: this order is topological whatever in-place ops did later. A leaf's AccumulateGrad
    # node runs the moment its last consumer has run (its count of pending edges reaches 0), not in this order.
    order = sorted(deps, key=_SEQ_OF, reverse=True)
    add, sum_ = buffers.add, buffers.sum
    pending = buffers.grads
    pending_pop, pending_get = pending.pop, pending.get
    owned = buffers.owned
    general = run is not None or bool(targets)  # autograd.grad: every node takes the general path

    with enable_grad() if create_graph else no_grad():
        for node in order:
            if type(node) is AccumulateGrad:
                if deps[node] == 0:  # a root leaf, or a leaf whose consumers all ran (finished already below)
                    _finish_ready_leaf(node, buffers, create_graph, targets, captured, run)
                continue
            edges = node.edges
            if node.n_out != 1:
                g = buffers.take(node)
            else:
                g = pending_pop(node, None)
                if owned and g is not None:
                    owned.pop(id(g._data), None)  # handed to the node's backward: no longer the engine's alone
            if g is None:
                in_grads = None
            elif general or node.hooks is not None or node.retain is not None or node.n_out != 1:
                in_grads = _run_node(node, g, buffers, retain_graph, create_graph, targets, captured, run)
                if run is not None and node not in run:
                    continue
            elif node.saved or node.backward is None or retain_graph:
                in_grads = _call_backward(node, g, retain_graph)
            else:  # the commonest case inline: nothing saved, graph freed after use
                in_grads = node.backward(g)
                node.backward = None
                if len(in_grads) != len(edges):
                    _call_backward(node, g, retain_graph)  # raises, naming the op
            if in_grads is None:
                in_grads = _NO_GRADS[len(edges)] if len(edges) < 8 else (None,) * len(edges)
            for e, gi in zip(edges, in_grads):
                if e is None:
                    continue
                m = e if type(e) is not tuple else e[0]
                if type(gi) in _DEFERRED:
                    gi = buffers.add_deferred(m, gi) if m is e and m.n_out == 1 and not anomaly else gi.tensor()
                if gi is not None:
                    if anomaly:
                        _check_finite(gi, f"the backward of {node.name}")
                    if m is e and gi._data.dtype == m.dtypes and m.n_out == 1:
                        prev = pending_get(m)
                        pending[m] = gi if prev is None else sum_(prev, gi)
                    else:
                        add(m, 0 if m is e else e[1], gi)
                if type(m) is AccumulateGrad:
                    left = deps.get(m)
                    if left is not None:
                        deps[m] = left - 1
                        if left == 1:
                            _finish_ready_leaf(m, buffers, create_graph, targets, captured, run)
                            deps[m] = -1  # finished: the sorted loop skips it
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


_NO_GRADS = [(None,) * n for n in range(8)]


def _as_pair(e):
    """An edge as ``(node, output index)`` (edges to a first output are stored as the node alone)."""
    return e if e is None or type(e) is tuple else (e, 0)


def _SEQ_OF(node: Node) -> int:  # noqa: N802 - a sort key
    return node.seq


def _finish_ready_leaf(node: AccumulateGrad, buffers: _Buffers, create_graph: bool, targets: dict, captured: list,
                       run) -> None:
    """Hooks and ``.grad`` (or capture) of a leaf whose gradient is complete."""
    g = buffers.take(node)
    if g is not None:
        _run_node(node, g, buffers, False, create_graph, targets, captured, run)


def _call_backward(node: Node, g, retain_graph: bool) -> tuple:
    """Check the saved versions, run ``node.backward``, free what it saved unless the graph is retained."""
    backward = node.backward
    if backward is None:
        raise FlowError(
            f"backward through {node.name} a second time: its saved values were freed after the first "
            "backward; pass retain_graph=True to the first backward() if you need to run it twice"
        )
    saved = node.saved
    if saved:
        for t, version in zip(saved, node.versions):
            vc = t._vc
            if (0 if vc is None else vc[0]) != version:
                check_saved(node)  # raises, naming the op and both versions
        if STATE.enabled:  # create_graph: a saved output carries this node as its history
            saved = [_with_history(t, node) if t._oi == -1 else t for t in saved]
        in_grads = backward(g, *saved)
    else:
        in_grads = backward(g)
    if not retain_graph:
        node.backward = None
        node.saved = node.versions = ()
    if len(in_grads) != len(node.edges):
        raise FlowError(f"the backward of {node.name} returned {len(in_grads)} gradients for {len(node.edges)} "
                        "inputs")
    return in_grads


def _run_node(node: Node, g, buffers: _Buffers, retain_graph: bool, create_graph: bool,
              targets: dict, captured: list, run) -> tuple | None:
    """The general case: hooks, ``retain_grad``, capture, leaves, several outputs; returns the input grads."""
    multi = node.n_out != 1
    if node.hooks:
        for i, hooks in node.hooks.items():
            if multi:
                if g[i] is not None:
                    g[i] = _apply_hooks(hooks, g[i])
            else:
                g = _apply_hooks(hooks, g)
    if node.retain:
        for i, ref in node.retain.items():
            out = ref()
            gi = g[i] if multi else g
            if out is not None and gi is not None:
                gi = gi if create_graph else gi.detach()
                out.grad = gi if out.grad is None else out.grad + gi
    if targets:
        for i in range(node.n_out):
            pos = targets.get((node, i))
            if pos is not None:
                gi = g[i] if multi else g
                if gi is not None and type(node) is AccumulateGrad:
                    t = node.variable()
                    gi = _apply_hooks(t._hooks, gi) if t is not None else gi
                captured[pos] = gi
    if type(node) is AccumulateGrad:
        if run is None:
            _finish_leaf(node, g, create_graph)
        return None
    if run is not None and node not in run:
        return None
    return _call_backward(node, tuple(g) if multi else g, retain_graph)
