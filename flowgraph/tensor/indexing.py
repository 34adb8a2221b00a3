"""Indexing: ``__getitem__``/``__setitem__`` (basic and advanced), gather, scatter, scatter_add,
index_select, masked_fill, take_along_dim, nonzero; and the in-place machinery with version checks.

Basic indexing (ints, slices, None, Ellipsis) becomes backend views; advanced indexing (integer or bool
tensors, lists) is lowered to one ``gather`` on a flattened view, so every backend supports it with the
same two primitives, and its gradient is the matching ``scatter_add``.
"""

from __future__ import annotations

import numpy as np

from ..autograd.grad_mode import STATE, no_grad
from ..autograd.node import Node, next_seq
from ..errors import FlowError, IndexOutOfRangeError, ShapeError
from .dtype import as_dtype
from .tensor import (
    Tensor,
    _make_view,
    _norm_dim,
    _record,
    _wrap,
    check_index_range,
    gradient_edge,
    replay_view,
)

_INT64 = np.dtype(np.int64)
_PLAIN = (int, type(None))


def _as_index_tensor(value, like: Tensor) -> Tensor:
    from .creation import tensor

    if isinstance(value, Tensor):
        if value._data.dtype.kind not in "biu":
            raise FlowError(f"index: tensors used as indices must be integer or bool, got {value.dtype}")
        if value._backend is not like._backend:
            value = value.to(like.device)
        return value
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise FlowError(f"index: {_short(value)} (a {type(value).__name__}) is not a valid index; use ints, slices, "
                        "None, ..., or integer or bool tensors, lists or arrays")
    try:
        arr = np.asarray(value)
    except ValueError as exc:
        raise FlowError(f"index: the list {_short(value)} is ragged ({exc})") from None
    if arr.dtype.kind not in "biu":
        raise FlowError(f"index: lists and arrays used as indices must hold integers or bools; {_short(value)} "
                        f"has dtype {arr.dtype}")
    return tensor(arr if arr.dtype.kind == "b" else arr.astype(np.int64), device=like._backend)


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _normalise_key(a: Tensor, key):
    """Expand the key into (items, n_dims_consumed); bool masks become integer index tensors."""
    if not isinstance(key, tuple):
        key = (key,)
    items = []
    for k in key:
        if isinstance(k, slice):
            for bound in (k.start, k.stop, k.step):
                if bound is not None and (isinstance(bound, bool) or not hasattr(type(bound), "__index__")):
                    raise FlowError(f"index: slice bounds must be ints or None, got {k} ({bound!r} is a "
                                    f"{type(bound).__name__})")
            if k.step == 0:
                raise FlowError(f"index: slice step cannot be zero ({k}); use a step >= 1, or < 0 to go "
                                "backwards")
        if k is None or k is Ellipsis or isinstance(k, slice):
            items.append(k)
        elif isinstance(k, (bool, np.bool_)):
            raise FlowError("index: a bare Python bool is not a supported index; use a bool tensor mask")
        elif isinstance(k, (int, np.integer)):
            items.append(int(k))
        else:
            t = _as_index_tensor(k, a)
            if t._data.dtype.kind == "b":
                items.append(("mask", t))
            elif t.ndim == 0 and not isinstance(k, (list, np.ndarray)) and isinstance(k, Tensor):
                items.append(("adv", t))
            else:
                items.append(("adv", t.to(as_dtype("int64")) if t._data.dtype != _INT64 else t))
    consumed = sum(
        (k[1].ndim if k[0] == "mask" else 1) if isinstance(k, tuple)
        else (0 if k is None or k is Ellipsis else 1)
        for k in items
    )
    if consumed > a.ndim:
        raise IndexOutOfRangeError(f"index: too many indices ({consumed}) for a tensor with {a.ndim} dims")
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise FlowError("index: an index can only have a single ellipsis ('...')")
    out = []
    for k in items:
        if k is Ellipsis:
            out.extend([slice(None)] * (a.ndim - consumed))
        elif isinstance(k, tuple) and k[0] == "mask":
            mask = k[1]
            pos = len([x for x in out if x is not None])
            expected = a.shape[pos:pos + mask.ndim]
            if mask.shape != expected:
                raise ShapeError(f"index: bool mask of shape {mask.shape} does not match the indexed dims {expected}")
            out.extend(("adv", idx) for idx in nonzero(mask, as_tuple=True))
        else:
            out.append(k)
    while len([x for x in out if x is not None]) < a.ndim:
        out.append(slice(None))
    return out


def getitem(a: Tensor, key) -> Tensor:
    """``a[key]`` with NumPy/PyTorch semantics."""
    if type(key) is slice and key.step is None and a.ndim and type(key.start) in _PLAIN \
            and type(key.stop) in _PLAIN:  # fast path: a[i:j]
        shape = a.shape
        start, stop, _ = key.indices(shape[0])
        stop = max(start, stop)
        rest = tuple(slice(0, n, 1) for n in shape[1:])
        return _basic(a, (slice(start, stop, 1),) + rest, (), (), (stop - start,) + shape[1:])
    items = _normalise_key(a, key)
    shape = a.shape
    slices, flips, squeeze_dims, final_shape = [], [], [], []
    adv_positions, adv_tensors = [], []
    dim = 0
    for k in items:
        if k is None:
            final_shape.append(1)
            continue
        n = shape[dim]
        if isinstance(k, int):
            i = k + n if k < 0 else k
            if not 0 <= i < n:
                raise IndexOutOfRangeError(f"index {k} is out of bounds for dimension {dim} with size {n} "
                                           f"(valid: {-n} .. {n - 1})")
            slices.append(slice(i, i + 1, 1))
            squeeze_dims.append(dim)
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step == 0:
                raise FlowError("index: slice step cannot be zero")
            m = len(range(start, stop, step))
            if step > 0:
                slices.append(slice(start, start + (m - 1) * step + 1 if m else start, step))
            elif m == 0:
                slices.append(slice(0, 0, 1))
            else:
                last = start + (m - 1) * step
                slices.append(slice(last, start + 1, -step))
                flips.append(dim)
            final_shape.append(m)
        else:
            slices.append(slice(0, n, 1))
            adv_positions.append(len(final_shape))
            adv_tensors.append(k[1])
            final_shape.append(n)
        dim += 1
    out = _basic(a, tuple(slices), tuple(flips), tuple(squeeze_dims), tuple(final_shape))
    if adv_tensors:
        out = _advanced(out, adv_positions, adv_tensors)
    return out


def _basic(a: Tensor, slices, flips, squeeze_dims, final_shape) -> Tensor:
    bk = a._backend
    shape = a.shape
    full = all(s.start == 0 and s.stop == n and s.step == 1 for s, n in zip(slices, shape))
    data = a._data if full else bk.slice(a._data, slices)
    if flips:
        data = bk.contiguous(bk.flip(data, flips))  # a copy on every backend: reversed order is no view here
    if data.shape != final_shape:
        data = bk.reshape(data, final_shape)
    if data is a._data:
        return a
    out = _wrap(data, bk)
    if not flips:
        _make_view(out, a, _basic, slices, flips, squeeze_dims, final_shape)
    if a.requires_grad and STATE.enabled:
        sliced_shape = tuple(len(range(s.start, s.stop, s.step)) for s in slices)

        def bw(g):
            g = g.reshape(sliced_shape)
            if flips:
                g = g.flip(flips)
            return (_slice_backward(g, shape, slices),)

        _record(out, "Slice", (a,), (), bw)
    return out


def _slice_backward(g: Tensor, shape, slices) -> Tensor:
    """Zeros of ``shape`` with ``g`` written at ``slices`` (differentiable: its backward slices again)."""
    bk = g._backend
    base = bk.full(shape, 0, g._data.dtype)
    view = bk.slice(base, slices)
    bk.assign(view, g._data)
    out = _wrap(base, bk)
    if g.requires_grad and STATE.enabled:
        g_shape = g.shape
        _record(out, "SliceBackward", (g,), (),
                lambda gg: (_wrap(bk.slice(gg._data, slices), bk) if not gg.requires_grad
                            else _basic(gg, slices, (), (), g_shape),))
    return out


def _advanced(x: Tensor, positions: list[int], indices: list[Tensor]) -> Tensor:
    from .shape import broadcast_tensors

    idx = broadcast_tensors(*indices) if len(indices) > 1 else indices
    bshape = idx[0].shape
    sizes = [x.shape[p] for p in positions]
    for p, n, i in zip(positions, sizes, idx):
        check_index_range(i, -n, n, f"indexing dimension {p} (size {n})")
    flat = None
    stride = 1
    for n, i in zip(reversed(sizes), reversed(idx)):
        i = (i < 0).to(i.dtype) * n + i
        term = i * stride if stride != 1 else i
        flat = term if flat is None else flat + term
        stride *= n
    rest = [d for d in range(x.ndim) if d not in positions]
    moved = x.permute(positions + rest) if positions + rest != list(range(x.ndim)) else x
    rest_shape = tuple(x.shape[d] for d in rest)
    table = moved.reshape((stride,) + rest_shape)
    picked = index_select(table, 0, flat.reshape(-1))
    out = picked.reshape(bshape + rest_shape)
    contiguous = positions == list(range(positions[0], positions[0] + len(positions)))
    if contiguous and positions[0] > 0 and bshape:
        nb = len(bshape)
        order = list(range(nb, nb + positions[0])) + list(range(nb)) + list(range(nb + positions[0], out.ndim))
        out = out.permute(order)
    return out


def gather(a: Tensor, dim: int, index: Tensor) -> Tensor:
    """``out[i][j] = a[i][index[i][j]]`` along ``dim`` (PyTorch's gather; index may be smaller than a)."""
    d = _norm_dim(dim, a.ndim, "gather")
    index = _as_index_tensor(index, a)
    if index.ndim != a.ndim:
        raise ShapeError(f"gather: index has {index.ndim} dims, input has {a.ndim}; they must match")
    src = a
    if any(index.shape[i] != a.shape[i] for i in range(a.ndim) if i != d):
        sl = tuple(slice(0, index.shape[i]) if i != d else slice(None) for i in range(a.ndim))
        src = a[sl]
    bk = a._backend
    if a.ndim:
        check_index_range(index, -a.shape[d], a.shape[d], f"gather along dim {d} (size {a.shape[d]})")
    idx = index._data if index._data.dtype == _INT64 else bk.cast(index._data, _INT64)
    out = _wrap(bk.gather(src._data, d, idx), bk) if a.ndim else _wrap(src._data, bk)
    if src.requires_grad and STATE.enabled:
        shape = src.shape
        _record(out, "Gather", (src,), (index,), lambda g, index: (scatter_add(g.new_zeros(shape), d, index, g),))
    return out


def take_along_dim(a: Tensor, indices: Tensor, dim: int) -> Tensor:
    """NumPy's ``take_along_axis`` (indices broadcast against the input)."""
    d = _norm_dim(dim, a.ndim, "take_along_dim")
    shape = list(a.shape)
    shape[d] = indices.shape[d]
    from .elementwise import broadcast_shapes

    target = broadcast_shapes(tuple(shape), indices.shape)
    a_shape = list(target)
    a_shape[d] = a.shape[d]
    return gather(a.expand(tuple(a_shape)), d, indices.expand(target))


def scatter_add(a: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``a`` with ``src`` added at ``index`` along ``dim`` (duplicates accumulate)."""
    d = _norm_dim(dim, a.ndim, "scatter_add")
    index = _as_index_tensor(index, a)
    check_index_range(index, -a.shape[d], a.shape[d], f"scatter_add along dim {d} (size {a.shape[d]})")
    bk = a._backend
    src_data = src._data
    if src.shape != index.shape:
        sl = tuple(slice(0, n) for n in index.shape)
        src_data = src[sl]._data
    if src_data.dtype != a._data.dtype:
        src_data = bk.cast(src_data, a._data.dtype)
    out = _wrap(bk.scatter_add(a._data, d, index._data, src_data), bk)
    if STATE.enabled and (a.requires_grad or src.requires_grad):
        src_shape = src.shape

        def bw(g, index):
            gs = gather(g, d, index)
            if gs.shape != src_shape:
                gs = _slice_backward(gs, src_shape, tuple(slice(0, n, 1) for n in index.shape))
            return (g, gs)

        _record(out, "ScatterAdd", (a, src), (index,), bw)
    return out


def scatter(a: Tensor, dim: int, index: Tensor, src) -> Tensor:
    """A copy of ``a`` with ``src`` (a tensor or scalar) written at ``index`` along ``dim``."""
    d = _norm_dim(dim, a.ndim, "scatter")
    index = _as_index_tensor(index, a)
    check_index_range(index, -a.shape[d], a.shape[d], f"scatter along dim {d} (size {a.shape[d]})")
    bk = a._backend
    if not isinstance(src, Tensor):
        src = a.new_full(index.shape, src)
    src_data = src._data if src.shape == index.shape else src[tuple(slice(0, n) for n in index.shape)]._data
    if src_data.dtype != a._data.dtype:
        src_data = bk.cast(src_data, a._data.dtype)
    out = _wrap(bk.scatter(a._data, d, index._data, src_data), bk)
    if STATE.enabled and (a.requires_grad or src.requires_grad):
        src_shape = src.shape

        def bw(g, index):
            ga = scatter(g, d, index, 0.0)
            gs = gather(g, d, index)
            if gs.shape != src_shape:
                gs = _slice_backward(gs, src_shape, tuple(slice(0, n, 1) for n in index.shape))
            return (ga, gs)

        _record(out, "Scatter", (a, src), (index,), bw)
    return out


def index_select(a: Tensor, dim: int, index: Tensor) -> Tensor:
    """Rows (along ``dim``) picked by a 1-d integer ``index``."""
    d = _norm_dim(dim, a.ndim, "index_select")
    index = _as_index_tensor(index, a)
    if index.ndim > 1:
        raise ShapeError(f"index_select: index must be 1-d, got shape {index.shape}")
    index = index.reshape(-1)
    view = [1] * a.ndim
    view[d] = index.shape[0]
    shape = list(a.shape)
    shape[d] = index.shape[0]
    return gather(a, d, index.reshape(tuple(view)).expand(tuple(shape)))


def index_add(a: Tensor, dim: int, index: Tensor, source: Tensor, alpha: float = 1) -> Tensor:
    """A copy of ``a`` with rows of ``source`` added at positions ``index`` along ``dim``."""
    d = _norm_dim(dim, a.ndim, "index_add")
    index = _as_index_tensor(index, a).reshape(-1)
    view = [1] * a.ndim
    view[d] = index.shape[0]
    return scatter_add(a, d, index.reshape(tuple(view)).expand(source.shape), source * alpha if alpha != 1 else source)


def masked_fill(a: Tensor, mask: Tensor, value) -> Tensor:
    """``value`` where ``mask`` is true, else ``a`` (mask broadcasts)."""
    from .elementwise import where

    if isinstance(value, Tensor) and value.ndim == 0 and not value.requires_grad:
        value = value.item()
    return where(mask, value, a)


def masked_select(a: Tensor, mask: Tensor) -> Tensor:
    """The elements where ``mask`` is true, as a 1-d tensor."""
    from .shape import broadcast_tensors

    a, mask = broadcast_tensors(a, mask)
    return a[mask]


def nonzero(a: Tensor, as_tuple: bool = False):
    """Indices of nonzero elements: an ``(n, ndim)`` int64 tensor, or a tuple of 1-d tensors."""
    from .creation import tensor

    host = a._backend.to_host(a._data)
    idx = np.nonzero(host) if host.ndim else np.nonzero(host.reshape(1))
    if as_tuple:
        return tuple(tensor(i.astype(np.int64), device=a._backend) for i in idx)
    return tensor(np.stack(idx, axis=1).astype(np.int64) if idx else np.zeros((0, 0), np.int64),
                  device=a._backend)


# ---------------------------------------------------------------------- in-place machinery
def _leaf_check(a: Tensor, op: str) -> None:
    if not STATE.enabled:
        return
    if a.requires_grad and a._grad_fn is None and a._view is None:
        raise FlowError(
            f"{op}: in-place operation on a leaf tensor that requires grad (a parameter?); "
            "wrap it in `with fg.no_grad():` (as optimizers do) or use the out-of-place op"
        )
    view = a._view
    if view is not None and view[0].requires_grad and view[0]._grad_fn is None:
        raise FlowError(
            f"{op}: a view of a leaf tensor that requires grad is used in an in-place operation (it would change "
            "the leaf behind autograd's back); wrap it in `with fg.no_grad():` or work on a .clone()"
        )
    data = a._data
    strides = getattr(data, "strides", None)
    if strides is not None and any(st == 0 and n > 1 for st, n in zip(strides, data.shape)):
        raise FlowError(
            f"{op}: in-place operation on an expanded tensor (several of its elements share one memory location); "
            "call .clone() or .contiguous() first"
        )


#: Ops whose outputs are several views of one input: in-place on those outputs is refused, as in PyTorch.
_MULTI_VIEW_OPS = frozenset({"Split"})


def _identity_node(new: Tensor) -> Tensor:
    """``new`` itself when it has a grad_fn, else an identity op over it (an in-place result is never a leaf)."""
    if new._grad_fn is not None or not new.requires_grad:
        return new
    out = _wrap(new._data, new._backend)
    return _record(out, "Identity", (new,), (), _pass_grad)


def _pass_grad(g):
    return (g,)


def _copy_slices_backward(g, mask, *, chain):
    """CopySlices: the base's old value gets the gradient outside the written view, the written value inside it."""
    from .elementwise import where

    return (where(mask, 0.0, g), replay_view(g, chain))


def apply_inplace(a: Tensor, compute, op: str, *others) -> Tensor:
    """Run ``compute(a_snapshot)`` and write its result into ``a``'s storage, rebasing autograd (PyTorch's rules).

    The op records against ``a``'s current history; afterwards ``a`` has the op as its ``grad_fn``. When ``a`` is a
    view, its base is rebased instead (a ``CopySlices`` node: the old base outside the view, the new values inside
    it) and ``a`` becomes a view of the new base; other views of that base pick up the new history when next used.
    Tensors saved for backward notice through the shared version counter.
    """
    view = a._view
    if view is not None:
        from .tensor import _refresh_view

        _refresh_view(a)
    _leaf_check(a, op)
    records = STATE.enabled and (a.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in others))
    source = a if view is None else view[0]  # a view of a split piece counts as that piece (as in PyTorch)
    if records and source._grad_fn is not None and source._grad_fn.name in _MULTI_VIEW_OPS:
        again = "" if view is None else " (here through a view of it)"
        raise FlowError(
            f"{op}: output {source._oi} of {source._grad_fn.name} is a view and is being modified in place{again}; the "
            "outputs of an op that returns several views (split, chunk, unbind) cannot be (as in PyTorch): .clone() it "
            "first"
        )
    if records:
        if a._vc is None:
            a._vc = [0]
        old = _wrap(a._data, a._backend)
        old._grad_fn, old._oi, old.requires_grad = a._grad_fn, a._oi, a.requires_grad
        old._acc = a._acc
        old._vc = a._vc
        first = next_seq()
        new = compute(old)
        _keep_saved_values(new, old, first)
    else:
        with no_grad():
            new = compute(a)
    nd = new._data
    if nd.dtype != a._data.dtype:
        nd = a._backend.cast(nd, a._data.dtype)
    if new.shape != a.shape:
        raise ShapeError(f"{op}: the result has shape {new.shape}, which cannot be written into shape {a.shape}")
    a._data = a._backend.assign(a._data, nd)
    if records:
        new = _identity_node(new)
        if view is None:
            if a._grad_fn is not None and a._grad_fn.retain and a._oi in a._grad_fn.retain:
                new._grad_fn.retain = {0: a._grad_fn.retain.pop(a._oi)}
            a._grad_fn, a._oi, a.requires_grad = new._grad_fn, new._oi, new.requires_grad
        else:
            _rebase_base(a, view, new)
    a._bump_version()
    if view is not None:
        view[2] = a._vc[0]
    if records:
        _saved_outputs_are_the_target(a, new._data, first)
    return a


def _nodes_since(t: Tensor, first: int) -> list[Node]:
    """The nodes recorded since sequence number ``first`` that ``t``'s gradient flows through."""
    fn = t._grad_fn
    if fn is None or fn.seq < first:
        return []
    found, stack = {fn}, [fn]
    while stack:
        for e in stack.pop().edges:
            m = e[0] if type(e) is tuple else e
            if m is not None and m.seq >= first and m not in found:
                found.add(m)
                stack.append(m)
    return list(found)


def _keep_saved_values(new: Tensor, old: Tensor, first: int) -> None:
    """An in-place op whose backward needs the overwritten values (``y.mul_(w)`` needs y for w's gradient) saves
    a copy of them, as PyTorch saves ``original_self``: the snapshot's storage is about to be overwritten."""
    copy = None
    for node in _nodes_since(new, first):
        if any(t is old for t in node.saved):
            if copy is None:
                copy = _wrap(old._backend.contiguous(old._backend.add(old._data, 0)), old._backend)
                copy._grad_fn, copy._oi, copy.requires_grad, copy._acc = old._grad_fn, old._oi, old.requires_grad, \
                    old._acc
            node.versions = tuple([0 if t is old else v for t, v in zip(node.saved, node.versions)])
            node.saved = tuple([copy if t is old else t for t in node.saved])


def _saved_outputs_are_the_target(a: Tensor, data, first: int) -> None:
    """An op that saved its own output saved, for an in-place op, the modified tensor itself: a later in-place
    change to it must make backward raise, as in PyTorch (``relu_(relu_(y))``)."""
    version = a._vc[0]
    for node in _nodes_since(a, first) if a._view is None else _nodes_since(a._view[0], first):
        if any(t._data is data and t is not a for t in node.saved):
            node.versions = tuple([version if t._data is data else v for t, v in zip(node.saved, node.versions)])
            node.saved = tuple([_alias_of(a) if t._data is data else t for t in node.saved])


def _alias_of(a: Tensor) -> Tensor:
    out = _wrap(a._data, a._backend)
    out._vc = a._vc
    return out


def _rebase_base(a: Tensor, view, new: Tensor) -> None:
    """After writing ``new`` into the view ``a``: the base's grad_fn becomes CopySlices, ``a`` a view of it."""
    base, chain = view[0], view[1]
    bk = base._backend
    mask = _wrap(bk.full(base.shape, False, np.dtype(bool)), bk)
    with no_grad():
        region = replay_view(mask, chain)
    bk.assign(region._data, True)
    edges = (gradient_edge(base), gradient_edge(new))
    node = Node(lambda g, m: _copy_slices_backward(g, m, chain=chain), edges, "CopySlices", (mask,), (0,),
                base._data.dtype)
    base._grad_fn, base._oi, base.requires_grad = node, 0, True
    fresh = replay_view(base, chain)
    a._grad_fn, a._oi, a.requires_grad = fresh._grad_fn, fresh._oi, True


def setitem(a: Tensor, key, value) -> None:
    """``a[key] = value`` (value broadcasts to the indexed shape)."""
    from .creation import arange

    if not isinstance(value, Tensor):
        if not isinstance(value, (int, float, np.number, np.bool_, list, tuple, np.ndarray)):
            raise FlowError(f"__setitem__: value must be a number, a list or array of numbers or a Tensor; "
                            f"got {type(value).__name__} {_short(value)}")
        value = a.new_full((), value) if not isinstance(value, (list, tuple, np.ndarray)) \
            else _as_float_like(value, a)
    if STATE.enabled and (a.requires_grad or value.requires_grad) and _is_basic(key):
        target = a[key]
        if target._view is not None:  # a real view: write through it (CopySlices rebases a's history)
            target.copy_(value)
            return
    if not (STATE.enabled and (a.requires_grad or value.requires_grad)) and _is_basic(key):
        _leaf_check(a, "__setitem__")
        bk = a._backend
        with no_grad():
            view = a[key]
        _check_value_shape(value, view.shape)
        if view._data is a._data:
            a._data = bk.assign(a._data, bk.cast(value._data, a._data.dtype))
        else:
            target = bk.expand(bk.cast(value._data, a._data.dtype), view.shape) if value.shape != view.shape \
                else bk.cast(value._data, a._data.dtype)
            if not _writes_through(bk, a, key, target):
                raise FlowError("__setitem__: this index produced a copy, not a view; internal error")
        a._bump_version()
        return
    with no_grad():
        positions = arange(a.numel(), device=a.device).reshape(a.shape)[key]
    _check_value_shape(value, positions.shape)

    def compute(old: Tensor) -> Tensor:
        v = value if value.dtype is old.dtype else value.to(old.dtype)
        v = v.expand(positions.shape) if v.shape != positions.shape else v
        flat = scatter(old.reshape(-1), 0, positions.reshape(-1), v.reshape(-1))
        return flat.reshape(old.shape)

    apply_inplace(a, compute, "__setitem__", value)


def _check_value_shape(value: Tensor, shape: tuple) -> None:
    """The value of ``a[key] = value`` must broadcast to the indexed shape (NumPy's error would name neither)."""
    try:
        fits = np.broadcast_shapes(tuple(value.shape), tuple(shape)) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(f"__setitem__: value of shape {tuple(value.shape)} cannot be broadcast to the indexed "
                         f"shape {tuple(shape)}; pass a value of shape {tuple(shape)} or one that broadcasts to it")


def _writes_through(bk, a: Tensor, key, src) -> bool:
    """Write ``src`` into the view ``a[key]`` of ``a``'s storage; False if the backend copied."""
    items = _normalise_key(a, key)
    slices, flips, dim = [], [], 0
    for k in items:
        if k is None:
            continue
        n = a.shape[dim]
        if isinstance(k, int):
            i = k + n if k < 0 else k
            slices.append(slice(i, i + 1, 1))
        else:
            start, stop, step = k.indices(n)
            m = len(range(start, stop, step))
            if step > 0:
                slices.append(slice(start, start + (m - 1) * step + 1 if m else start, step))
            elif m == 0:
                slices.append(slice(0, 0, 1))
            else:
                slices.append(slice(start + (m - 1) * step, start + 1, -step))
                flips.append(dim)
        dim += 1
    view = bk.slice(a._data, tuple(slices))
    if src.shape != view.shape:
        src = bk.reshape(bk.contiguous(src), view.shape)
    if flips:
        src = bk.flip(src, flips)
    written = bk.assign(view, src)
    return written is view


def _is_basic(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        if not (k is None or k is Ellipsis or isinstance(k, (slice, int, np.integer))) or isinstance(k, bool):
            return False
    return True


def _as_float_like(value, a: Tensor) -> Tensor:
    from .creation import tensor

    return tensor(np.asarray(value), dtype=a.dtype, device=a._backend)

