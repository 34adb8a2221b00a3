"""``fg.autograd.Function``: custom differentiable ops with PyTorch's API.

::

    class Exp(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

    y = Exp.apply(x)

``forward`` runs with gradient recording off and returns a tensor or a tuple of tensors; ``backward`` gets one
gradient per output and returns one per ``forward`` argument (``None`` for non-tensors or inputs that need none).
It runs on the same engine node as flowgraph's own ops: edges recorded when ``apply`` runs, saved tensors
version-checked before ``backward``, ``mark_dirty`` for in-place forwards (the input is rebased onto this op,
views included), ``mark_non_differentiable`` for outputs such as indices.
"""

from __future__ import annotations

from typing import Any

from ..errors import FlowError
from .grad_mode import STATE, no_grad
from .node import Node, check_saved


class FunctionCtx:
    """The ``ctx`` passed to ``forward`` and ``backward``: what forward leaves for backward."""

    def __init__(self) -> None:
        self._saved: tuple = ()
        self._node: Node | None = None
        self._dirty: tuple = ()
        self._non_diff: tuple = ()
        self.materialize_grads = True
        self.needs_input_grad: tuple[bool, ...] = ()

    def save_for_backward(self, *tensors) -> None:
        """Keep these tensors (or ``None``) for backward; an in-place change to one before backward raises."""
        from ..tensor.tensor import Tensor

        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise FlowError(f"save_for_backward takes tensors or None, got {type(t).__name__}; keep other "
                                "values as attributes of ctx (ctx.scale = 2.0)")
        self._saved = tuple(tensors)
        for t in tensors:
            if t is not None:
                t._backend.mark_saved(t._data)  # a lazy backend writes a pending value out where it is computed

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to ``save_for_backward`` (checked: none was modified in place since)."""
        node = self._node
        if node is not None:
            if node.backward is None:
                raise FlowError(
                    f"saved_tensors of {node.name} were freed after the first backward; pass retain_graph=True "
                    "to the first backward() to run it twice"
                )
            check_saved(node)
        return self._saved

    def mark_dirty(self, *tensors) -> None:
        """Declare the inputs ``forward`` modified in place (they must also be returned)."""
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        """Declare outputs that get no gradient (indices, masks)."""
        self._non_diff = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """With ``False``, ``backward`` receives ``None`` (not zeros) for outputs that got no gradient."""
        self.materialize_grads = bool(value)


class Function:
    """Base class of custom ops: define static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``, call
    ``apply(*args)``. See the module docstring and ``docs/custom_ops.md``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        """Compute the outputs from the inputs (gradient recording is off in here)."""
        raise NotImplementedError("a Function subclass defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        """Return the gradient of each ``forward`` argument given the gradient of each output."""
        raise NotImplementedError("a Function subclass defines backward(ctx, *grads) to be differentiated")

    @classmethod
    def apply(cls, *args: Any) -> Any:
        """Run ``forward`` and, when an input requires grad, record one node whose backward is ``backward``."""
        from ..tensor.indexing import _rebase_base
        from ..tensor.tensor import Tensor, _alias, _refresh_view, _wrap, gradient_edge

        ctx = FunctionCtx()
        tensor_args = [a if isinstance(a, Tensor) else None for a in args]
        for t in tensor_args:
            if t is not None and t._view is not None:
                _refresh_view(t)
        ctx.needs_input_grad = tuple(t is not None and t.requires_grad for t in tensor_args)
        records = STATE.enabled and any(ctx.needs_input_grad)
        edges = tuple(gradient_edge(t) if t is not None and t.requires_grad else None for t in tensor_args) \
            if records else ()
        with no_grad():
            result = cls.forward(ctx, *args)
        single = not isinstance(result, tuple)
        outputs = (result,) if single else result
        for i, o in enumerate(outputs):
            if o is not None and not isinstance(o, Tensor):
                raise FlowError(f"{cls.__name__}.forward returned a {type(o).__name__} as output {i}; "
                                "return tensors (or a tuple of tensors)")
        dirty_ids = {id(t) for t in ctx._dirty}
        non_diff = {id(t) for t in ctx._non_diff}
        for t in ctx._dirty:
            if not any(t is o for o in outputs):
                raise FlowError(f"{cls.__name__}: a tensor passed to mark_dirty must also be returned by forward")
            t._bump_version()
        if not records:
            return result
        for t in ctx._dirty:
            if t.requires_grad and t._grad_fn is None and t._view is None:
                raise FlowError(f"{cls.__name__}: a leaf tensor that requires grad was modified in place by "
                                "forward; call it under fg.no_grad() or pass a clone")
        # Outputs that are inputs returned unchanged (not dirty) become new tensors (PyTorch does the same),
        # so that giving them this node does not rewrite the input's history.
        outs = []
        for o in outputs:
            if o is not None and id(o) not in dirty_ids and any(o is t for t in tensor_args):
                o = _alias(o)
            outs.append(o)
        saved = tuple(t for t in ctx._saved if t is not None)
        versions = tuple(0 if t._vc is None else t._vc[0] for t in saved)
        n_out = len(outs)
        materialize = ctx
        # What zero gradients need of the outputs: their shapes and dtypes, not the outputs themselves (holding
        # those would keep every output's memory alive until backward, which checkpointing exists to avoid).
        out_meta = tuple(None if o is None else (tuple(o.shape), o._data.dtype, o._backend) for o in outs)

        def backward(grads, *_saved):
            grads = (grads,) if n_out == 1 else tuple(grads)
            if materialize.materialize_grads:
                grads = tuple(g if g is not None or m is None else _wrap(m[2].full(m[0], 0, m[1]), m[2])
                              for g, m in zip(grads, out_meta))
            res = cls.backward(ctx, *grads)  # the engine has set the grad mode (create_graph or not)
            res = res if isinstance(res, tuple) else (res,)
            if len(res) != len(args):
                raise FlowError(f"{cls.__name__}.backward returned {len(res)} gradients, forward took {len(args)} "
                                "arguments (return None for the ones without a gradient)")
            for i, (g, t) in enumerate(zip(res, tensor_args)):
                if g is not None and t is not None and tuple(g.shape) != tuple(t.shape):
                    raise FlowError(f"{cls.__name__}.backward: the gradient of argument {i} has shape "
                                    f"{tuple(g.shape)}, the argument has shape {tuple(t.shape)}")
            return tuple(g if t is not None and t.requires_grad else None for g, t in zip(res, tensor_args))

        dtypes = tuple(None if o is None else o._data.dtype for o in outs)
        node = Node(backward, edges, cls.__name__, saved, versions, dtypes if n_out > 1 else dtypes[0], n_out)
        ctx._node = node
        for i, o in enumerate(outs):
            if o is None or id(o) in non_diff or o._data.dtype.kind not in "fV" and o._data.dtype.name != "bfloat16":
                continue
            view = o._view if id(o) in dirty_ids else None
            if view is not None:
                # an in-place forward on a view: the node's output is the new value of the view region
                fresh = _wrap(o._data, o._backend)
                fresh._grad_fn, fresh._oi, fresh.requires_grad = node, i, True
                _rebase_base(o, view, fresh)
                view[2] = o._vc[0]
            else:
                o._grad_fn, o._oi, o.requires_grad = node, i, True
        return outs[0] if single else tuple(outs)
