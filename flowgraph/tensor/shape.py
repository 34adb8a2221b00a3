"""Shape and movement ops: reshape/view, permute, transpose, squeeze, unsqueeze, flatten, expand,
repeat, cat, stack, split, chunk, flip, pad, roll, narrow, movedim; ``clone``, ``contiguous`` and ``to``."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

from ..autograd.grad_mode import STATE
from ..backends.registry import get_backend
from ..errors import BackendError, FlowError, IndexOutOfRangeError, ShapeError
from .dtype import DType, as_dtype
from .elementwise import broadcast_shapes, sum_to
from .tensor import Tensor, _make_view, _norm_dim, _record, _record_multi, _share_version, _wrap


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _infer_shape(shape: tuple, numel: int, old: tuple) -> tuple[int, ...]:
    for s in shape:
        if isinstance(s, bool) or not hasattr(type(s), "__index__"):
            raise FlowError(f"reshape: shape must be ints (one may be -1), got {shape}, whose element {s!r} is a "
                            f"{type(s).__name__}")
    shape = tuple(operator.index(s) for s in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {shape}")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise ShapeError(f"reshape: invalid size {s} in {shape}")
            known *= s
    if -1 in shape:
        if known == 0 or numel % known:
            raise ShapeError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    elif known != numel:
        raise ShapeError(f"reshape: cannot reshape {old} ({numel} elements) into {shape} ({known} elements)")
    return shape


def reshape(a: Tensor, *shape) -> Tensor:
    """Same elements, new shape (one dim may be -1); a view when the layout allows it (a contiguous tensor, or a
    strided one whose merged and split axes are each contiguous, as PyTorch's rule), else a copy."""
    old = a._data.shape
    shape = _shape_arg(shape)
    if shape == old:
        return a
    shape = _infer_shape(shape, a.numel(), old)
    bk = a._backend
    data = bk.reshape_view(a._data, shape)
    if data is not None:  # a view, as PyTorch's: an in-place write through it reaches a
        out = _make_view(_wrap(data, bk), a, reshape, shape)
    else:  # the layout needs a copy: a new tensor, never aliased
        out = _wrap(bk.reshape(bk.contiguous(a._data), shape), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Reshape", (a,), (), _reshape_backward(old))
    return out


@functools.lru_cache(maxsize=1024)
def _permute_backward(inv: tuple):
    """``permute``'s backward through the inverse permutation ``inv``, built once per permutation (see
    ``_reshape_backward``)."""
    return lambda g: (g.permute(inv),)


@functools.lru_cache(maxsize=4096)
def _reshape_backward(old: tuple):
    """``reshape``'s backward to the shape ``old``, built once per shape (a closure made per call is objects
    the cyclic garbage collector tracks for as long as the step's graph lives: see
    ``nn.linear._linear_rows_backward``)."""
    return lambda g: (g.reshape(old),)


view = reshape


def permute(a: Tensor, *dims) -> Tensor:
    """Reorder dimensions (a view)."""
    dims = _shape_arg(dims)
    nd = a.ndim
    if len(dims) != nd:
        raise ShapeError(f"permute: got {len(dims)} dims {dims} for a tensor with {nd} dims")
    dims = tuple(_norm_dim(d, nd, "permute") for d in dims)
    if len(set(dims)) != nd:
        raise ShapeError(f"permute: dims {dims} repeat a dimension")
    bk = a._backend
    out = _make_view(_wrap(bk.permute(a._data, dims), bk), a, permute, dims)
    if a.requires_grad and STATE.enabled:
        inv = [0] * nd
        for i, d in enumerate(dims):
            inv[d] = i
        _record(out, "Permute", (a,), (), _permute_backward(tuple(inv)))
    return out


def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions (a view)."""
    nd = a.ndim
    if nd < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return a
    d0, d1 = _norm_dim(dim0, nd, "transpose"), _norm_dim(dim1, nd, "transpose")
    dims = list(range(nd))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(a, dims)


def t(a: Tensor) -> Tensor:
    """Transpose of a matrix (0-d and 1-d tensors are returned as they are)."""
    if a.ndim > 2:
        raise ShapeError(f"t() expects a tensor with <= 2 dims, got {a.ndim}; use transpose(dim0, dim1)")
    return a if a.ndim < 2 else transpose(a, 0, 1)


def squeeze(a: Tensor, dim=None) -> Tensor:
    """Drop size-1 dimensions (all, or those in ``dim``)."""
    shape = a.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = {_norm_dim(d, len(shape), "squeeze") for d in dims} if shape else set()
        new = tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    return reshape(a, new)


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at ``dim``."""
    nd = a.ndim
    if dim < -(nd + 1) or dim > nd:
        raise IndexOutOfRangeError(f"unsqueeze: dim {dim} out of range for a tensor with {nd} dims "
                                   f"(valid: {-nd - 1} .. {nd})")
    d = dim + nd + 1 if dim < 0 else dim
    shape = a.shape
    return reshape(a, shape[:d] + (1,) + shape[d:])


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dimensions ``start_dim..end_dim`` into one."""
    if a.ndim == 0:
        return reshape(a, (1,))
    s = _norm_dim(start_dim, a.ndim, "flatten")
    e = _norm_dim(end_dim, a.ndim, "flatten")
    shape = a.shape
    n = 1
    for x in shape[s:e + 1]:
        n *= x
    return reshape(a, shape[:s] + (n,) + shape[e + 1:])


def unflatten(a: Tensor, dim: int, sizes) -> Tensor:
    """Split dimension ``dim`` into ``sizes``."""
    d = _norm_dim(dim, a.ndim, "unflatten")
    shape = a.shape
    return reshape(a, shape[:d] + tuple(sizes) + shape[d + 1:])


def expand(a: Tensor, *shape) -> Tensor:
    """Broadcast to ``shape`` without copying (-1 keeps a dimension)."""
    shape = _shape_arg(shape)
    old = a.shape
    lead = len(shape) - len(old)
    if lead < 0:
        raise ShapeError(f"expand: target {shape} has fewer dims than the tensor {old}")
    shape = tuple(old[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(shape))
    if shape == old:
        return a
    for i, s in enumerate(old):
        if s != 1 and s != shape[i + lead]:
            raise ShapeError(f"expand: cannot expand {old} to {shape}: dim {i} has size {s} (must be 1 or equal)")
    bk = a._backend
    out = _make_view(_wrap(bk.expand(a._data, shape), bk), a, expand, shape)
    if a.requires_grad and STATE.enabled:
        _record(out, "Expand", (a,), (), lambda g: (sum_to(g, old),))
    return out


def expand_as(a: Tensor, other: Tensor) -> Tensor:
    """Expand to ``other``'s shape."""
    return expand(a, other.shape)


def broadcast_to(a: Tensor, shape) -> Tensor:
    """Broadcast to ``shape`` (PyTorch's ``broadcast_to``)."""
    return expand(a, tuple(shape))


def broadcast_tensors(*tensors: Tensor) -> list[Tensor]:
    """Expand all tensors to their common broadcast shape."""
    shape = broadcast_shapes(*(t.shape for t in tensors))
    return [expand(t, shape) for t in tensors]


def contiguous(a: Tensor) -> Tensor:
    """A row-major copy when the storage is strided (identity for autograd)."""
    bk = a._backend
    d = bk.contiguous(a._data)
    if d is a._data:
        return a
    out = _wrap(d, bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Contiguous", (a,), (), lambda g: (g,))
    return out


def clone(a: Tensor) -> Tensor:
    """A copy with its own storage (gradient flows through)."""
    bk = a._backend
    d = bk.contiguous(a._data)
    if d is a._data:
        d = bk.add(d, 0) if d.dtype.kind != "b" else bk.logical_or(d, False)
        d = bk.contiguous(d)
    out = _wrap(d, bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Clone", (a,), (), lambda g: (g,))
    return out


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors along an existing dimension (dtypes promoted; empty 1-d tensors are skipped)."""
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)[:1]
    if not tensors:
        raise FlowError("cat: expected a non-empty list of tensors")
    first = tensors[0]
    nd = first.ndim
    if nd == 0:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated; use stack")
    d = _norm_dim(dim, nd, "cat")
    bk, arrays = _join_arrays(tensors, "cat")  # a tensor on another device is named before a shape mismatch
    for i, t in enumerate(tensors):
        if t.ndim != nd or any(t.shape[j] != first.shape[j] for j in range(nd) if j != d):
            raise ShapeError(
                f"cat: tensor {i} has shape {t.shape}, incompatible with tensor 0's {first.shape} "
                f"(all dims but {d} must match)"
            )
    out = _wrap(bk.concatenate(arrays, d), bk)
    if STATE.enabled and any(t.requires_grad for t in tensors):
        shapes = [t.shape for t in tensors]
        _record(out, "Cat", tuple(tensors), (), lambda g: _cut(g, d, shapes, False))
    return out


concat = cat
concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors of one shape along a new dimension (dtypes promoted)."""
    tensors = list(tensors)
    if not tensors:
        raise FlowError("stack: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise FlowError(f"stack: tensors must all be Tensors; element {i} is {type(t).__name__} {t!r:.40}")
    shape = tensors[0].shape
    for i, t in enumerate(tensors):
        if t.shape != shape:
            raise ShapeError(f"stack: tensor {i} has shape {t.shape}, tensor 0 has {shape}; all must match")
    nd = len(shape) + 1
    if dim < -nd or dim >= nd:
        raise FlowError(f"stack: dim {dim} out of range for {nd} output dims")
    d = dim + nd if dim < 0 else dim
    bk, arrays = _join_arrays(tensors, "stack")
    grown = shape[:d] + (1,) + shape[d:]
    out = _wrap(bk.concatenate([bk.reshape(a, grown) for a in arrays], d), bk)
    if STATE.enabled and any(t.requires_grad for t in tensors):
        shapes = [shape] * len(tensors)
        _record(out, "Stack", tuple(tensors), (), lambda g: _cut(g, d, shapes, True))
    return out


def _join_arrays(tensors: list[Tensor], name: str) -> tuple:
    """``(backend, arrays)`` of tensors to be joined: one device (else a BackendError naming both), their
    arrays in the promoted dtype of all of them."""
    first = tensors[0]
    bk = first._backend
    dt = first.dtype
    for i, t in enumerate(tensors):
        if t._backend is not bk:
            raise BackendError(
                f"{name}: tensor {i} is on {t.device}, tensor 0 on {first.device}; move them to one device with .to()"
            )
        if t.dtype is not dt:
            from .dtype import promote_types

            dt = promote_types(dt, t.dtype)
    return bk, [t._data if t.dtype is dt else bk.cast(t._data, dt.np) for t in tensors]


def _cut(g: Tensor, d: int, shapes: list[tuple], squeeze: bool) -> tuple:
    """The backward of ``cat`` (``squeeze`` False) and ``stack`` (True): ``g`` cut along ``d`` into one piece
    per input of ``shapes``, each a view of ``g``. Backend slices and reshapes wrapped directly (one
    ``Backend.slice`` a piece, not a differentiable index with its key parsing: gated_routing's 8-way stack);
    under ``create_graph`` differentiable ``narrow`` / ``reshape`` instead."""
    grads, start = [], 0
    if STATE.enabled:
        for shape in shapes:
            size = 1 if squeeze else shape[d]
            piece = narrow(g, d, start, size)
            grads.append(reshape(piece, shape) if squeeze else piece)
            start += size
        return tuple(grads)
    bk, data = g._backend, g._data
    whole = tuple(slice(0, n, 1) for n in data.shape)
    for shape in shapes:
        size = 1 if squeeze else shape[d]
        piece = bk.slice(data, whole[:d] + (slice(start, start + size, 1),) + whole[d + 1:])
        grads.append(_wrap(bk.reshape(piece, shape) if squeeze else piece, bk))
        start += size
    return tuple(grads)


def narrow(a: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The slice ``start:start+length`` along ``dim`` (a view)."""
    d = _norm_dim(dim, a.ndim, "narrow")
    index = [slice(None)] * a.ndim
    index[d] = slice(start, start + length)
    return a[tuple(index)]


def split(a: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into chunks of ``split_size`` (last may be smaller) or into the given list of sizes."""
    d = _norm_dim(dim, a.ndim, "split")
    n = a.shape[d]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size <= 0:
            raise FlowError(f"split: split_size must be positive, got {size}")
        sizes = [min(size, n - i) for i in range(0, n, size)] or [0]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise ShapeError(f"split: sections {sizes} sum to {sum(sizes)}, but dim {d} has size {n}")
    return tuple(split_views(a, d, sizes))


def split_views(a: Tensor, dim: int, sizes: Sequence[int], squeeze: bool = False) -> list[Tensor]:
    """``a`` cut along ``dim`` into parts of ``sizes`` (each squeezed along ``dim`` when ``squeeze``), as views.

    Autograd: one gathering node owns a gradient buffer of ``a``'s shape; each part's backward writes its
    gradient into its slice of that buffer and passes the gathering node a 0-d token, so L parts cost one
    buffer in backward, not L zero-filled tensors of ``a``'s shape (unbinding a sequence stays O(L)). The
    gathering node was created before the parts, so the engine runs it after all of them. Under
    ``create_graph`` the parts return ordinary differentiable gradients instead.
    """
    nd = a.ndim
    d = dim + nd if dim < 0 else dim
    shape = a.shape
    bk = a._backend
    indices = []
    start = 0
    for size in sizes:
        indices.append(tuple(slice(start, start + size, 1) if i == d else slice(0, n, 1)
                             for i, n in enumerate(shape)))
        start += size
    outs = []
    for index in indices:
        data = bk.slice(a._data, index)
        if squeeze:
            data = bk.reshape(data, data.shape[:d] + data.shape[d + 1:])
        outs.append(_share_version(_wrap(data, bk), a))
    if not (a.requires_grad and STATE.enabled):
        return outs

    def bw(grads: tuple):
        first = next(g for g in grads if g is not None)
        if STATE.enabled:  # create_graph (some pieces' gradients may be constants): a differentiable concatenation
            parts = []
            for g, index in zip(grads, indices):
                part = tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
                if g is None:
                    parts.append(first.new_zeros(part))
                else:
                    parts.append(g.reshape(part))
            return (cat(parts, d),)
        buf = bk.full(shape, 0, first._data.dtype)
        for g, index in zip(grads, indices):
            if g is not None:
                view = bk.slice(buf, index)
                bk.assign(view, bk.reshape(g._data, view.shape) if squeeze else g._data)
        return (_wrap(buf, bk),)

    return _record_multi(outs, "Split", (a,), (), bw)


def chunk(a: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into ``chunks`` nearly equal parts (PyTorch's rule: ceil-sized chunks)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise FlowError(f"chunk: chunks must be an int >= 1, got {chunks!r}")
    d = _norm_dim(dim, a.ndim, "chunk")
    n = a.shape[d]
    size = -(-n // chunks) if n else 1
    return split(a, max(size, 1), d)


def unbind(a: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """Remove ``dim``, returning every slice along it."""
    d = _norm_dim(dim, a.ndim, "unbind")
    return tuple(split_views(a, d, [1] * a.shape[d], squeeze=True))


def flip(a: Tensor, dims) -> Tensor:
    """Reverse the order of elements along ``dims``."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = tuple(sorted({_norm_dim(x, a.ndim, "flip") for x in dims})) if a.ndim else ()  # 0-d: nothing to flip
    bk = a._backend
    out = _wrap(bk.flip(a._data, axes), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Flip", (a,), (), lambda g: (flip(g, axes),))
    return out


def pad(a: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """PyTorch's ``F.pad``: ``pad`` lists (left, right) pairs starting from the last dimension.

    Negative widths crop. Modes: ``constant``, ``reflect``, ``replicate``, ``circular``.
    """
    if len(pad) % 2 or len(pad) // 2 > a.ndim:
        raise ShapeError(f"pad: expected an even number of widths covering at most {a.ndim} dims, got {pad}")
    widths = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if mode != "constant":
        return _pad_indexed(a, widths, mode)
    crop = tuple(slice(max(-lo, 0), a.shape[i] - max(-hi, 0)) for i, (lo, hi) in enumerate(widths))
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        a = a[crop]
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    bk = a._backend
    out = _wrap(bk.pad(a._data, widths, value), bk)
    if a.requires_grad and STATE.enabled:
        index = tuple(slice(lo, lo + s) for (lo, _), s in zip(widths, a.shape))
        _record(out, "Pad", (a,), (), lambda g: (g[index],))
    return out


def _pad_indexed(a: Tensor, widths, mode: str) -> Tensor:
    from .creation import arange

    out = a
    for d, (lo, hi) in enumerate(widths):
        if lo == 0 and hi == 0:
            continue
        n = out.shape[d]
        idx = arange(-lo, n + hi, device=a.device)
        if mode == "reflect":
            if lo >= n or hi >= n:
                raise ShapeError(f"pad: reflect padding ({lo}, {hi}) must be smaller than the dim size {n}")
            period = 2 * (n - 1) if n > 1 else 1
            idx = idx % period
            idx = (idx >= n).to(idx.dtype) * (period - idx) + (idx < n).to(idx.dtype) * idx
        elif mode == "replicate":
            idx = idx.clamp(0, n - 1)
        elif mode == "circular":
            idx = idx % n
        else:
            raise FlowError(f"pad: unknown mode {mode!r}; use constant, reflect, replicate or circular")
        out = out.index_select(d, idx)
    return out


def roll(a: Tensor, shifts, dims=None) -> Tensor:
    """Rotate elements along ``dims`` by ``shifts`` (flattened when ``dims`` is None)."""
    if dims is None:
        return roll(a.reshape(-1), shifts, 0).reshape(a.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = a
    for s, d in zip(shifts, dims):
        d = _norm_dim(d, a.ndim, "roll")
        n = a.shape[d]
        if n == 0:
            continue
        s %= n
        if s:
            out = cat([narrow(out, d, n - s, s), narrow(out, d, 0, n - s)], d)
    return out


def movedim(a: Tensor, source, destination) -> Tensor:
    """Move dimensions from ``source`` positions to ``destination`` positions."""
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    nd = a.ndim
    src = [_norm_dim(s, nd, "movedim") for s in src]
    dst = [_norm_dim(s, nd, "movedim") for s in dst]
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(a, order)


def repeat(a: Tensor, *sizes) -> Tensor:
    """Tile the tensor ``sizes`` times along each dimension (PyTorch's ``repeat``)."""
    sizes = _shape_arg(sizes)
    if len(sizes) < a.ndim:
        raise ShapeError(f"repeat: got {len(sizes)} repeat counts for a tensor with {a.ndim} dims")
    x = a.reshape((1,) * (len(sizes) - a.ndim) + a.shape)
    shape = x.shape
    inter = []
    for r, s in zip(sizes, shape):
        inter += [r, s]
    x = x.reshape(tuple(v for s in shape for v in (1, s))).expand(tuple(inter))
    return x.reshape(tuple(r * s for r, s in zip(sizes, shape)))


def repeat_interleave(a: Tensor, repeats: int, dim: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``dim`` (flattened when None)."""
    if dim is None:
        a, dim = a.reshape(-1), 0
    d = _norm_dim(dim, a.ndim, "repeat_interleave")
    x = unsqueeze(a, d + 1)
    shape = list(x.shape)
    shape[d + 1] = repeats
    x = x.expand(tuple(shape))
    return flatten(x, d, d + 1)


def to(a: Tensor, *args, **kwargs) -> Tensor:
    """Move and/or cast: ``to("cuda")``, ``to(fg.float64)``, ``to("cuda", fg.float16)``, ``to(other)``."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    copy = kwargs.pop("copy", False)
    if kwargs:
        raise FlowError(f"to(): unexpected arguments {sorted(kwargs)}")
    for arg in args:
        if isinstance(arg, Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, DType) or (not isinstance(arg, str) and arg is not None
                                         and not hasattr(arg, "device") and not _is_device_object(arg)):
            dtype = arg
        else:
            device = arg
    out = a
    if device is not None:
        out = _to_device(out, device)
    if dtype is not None:
        out = _cast(out, as_dtype(dtype))
    if copy and out is a:
        out = clone(a)
    return out


def _is_device_object(arg) -> bool:
    """A device object of another framework (``torch.device``: ``.type`` a string, ``.index``): its ``str`` is the
    device spec flowgraph parses."""
    return isinstance(getattr(arg, "type", None), str) and hasattr(arg, "index")


def _to_device(a: Tensor, device) -> Tensor:
    target = get_backend(device)
    src = a._backend
    if target is src:
        return a
    host = src.to_host(a._data)
    if host.dtype.name == "float64" and not target.supports_float64:
        raise BackendError(
            f"to({target.device!r}): the device does not support float64; cast first with .to(fg.float32)"
        )
    out = _wrap(target.from_host(host), target)
    if a.requires_grad and STATE.enabled:
        src_device = src.device
        _record(out, "ToDevice", (a,), (), lambda g: (_to_device(g, src_device),))
    return out


def _cast(a: Tensor, dtype: DType) -> Tensor:
    bk = a._backend
    if a._data.dtype == dtype.np:
        return a
    out = _wrap(bk.cast(a._data, dtype.np), bk)
    if a.requires_grad and STATE.enabled and dtype.is_floating_point:
        src = a.dtype
        _record(out, "Cast", (a,), (), lambda g: (_cast(g, src),))
    return out
