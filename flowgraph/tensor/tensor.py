"""The ``Tensor`` class and the helpers every op uses.

A tensor is a native array of one backend plus autograd bookkeeping. The hot path is deliberately lean
(``__slots__``, no per-op dicts, one attribute read for the grad mode): the host cost of an op decides
the speed of small models. Ops live in sibling modules and are installed as methods by
``flowgraph.tensor.__init__``.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..autograd.grad_mode import STATE
from ..autograd.node import AccumulateGrad, Node, run_backward
from ..errors import AnomalyError, BackendError, FlowError, IndexOutOfRangeError
from .dtype import DType, from_numpy_dtype

_new = object.__new__


class Tensor:
    """An n-dimensional array on a device, with reverse-mode autograd.

    Create tensors with ``fg.tensor``, ``fg.zeros``, ``fg.randn`` ...; the API follows ``torch.Tensor``::

        x = fg.tensor([[1.0, 2.0]], requires_grad=True)
        y = (x * 2 + 1).relu().sum()
        y.backward()
        x.grad  # tensor([[2., 2.]])
    """

    # _oi: which output of _grad_fn this tensor is; _acc: a leaf's AccumulateGrad node (made on first use);
    # _view: [base, view chain, version] for a tensor that shares its base's storage (see _make_view).
    __slots__ = ("_data", "_backend", "requires_grad", "grad", "_grad_fn", "_vc", "_hooks", "_oi", "_acc", "_view",
                 "__weakref__")
    __array_priority__ = 1000  # numpy defers to Tensor's reflected operators

    # ------------------------------------------------------------------ construction
    def __init__(self, data: Any = None, dtype=None, device=None, requires_grad: bool = False):
        from .creation import tensor as make

        made = make([] if data is None else data, dtype=dtype, device=device, requires_grad=requires_grad)
        self._data = made._data
        self._backend = made._backend
        self.requires_grad = made.requires_grad
        self.grad = None
        self._grad_fn = None
        self._vc = None
        self._hooks = None
        self._oi = 0
        self._acc = None
        self._view = None

    # ------------------------------------------------------------------ basic properties
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape as a tuple of ints (PyTorch's ``torch.Size`` is a tuple too)."""
        return self._data.shape

    def size(self, dim: int | None = None):
        """The shape, or the length of one dimension."""
        shape = self._data.shape
        if dim is None:
            return shape
        return shape[_norm_dim(dim, len(shape), "size")]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return self._data.ndim

    def dim(self) -> int:
        """Number of dimensions."""
        return self._data.ndim

    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for s in self._data.shape:
            n *= s
        return n

    def __len__(self) -> int:
        if not self._data.shape:
            raise TypeError("len() of a 0-d tensor; use .item() or .numel()")  # TypeError, as in PyTorch
        return self._data.shape[0]

    @property
    def dtype(self) -> DType:
        """The flowgraph dtype (``fg.float32`` ...)."""
        return from_numpy_dtype(self._data.dtype)

    @property
    def device(self) -> str:
        """The device string: ``"cpu"``, ``"cuda:0"``, ``"opencl:1"``."""
        return self._backend.device

    @property
    def is_leaf(self) -> bool:
        """True for tensors not produced by a recorded op (user-created tensors, parameters)."""
        return self._grad_fn is None

    @property
    def grad_fn(self) -> Node | None:
        """The node that produced this tensor, or ``None`` for a leaf."""
        if self._view is not None:
            _refresh_view(self)
        return self._grad_fn

    @property
    def _version(self) -> int:
        return 0 if self._vc is None else self._vc[0]

    def _bump_version(self) -> None:
        if self._vc is None:
            self._vc = [1]
        else:
            self._vc[0] += 1

    @property
    def data(self) -> Tensor:
        """A detached tensor sharing this one's storage (writes through it skip autograd)."""
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise FlowError(f".data must be set to a Tensor, got {type(value).__name__}")
        self._data = value._data
        self._backend = value._backend

    # ------------------------------------------------------------------ autograd
    def backward(self, gradient: Tensor | None = None, retain_graph: bool = False,
                 create_graph: bool = False, inputs=None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        ``gradient`` is required for non-scalar tensors (the vector in the vector-Jacobian product).
        """
        if not self.requires_grad:
            raise FlowError(
                "backward() on a tensor that does not require grad: no input of the computation had "
                "requires_grad=True (or it ran under fg.no_grad())"
            )
        if gradient is None:
            if self.numel() != 1:
                raise FlowError(
                    f"backward() without a gradient needs a single-element tensor, this one has shape {self.shape}; "
                    "reduce it first (e.g. loss.sum()) or pass gradient=..."
                )
            gradient = _wrap(self._backend.full(self.shape, 1, self._data.dtype), self._backend)
        elif gradient.shape != self.shape:
            raise FlowError(f"backward(): gradient has shape {gradient.shape}, expected {self.shape}")
        if inputs is not None:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            grads = run_backward([self], [gradient], retain_graph, create_graph, capture=inputs)
            with_graph = create_graph
            for t, g in zip(inputs, grads):
                if g is not None:
                    g = g if with_graph else g.detach()
                    t.grad = g if t.grad is None else t.grad + g
            return
        run_backward([self], [gradient], retain_graph, create_graph)

    def detach(self) -> Tensor:
        """A tensor sharing storage but cut from the graph."""
        out = _wrap(self._data, self._backend)
        if self._vc is None:
            self._vc = [0]
        out._vc = self._vc
        return out

    def detach_(self) -> Tensor:
        """Cut this tensor from the graph in place."""
        if self._view is not None:
            raise FlowError("detach_() on a view: use .detach(), which returns a new tensor cut from the graph")
        self._grad_fn = None
        self.requires_grad = False
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` on a leaf (in place) and return it."""
        if self._grad_fn is not None and not requires_grad:
            raise FlowError(
                "requires_grad_(False) on a non-leaf tensor; use .detach() to get a tensor cut from the graph"
            )
        if requires_grad and not self._data.dtype.kind == "f" and self._data.dtype.name != "bfloat16":
            raise FlowError(f"requires_grad=True: only floating tensors can require gradients, this one is "
                            f"{self.dtype}; convert it first, e.g. .float()")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor after backward."""
        fn = self.grad_fn
        if fn is not None:
            if fn.retain is None:
                fn.retain = {}
            fn.retain[self._oi] = weakref.ref(self)

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is computed; a non-None result replaces it.

        On a leaf the hook runs before the gradient is added to ``.grad``; on a non-leaf it sees the gradient of
        this tensor's value at the time of the call (an in-place op later gives the tensor a new ``grad_fn``).
        """
        if not callable(hook):
            raise FlowError(f"register_hook: hook must be callable (called with the gradient), got "
                            f"{type(hook).__name__} {hook!r:.40}")
        if not self.requires_grad:
            raise FlowError("register_hook on a tensor that does not require grad")
        fn = self.grad_fn
        if fn is not None:
            fn.register_hook(hook, self._oi)
            hooks = fn.hooks[self._oi]
        else:
            if self._hooks is None:
                self._hooks = []
            hooks = self._hooks
            hooks.append(hook)

        class _Handle:
            """Removes the hook."""

            def remove(self_inner) -> None:
                if hook in hooks:
                    hooks.remove(hook)

        return _Handle()

    # ------------------------------------------------------------------ host exchange
    def item(self):
        """The value of a one-element tensor as a Python number (waits for the device)."""
        if PENDING_INDEX_CHECKS:
            raise_pending_index_errors()
        if self.numel() != 1:
            raise FlowError(f"item() needs a single-element tensor, this one has shape {self.shape}")
        return self._backend.to_host(self._data).reshape(()).item()

    def numpy(self) -> np.ndarray:
        """The values as a numpy array (shares memory on the CPU backend, a copy elsewhere)."""
        if self.requires_grad:
            raise FlowError("numpy() on a tensor that requires grad; call .detach().numpy() instead")
        if PENDING_INDEX_CHECKS:
            raise_pending_index_errors()
        return self._backend.to_host(self._data)

    def tolist(self):
        """The values as nested Python lists."""
        if PENDING_INDEX_CHECKS:
            raise_pending_index_errors()
        return self._backend.to_host(self._data).tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise FlowError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    def __index__(self) -> int:
        if self._data.dtype.kind not in "iub" or self.numel() != 1:
            raise FlowError("only single-element integer tensors can be used as an index")
        return int(self.item())

    #: Identity hashing, as torch's tensors (``__eq__`` is elementwise): ``object``'s own C slot, not a Python
    #: method, since optimizer state, hooks and caches look tensors up in dicts at every step.
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        host = self._backend.to_host(self._data)
        if host.dtype.name == "bfloat16":
            host = host.astype(np.float32)
        body = np.array2string(host, separator=", ", prefix="tensor(", threshold=1000, precision=4)
        extras = []
        if self._backend.device != "cpu":
            extras.append(f"device='{self._backend.device}'")
        dt = self.dtype
        if dt.name not in ("float32", "int64", "bool") or host.size == 0:
            extras.append(f"dtype=flowgraph.{dt.name}")
        if self._grad_fn is not None:
            extras.append(f"grad_fn=<{self._grad_fn.name}Backward>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    def __dlpack__(self, *args, **kwargs):
        return self._backend.to_dlpack(self._data, *args, **kwargs)

    def __dlpack_device__(self):
        return self._backend.dlpack_device(self._data)

    def __iter__(self):
        """Iterate over the first dimension (a 0-d tensor cannot be iterated), as PyTorch does."""
        if not self._data.shape:
            raise TypeError("iteration over a 0-d tensor")
        for i in range(self._data.shape[0]):
            yield self[i]

    def __format__(self, spec: str) -> str:
        if spec and self.numel() == 1 and not self._data.shape:
            return format(self.item(), spec)
        return format(repr(self), spec) if spec else repr(self)

    def __deepcopy__(self, memo: dict) -> Tensor:
        """A copy with its own storage on the same device (best-model snapshots, EMA), as ``copy.deepcopy`` of a
        torch tensor: leaves only; ``requires_grad`` and ``.grad`` are copied too."""
        if id(self) in memo:
            return memo[id(self)]
        if self._grad_fn is not None:
            raise FlowError("only tensors created explicitly by the user (graph leaves) support deepcopy; "
                            "call .detach() first")
        bk = self._backend
        data = bk.contiguous(bk.add(self._data, 0) if self._data.dtype.kind != "b" else bk.logical_or(self._data,
                                                                                                   False))
        out = _wrap(data, bk)
        if type(self) is not Tensor:  # Parameter and other subclasses keep their class
            out.__class__ = type(self)
        out.requires_grad = self.requires_grad
        memo[id(self)] = out
        if self.grad is not None:
            import copy

            out.grad = copy.deepcopy(self.grad, memo)
        return out

    def __reduce_ex__(self, protocol):
        """Pickling for inter-process transfer (a host copy, rebuilt on the same device type). Loading *files*
        never unpickles: checkpoints are safetensors."""
        if self._grad_fn is not None:
            raise FlowError("pickling a non-leaf tensor: call .detach() first")
        host = self._backend.to_host(self._data)
        return (_rebuild, (host, self._backend.device, self.requires_grad, type(self)))


def _rebuild(host, device: str, requires_grad: bool, cls=None) -> Tensor:
    """Unpickle a tensor (see ``Tensor.__reduce_ex__``)."""
    from ..backends import get_backend

    bk = get_backend(device)
    out = _wrap(bk.from_host(host), bk)
    if cls is not None and cls is not Tensor:
        out.__class__ = cls
    out.requires_grad = requires_grad
    return out


# ---------------------------------------------------------------------- device-side checks
#: (backend, error class) -> (0-d bool device array: a check failed since the last host read, op names). An
#: accelerator checks indices (and integer divisors) on the device without waiting for it; the result is read
#: at the next host read (``item``, ``numpy``, ``tolist``), where a failure raises as it does at once on the CPU.
#: Kernels clamp meanwhile, so memory stays safe.
PENDING_INDEX_CHECKS: dict = {}


def _defer_check(bk, bad, where: str, error: type) -> None:
    """Record a device-side ``bad`` flag (any element true = failure) of ``where`` for the next host read."""
    key = (bk, error)
    found = PENDING_INDEX_CHECKS.get(key)
    if found is None:
        PENDING_INDEX_CHECKS[key] = (bad, [where])
    else:
        PENDING_INDEX_CHECKS[key] = (bk.logical_or(found[0], bad),
                                     found[1] if where in found[1] else found[1] + [where])


def check_index_range(index: Tensor, low: int, high: int, where: str) -> None:
    """Raise ``IndexOutOfRangeError`` unless every element of ``index`` is in ``[low, high)``: at once on the CPU,
    at the next host read on a device (one comparison and reduction there, no synchronisation)."""
    if index.numel() == 0:
        return
    bk = index._backend
    d = index._data
    if bk.device == "cpu":
        lo, hi = int(d.min()), int(d.max())
        if lo < low or hi >= high:
            bad = lo if lo < low else hi
            raise IndexOutOfRangeError(f"{where}: index {bad} is out of range (valid: {low} .. {high - 1})")
        return
    axes = tuple(range(d.ndim))
    _defer_check(bk, bk.any(bk.logical_or(bk.lt(d, low), bk.ge(d, high)), axes, False), where,
                 IndexOutOfRangeError)


def check_nonzero_divisor(divisor, where: str) -> None:
    """Integer division by zero raises ``ZeroDivisionError`` (PyTorch's CPU behaviour) on every backend."""
    if isinstance(divisor, Tensor):
        if divisor.numel() == 0 or divisor._data.dtype.kind not in "iu":
            return
        bk, d = divisor._backend, divisor._data
        if bk.device == "cpu":
            if not d.all():
                raise ZeroDivisionError(f"{where}: integer division by zero")
            return
        _defer_check(bk, bk.any(bk.eq(d, 0), tuple(range(d.ndim)), False), where, ZeroDivisionError)
    elif divisor == 0 and not isinstance(divisor, float):
        raise ZeroDivisionError(f"{where}: integer division by zero")


def raise_pending_index_errors() -> None:
    """Read the pending device-side checks; raise the first failed one's error, naming the ops."""
    pending = list(PENDING_INDEX_CHECKS.items())
    PENDING_INDEX_CHECKS.clear()
    for (bk, error), (flag, ops) in pending:
        if bool(bk.to_host(flag)):
            what = "an index was out of range" if error is IndexOutOfRangeError else "an integer division by zero"
            raise error(
                f"{what} in {', '.join(ops)} on {bk.device} since the last host read (checked on the device and "
                "reported here, as the cpu raises at once)"
            )


# ---------------------------------------------------------------------- helpers shared by the ops
def _wrap(data, backend) -> Tensor:
    """A new tensor around a native array, outside the graph (the fastest constructor)."""
    t = _new(Tensor)
    t._data = data
    t._backend = backend
    t.requires_grad = False
    t.grad = None
    t._grad_fn = None
    t._vc = None
    t._hooks = None
    t._oi = 0
    t._acc = None
    t._view = None
    return t


def gradient_edge(t: Tensor):
    """Where the gradient of ``t`` goes (a ``Node`` edge): its ``grad_fn`` (``(grad_fn, i)`` when ``t`` is output
    ``i > 0`` of it), its ``AccumulateGrad`` node for a leaf that requires grad, or ``None``. A view whose base was
    modified in place since gets its ``grad_fn`` anew."""
    if t._view is not None:
        _refresh_view(t)
    fn = t._grad_fn
    if fn is not None:
        return fn if t._oi == 0 else (fn, t._oi)
    if t.requires_grad:
        acc = t._acc
        if acc is None:
            acc = t._acc = AccumulateGrad(t)
        return acc
    return None


def _record(out: Tensor, name: str, inputs: tuple, saved: tuple, backward) -> Tensor:
    """Record ``out`` as produced by an op (the thin form of ``fg.autograd.Function``).

    ``inputs`` are the op's tensor inputs (``None`` for constants); ``backward(grad, *saved)`` returns one
    gradient (or ``None``) per input and may read only ``saved`` (tensors whose versions are checked before it
    runs) and non-tensor constants: a closure over a tensor is a bug the op table's test catches.
    """
    # gradient_edge, inlined for the common cases (a non-view with a grad_fn, a leaf that has its node)
    if len(inputs) == 2:
        t, u = inputs  # (written out twice on purpose: a helper call per input costs ~0.1 us on every op)
        et = None if t is None else (t._grad_fn or t._acc) if t._view is None and t._oi == 0 and (
            t._grad_fn is not None or t._acc is not None) else gradient_edge(t)
        eu = None if u is None else (u._grad_fn or u._acc) if u._view is None and u._oi == 0 and (
            u._grad_fn is not None or u._acc is not None) else gradient_edge(u)
        edges = (et, eu)
    elif len(inputs) == 1:
        t = inputs[0]
        edges = (t._grad_fn,) if t._view is None and t._oi == 0 and t._grad_fn is not None else (gradient_edge(t),)
    else:
        edges = tuple([None if t is None else gradient_edge(t) for t in inputs])
    versions = ()
    if saved:  # the tensors and their versions; the op's own output is saved without its graph (_saved_output)
        if len(saved) == 1:
            t = saved[0]
            if t is out:
                saved = (_saved_output(t),)
            versions = (0 if t._vc is None else t._vc[0],)
        elif len(saved) == 2:
            t, u = saved
            if t is out or u is out:
                saved = (_saved_output(t) if t is out else t, _saved_output(u) if u is out else u)
            versions = (0 if t._vc is None else t._vc[0], 0 if u._vc is None else u._vc[0])
        else:
            saved = tuple([_saved_output(t) if t is out else t for t in saved])
            versions = tuple([0 if t._vc is None else t._vc[0] for t in saved])
        if out._backend.defers_elementwise:
            _mark_saved(saved)
    out._grad_fn = Node(backward, edges, name, saved, versions, out._data.dtype)
    out._oi = 0
    out.requires_grad = True
    if STATE.anomaly:
        _check_forward(out, name)
    return out


def _record_multi(outs: list, name: str, inputs: tuple, saved: tuple, backward) -> list:
    """``_record`` for an op with several outputs: one node; ``backward(grads, *saved)`` gets a tuple with one
    gradient per output (``None`` for outputs that got none) and returns one per input."""
    edges = tuple([None if t is None else gradient_edge(t) for t in inputs])
    versions = tuple([0 if t._vc is None else t._vc[0] for t in saved])
    if saved and outs[0]._backend.defers_elementwise:
        _mark_saved(saved)
    node = Node(backward, edges, name, tuple(saved), versions, tuple(o._data.dtype for o in outs), len(outs))
    for i, o in enumerate(outs):
        o._grad_fn, o._oi, o.requires_grad = node, i, True
    return outs


def _mark_saved(saved: tuple) -> None:
    """Tell a lazy backend which values backward will read (``Backend.mark_saved``): it writes them out where
    they are computed instead of recomputing them then."""
    for t in saved:
        t._backend.mark_saved(t._data)


def _saved_output(out: Tensor) -> Tensor:
    """What an op saves of its own output: a graph-free alias sharing the version counter, marked (``_oi == -1``)
    so that under ``create_graph`` the engine hands backward the output *with* this node as its ``grad_fn``
    (PyTorch's saved-output unpacking): ``exp``'s ``g * y`` is then differentiable through ``y``."""
    alias = _alias(out)
    alias._oi = -1
    return alias


def _check_forward(out: Tensor, name: str) -> None:
    bk = out._backend
    if out._data.dtype.kind == "f" and not bool(bk.to_host(
            bk.all(bk.logical_not(bk.isnan(out._data)), tuple(range(out.ndim)), False))):
        raise AnomalyError(f"the forward of {name} produced NaN (detect_anomaly is on)")


def _alias(t: Tensor) -> Tensor:
    """A graph-free alias of ``t`` sharing its version counter (for saving an op's output)."""
    if t._vc is None:
        t._vc = [0]
    a = _wrap(t._data, t._backend)
    a._vc = t._vc
    return a


def _share_version(out: Tensor, base: Tensor) -> Tensor:
    """Let ``out`` share ``base``'s version counter (a tensor over the same storage that is not a view op's
    result, e.g. a detached alias)."""
    if base._vc is None:
        base._vc = [0]
    out._vc = base._vc
    return out


def _make_view(out: Tensor, a: Tensor, fn, *args) -> Tensor:
    """Mark ``out == fn(a, *args)`` as a view of ``a``: it shares the storage and the version counter of ``a``'s
    base, and an in-place op on either side rebases the other's autograd history (PyTorch's view semantics).
    ``fn(x, *args)`` must replay the view on any tensor shaped like ``a``."""
    if a._vc is None:
        a._vc = [0]
    out._vc = vc = a._vc
    parent = a._view
    if parent is None:
        out._view = [a, ((fn, args),), vc[0]]
    else:
        out._view = [parent[0], parent[1] + ((fn, args),), vc[0]]
    return out


def replay_view(t: Tensor, chain) -> Tensor:
    """Apply a view chain (``Tensor._view[1]``) to ``t``."""
    for fn, args in chain:
        t = fn(t, *args)
    return t


def _refresh_view(t: Tensor) -> None:
    """Give a view whose base was modified in place the ``grad_fn`` of a view of the base's new value."""
    view = t._view
    now = t._vc[0]
    if view[2] == now or not STATE.enabled:  # under no_grad nothing records: refresh when recording resumes
        return
    view[2] = now
    base = view[0]
    if base.requires_grad:
        fresh = replay_view(base, view[1])
        t._grad_fn, t._oi, t.requires_grad = fresh._grad_fn, fresh._oi, fresh.requires_grad


def _needs_grad(*tensors) -> bool:
    if not STATE.enabled:
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def _norm_dim(dim: int, ndim: int, where: str) -> int:
    if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
        raise FlowError(f"{where}: dim must be an int, got {type(dim).__name__} {dim!r}")
    dim = dim.__index__()
    if dim < -max(ndim, 1) or dim >= max(ndim, 1):
        raise IndexOutOfRangeError(f"{where}: dim {dim} out of range for a tensor with {ndim} dims "
                        f"(valid: {-max(ndim, 1)} .. {max(ndim, 1) - 1})")
    return dim + ndim if dim < 0 else (0 if ndim == 0 else dim)


def _norm_dims(dim, ndim: int, where: str) -> tuple[int, ...]:
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):  # dim=() reduces everything, as in torch
        return tuple(range(ndim))
    if isinstance(dim, int):
        return (_norm_dim(dim, ndim, where),) if ndim else ()
    dims = tuple(sorted({_norm_dim(d, ndim, where) for d in dim})) if ndim else ()
    return dims


def _same_device(a: Tensor, b: Tensor, where: str) -> None:
    if a._backend is not b._backend:
        raise BackendError(
            f"{where}: tensors on different devices ({a.device} and {b.device}); move one with .to('{a.device}')"
        )
