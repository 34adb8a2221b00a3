"""Activation checkpointing: trade compute for memory by recomputing a function's activations in backward.

``checkpoint(fn, *args)`` runs ``fn`` without recording a graph and keeps only its inputs; when backward
reaches the result, ``fn`` runs again with gradients on (on detached copies of the inputs, the random
generators of the devices involved set back to where they were, so dropout draws the same masks) and the
gradient flows through that recomputed graph into the inputs and the parameters ``fn`` uses::

    from flowgraph.utils.checkpoint import checkpoint

    h = checkpoint(block, x)          # block's activations are not kept; x is
    loss = head(h).sum()
    loss.backward()                   # block runs again here, then its backward

PyTorch's ``torch.utils.checkpoint`` names and semantics. It is one ``fg.autograd.Function``: ``forward``
calls ``fn`` under ``no_grad`` and saves the inputs; ``backward`` recomputes and differentiates the
recomputed outputs with the engine (re-entered from inside the outer backward). The parameters ``fn`` uses
are inputs of that node too, so their gradients flow through the engine like any other (hooks run once,
``fg.autograd.grad`` sees them), when flowgraph can see them: ``fn`` is a module, a bound method of one, a
``functools.partial`` or a closure over modules or leaf tensors. A leaf reached only through a global gets
its gradient added to ``.grad`` during the recompute instead (``use_reentrant=True`` behaviour).

Where nothing needs a gradient (under ``fg.no_grad()``, or no input and no visible parameter requires
grad), ``fn`` simply runs: there is no graph to save memory on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..autograd.function import Function, FunctionCtx
from ..autograd.grad_mode import STATE, enable_grad
from ..autograd.node import AccumulateGrad, next_seq, run_backward_from_edges
from ..backends.registry import get_backend
from ..errors import FlowError
from ..tensor import Tensor, zeros
from ..tensor.tensor import gradient_edge

__all__ = ["checkpoint", "checkpoint_sequential", "run_checkpointed"]


# ---------------------------------------------------------------------- nested structures of arguments/outputs
def _flatten(value: Any) -> tuple[list[Any], Any]:
    """Leaves of nested tuples/lists/dicts and a spec to rebuild them with ``_unflatten``."""
    if isinstance(value, (tuple, list)):
        leaves: list[Any] = []
        specs = []
        for v in value:
            sub, spec = _flatten(v)
            leaves.extend(sub)
            specs.append((len(sub), spec))
        return leaves, (type(value), specs)
    if isinstance(value, dict):
        leaves, spec = _flatten(list(value.values()))
        return leaves, (dict, (list(value.keys()), spec))
    return [value], None


def _unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    if spec is None:
        return leaves[0]
    kind, inner = spec
    if kind is dict:
        keys, list_spec = inner
        return dict(zip(keys, _unflatten(leaves, list_spec)))
    out, start = [], 0
    for n, sub in inner:
        out.append(_unflatten(leaves[start:start + n], sub))
        start += n
    if kind is tuple or kind is list:
        return kind(out)
    return kind(*out)  # a namedtuple


# ---------------------------------------------------------------------- parameters fn uses
def _visible_leaves(fn: Any, seen: set[int] | None = None) -> list[Tensor]:
    """Leaf tensors that require grad and that ``fn`` can reach through what flowgraph can see: the module it
    is (or is a method of), a ``functools.partial``'s function and arguments, a closure's cells."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    found: list[Tensor] = []
    if isinstance(fn, Tensor):
        return [fn] if fn.requires_grad and fn.is_leaf else []
    parameters = None if isinstance(fn, type) else getattr(fn, "parameters", None)
    if callable(parameters) and hasattr(fn, "named_modules"):  # an nn.Module (no import: nn sits beside us)
        return [p for p in parameters() if p.requires_grad]
    if isinstance(fn, functools.partial):
        for part in (fn.func, *fn.args, *fn.keywords.values()):
            found.extend(_visible_leaves(part, seen))
        return found
    if isinstance(fn, (list, tuple)):
        for part in fn:
            found.extend(_visible_leaves(part, seen))
        return found
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        found.extend(_visible_leaves(owner, seen))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, Tensor) or callable(content) or isinstance(content, (list, tuple)):
            found.extend(_visible_leaves(content, seen))
    return found


def _unique(tensors: Iterable[Tensor], skip: set[int]) -> list[Tensor]:
    out = []
    for t in tensors:
        if id(t) not in skip:
            skip.add(id(t))
            out.append(t)
    return out


# ---------------------------------------------------------------------- random state
def _rng_states(devices: Iterable[str]) -> dict[str, Any]:
    return {d: get_backend(d).get_rng_state() for d in devices}


def _set_rng_states(states: dict[str, Any]) -> None:
    for device, state in states.items():
        get_backend(device).set_rng_state(state)


# ---------------------------------------------------------------------- the node
class _Plan:
    """What one checkpointed call needs again in backward (everything but the saved tensors)."""

    def __init__(self, fn: Callable, arg_spec: Any, arg_leaves: list[Any], n_inputs: int, preserve_rng: bool,
                 on_recompute: Callable | None):
        self.fn = fn
        self.arg_spec = arg_spec
        self.arg_leaves = arg_leaves  # non-tensor leaves kept; tensor positions refilled on each call
        self.tensor_slots = [i for i, v in enumerate(arg_leaves) if isinstance(v, Tensor)]
        self.n_inputs = n_inputs
        self.preserve_rng = preserve_rng
        self.on_recompute = on_recompute
        self.rng: dict[str, Any] = {}
        self.autocast = None
        self.out_spec: Any = None
        self.out_leaves: list[Any] = []
        self.placeholder = False

    def call(self, tensors: Sequence[Tensor]) -> Any:
        leaves = list(self.arg_leaves)
        for slot, t in zip(self.tensor_slots, tensors):
            leaves[slot] = t
        args, kwargs = _unflatten(leaves, self.arg_spec)
        return self.fn(*args, **kwargs)


class _CheckpointFunction(Function):
    """The checkpoint node: inputs are the call's tensors then the parameters ``fn`` uses."""

    @staticmethod
    def forward(ctx: FunctionCtx, plan: _Plan, *tensors: Tensor) -> tuple:
        ctx.plan = plan
        ctx.save_for_backward(*tensors)
        if plan.preserve_rng:
            devices = {t.device for t in tensors} | {"cpu"}
            plan.rng = _rng_states(sorted(devices))
        plan.autocast = STATE.autocast
        out = plan.call(tensors[:plan.n_inputs])
        leaves, plan.out_spec = _flatten(out)
        plan.out_leaves = [None if isinstance(v, Tensor) else v for v in leaves]
        outs = tuple(v for v in leaves if isinstance(v, Tensor))
        if not outs:  # a node needs one output; fn returned no tensor, so nothing can flow back anyway
            plan.placeholder = True
            outs = (zeros(0),)
        return outs

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Tensor | None) -> tuple:
        plan: _Plan = ctx.plan
        if STATE.enabled:
            raise FlowError("backward(create_graph=True) through a checkpointed call: its gradient is computed "
                            "from a recomputed graph that is not connected to the inputs, so it cannot be "
                            "differentiated again; run the function without checkpoint for higher-order gradients")
        # The incoming gradients first, before the recompute allocates: computing a pending sum (a residual
        # stream's gradient) needs its operands and its result at once, and that should not add to the
        # recomputed activations.
        for g in grads:
            _realized(g)
        saved = ctx.saved_tensors
        inputs, leaves = saved[:plan.n_inputs], saved[plan.n_inputs:]
        detached = [t.detach().requires_grad_(True) if t.requires_grad else t.detach() for t in inputs]
        start = next_seq()
        restore = plan.on_recompute() if plan.on_recompute is not None else None
        current = _rng_states(plan.rng) if plan.rng else {}
        prev_autocast = STATE.autocast
        try:
            _set_rng_states(plan.rng)
            STATE.autocast = plan.autocast
            with enable_grad():
                out = plan.call(detached)
        finally:
            STATE.autocast = prev_autocast
            _set_rng_states(current)
            if restore is not None:
                restore()
        # The recomputed outputs are only where backward starts: keep their gradient edges and let the tensors
        # go, so their buffers are not held while the recomputed graph runs backward (a node that needs its
        # output saved it).
        roots, root_grads = [], []
        if not plan.placeholder:
            for o, g in zip((v for v in _flatten(out)[0] if isinstance(v, Tensor)), grads):
                if g is not None and o.requires_grad:
                    roots.append(gradient_edge(o))
                    root_grads.append(g)
            o = None
        out = None
        targets = [t for t in (*detached, *leaves) if t.requires_grad]
        known = {id(t) for t in targets}
        extra = [t for t in _leaves_of(roots, start) if id(t) not in known]
        found: dict[int, Tensor | None] = {}
        if roots:
            captured = _backward_without_leaf_hooks(roots, root_grads, targets + extra, leaves)
            found = {id(t): g for t, g in zip(targets + extra, captured)}
        for t in extra:  # leaves fn reached through globals: not inputs of this node, so accumulate here
            g = found.get(id(t))
            if g is not None:
                t.grad = g.detach() if t.grad is None else t.grad + g.detach()
        return (None, *(_realized(found.get(id(t))) for t in (*detached, *leaves)))


def _realized(t: Tensor | None) -> Tensor | None:
    """``t`` with its pending expression computed (``Backend.realize``): on the lazy backends a gradient
    entering or leaving a checkpointed segment would otherwise be an unevaluated sum still reading the
    buffers of earlier segments (a residual stream's gradient accumulates across every block), keeping
    them alive and undoing what checkpointing saves."""
    if t is not None:
        t._backend.realize(t._data)
    return t


def _leaves_of(roots: Sequence[Any], start: int) -> list[Tensor]:
    """The leaf tensors (requiring grad) the recomputed graph reaches from the roots' gradient edges; a tensor
    computed outside fn that requires grad is an error (its graph belongs to the outer backward, which would
    run it twice)."""
    stack = [e for e in roots if e is not None]
    seen: set[int] = set()
    leaves: list[Tensor] = []
    while stack:
        e = stack.pop()
        node = e[0] if type(e) is tuple else e
        if id(node) in seen:
            continue
        seen.add(id(node))
        if type(node) is AccumulateGrad:
            t = node.variable()
            if t is not None:
                leaves.append(t)
            continue
        if node.seq < start:
            raise FlowError(
                f"checkpoint(fn): fn uses a tensor that requires grad and was computed outside fn (by "
                f"{node.name}); pass it to checkpoint as an argument (checkpoint(fn, x, that_tensor)) so its "
                "gradient flows through the checkpoint"
            )
        stack.extend(x for x in node.edges if x is not None)
    return leaves


def _backward_without_leaf_hooks(roots: list[Any], grads: list[Tensor], capture: list[Tensor],
                                 leaves: Sequence[Tensor]) -> list[Tensor | None]:
    """The recomputed graph's gradients for ``capture``, from the roots' gradient edges. The parameters' hooks
    are held back meanwhile: their gradients go on through this node to the outer backward, whose
    AccumulateGrad runs the hooks once."""
    held = [(p, p._hooks) for p in leaves if p._hooks]
    for p, _ in held:
        p._hooks = None
    try:
        return run_backward_from_edges(roots, grads, retain_graph=False, create_graph=False, capture=capture,
                                       allow_unused=True)
    finally:
        for p, hooks in held:
            p._hooks = hooks


# ---------------------------------------------------------------------- public API
def checkpoint(function: Callable, *args: Any, use_reentrant: bool = False, preserve_rng_state: bool = True,
               **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` without keeping its activations: they are recomputed in backward.

    Like ``torch.utils.checkpoint.checkpoint``. Tensors may sit anywhere in ``args``/``kwargs`` (nested in
    tuples, lists, dicts) next to non-tensor values; the result may be a tensor or a nested tuple/list/dict
    of tensors and other values. With ``preserve_rng_state`` (the default) the recompute draws the same
    random numbers as the first run (dropout masks match). ``use_reentrant`` is accepted for PyTorch code:
    flowgraph has one implementation, which behaves like ``use_reentrant=False`` for the parameters it can see
    (see the module docstring). Checkpoints nest: an inner one only takes effect during the outer recompute.
    """
    for name, value in (("use_reentrant", use_reentrant), ("preserve_rng_state", preserve_rng_state)):
        if not isinstance(value, bool):
            raise FlowError(f"checkpoint({name}=...): expected True or False, got {value!r}")
    if not callable(function):
        raise FlowError(f"checkpoint(function=...): expected a callable (a module or a function), got "
                        f"{type(function).__name__}")
    return run_checkpointed(function, args, kwargs, _visible_leaves(function), preserve_rng_state)


def run_checkpointed(function: Callable, args: tuple, kwargs: dict, leaves: Sequence[Tensor],
                     preserve_rng_state: bool = True, on_recompute: Callable | None = None) -> Any:
    """``checkpoint`` with the parameters ``function`` uses given by the caller (``Graph.checkpoint_activations``
    knows them: the subtree's); ``on_recompute()``, when given, runs before each recompute and returns a
    function that undoes the recompute's side effects afterwards (running statistics, stored tag values)."""
    arg_leaves, arg_spec = _flatten((args, kwargs))
    inputs = [v for v in arg_leaves if isinstance(v, Tensor)]
    params = _unique(leaves, {id(t) for t in inputs})
    if not STATE.enabled or not any(t.requires_grad for t in (*inputs, *params)):
        return function(*args, **kwargs)
    plan = _Plan(function, arg_spec, arg_leaves, len(inputs), preserve_rng_state, on_recompute)
    outs = _CheckpointFunction.apply(plan, *inputs, *params)
    if plan.placeholder:
        return _unflatten(plan.out_leaves, plan.out_spec)
    outs = iter(outs)
    leaves_out = [next(outs) if v is None else v for v in plan.out_leaves]
    return _unflatten(leaves_out, plan.out_spec)


def checkpoint_sequential(functions: Any, segments: int, input: Any, use_reentrant: bool = False,  # noqa: A002
                          preserve_rng_state: bool = True) -> Any:
    """Run a sequence of modules/functions (an ``nn.Sequential`` or a list) in ``segments`` checkpointed
    pieces, like ``torch.utils.checkpoint.checkpoint_sequential``: every segment but the last keeps only its
    input; the last runs normally (its activations are needed at once by backward)."""
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    if not isinstance(segments, int) or isinstance(segments, bool) or not 1 <= segments <= max(1, len(functions)):
        raise FlowError(f"checkpoint_sequential(segments=...): expected an int from 1 to the number of functions "
                        f"({len(functions)}), got {segments!r}")
    size = -(-len(functions) // segments)
    chunks = [functions[i:i + size] for i in range(0, len(functions), size)]

    def run_chunk(chunk: list, x: Any) -> Any:
        for f in chunk:
            x = f(x)
        return x

    for chunk in chunks[:-1]:
        input = checkpoint(functools.partial(run_chunk, chunk), input, use_reentrant=use_reentrant,  # noqa: A001
                           preserve_rng_state=preserve_rng_state)
    return run_chunk(chunks[-1], input) if chunks else input
