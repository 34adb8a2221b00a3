"""Pooling: ``MaxPool1d/2d/3d``, ``AvgPool1d/2d/3d``, ``AdaptiveAvgPool1d/2d/3d``,
``AdaptiveMaxPool1d/2d/3d``.

Fixed-window pooling uses convolution's window geometry (``conv._offset_slices``): after padding (with
``-inf`` for max, zeros for average) it reduces the ``K = prod(kernel)`` strided slices of the input one by
one, so the ``(N, C, K, *out)`` window stack is never built. Max pooling keeps the first maximum of each
window (and propagates NaN), so its gradient goes to one element as in PyTorch; the backward adds each
slice's share into a zero buffer (the adjoint, ``conv._fold_windows``'s loop).
Adaptive pooling works one spatial dim at a time: average pooling is a product with a constant ``(out, in)``
averaging matrix, max pooling gathers each output's (padded-to-equal-length) index range and reduces it.
"""

from __future__ import annotations

import functools
import itertools
import math

from ..autograd.grad_mode import STATE, no_grad
from ..errors import FlowError
from ..tensor import Tensor, arange, ones, tensor, where
from ..tensor.tensor import _record, _wrap
from .conv import _check_input, _fold_windows, _ntuple, _offset_slices, _pad_spatial
from .module import Module

__all__ = [
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "LPPool1d", "LPPool2d", "LPPool3d",
]  # fmt: skip
__functional__ = [
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "max_unpool1d", "max_unpool2d",
    "max_unpool3d", "lp_pool1d", "lp_pool2d", "lp_pool3d",
]  # fmt: skip


# ---------------------------------------------------------------------- geometry
def _pool_geometry(in_size, kernel, stride, padding, dilation, ceil_mode: bool, where: str):
    """Output sizes and per-dim (left, right) padding (right widened for ``ceil_mode``'s last window)."""
    out, widths = [], []
    for n, k, s, p, d in zip(in_size, kernel, stride, padding, dilation):
        if p < 0 or 2 * p > k:
            raise FlowError(f"{where}: padding ({p}) must be at least 0 and at most half of the kernel size ({k})")
        if s < 1 or d < 1:
            raise FlowError(f"{where}: stride ({s}) and dilation ({d}) must be positive")
        span = n + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise FlowError(
                f"{where}: input of spatial size {tuple(in_size)} is smaller than the window "
                f"(kernel {tuple(kernel)}, dilation {tuple(dilation)}, padding {tuple(padding)})"
            )
        if ceil_mode:
            o = -(-span // s) + 1
            if (o - 1) * s >= n + p:  # the last window must start inside the input or the left padding
                o -= 1
        else:
            o = span // s + 1
        need = (o - 1) * s + d * (k - 1) + 1
        out.append(o)
        widths.append((p, p + max(0, need - (n + 2 * p))))
    return tuple(out), widths


def _pool_args(kernel_size, stride, padding, dilation, nd: int, where: str):
    kernel = _ntuple(kernel_size, nd, "kernel_size", where)
    stride = kernel if stride is None or stride == [] or stride == () else _ntuple(stride, nd, "stride", where)
    return kernel, stride, _ntuple(padding, nd, "padding", where), _ntuple(dilation, nd, "dilation", where)


# ---------------------------------------------------------------------- window reductions
def _offsets(kernel: tuple) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(k) for k in kernel)))


def _window_sum(x: Tensor, kernel: tuple, stride: tuple, dilation: tuple, out: tuple) -> Tensor:
    """Sum of each window of a padded ``(N, C, *S)`` input: ``(N, C, *out)``."""
    bk = x._backend
    d = x._data
    slices = [bk.slice(d, _offset_slices(off, stride, dilation, out)) for off in _offsets(kernel)]
    total = bk.add(slices[0], 0) if len(slices) == 1 else bk.add(slices[0], slices[1])
    for piece in slices[2:]:
        total = bk.add(total, piece)
    result = _wrap(total, bk)
    if x.requires_grad and STATE.enabled:
        shape = x.shape
        k = len(slices)

        def bw(g: Tensor):  # every window element receives its window's gradient
            spread = g.unsqueeze(2).expand(g.shape[:2] + (k,) + g.shape[2:])
            return (_fold_windows(spread, shape, kernel, stride, dilation),)

        _record(result, "WindowSum", (x,), (), bw)
    return result


def _window_max_grad(g: Tensor, kidx: Tensor, shape: tuple, kernel: tuple, stride: tuple, dilation: tuple) -> Tensor:
    """Window max's input gradient in differentiable tensor ops (for ``create_graph``): ``g`` routed to
    each window's position ``kidx`` through a one-hot mask and the window fold."""
    k = math.prod(kernel)
    onehot = kidx.unsqueeze(2) == arange(k, device=g.device).reshape((1, 1, k) + (1,) * (g.ndim - 2))
    return _fold_windows(where(onehot, g.unsqueeze(2), 0.0), shape, kernel, stride, dilation)


def _window_max(x: Tensor, kernel: tuple, stride: tuple, dilation: tuple, out: tuple) -> tuple[Tensor, Tensor]:
    """Maximum of each window of a padded input and its (first) position ``0..K-1`` in the window."""
    bk = x._backend
    d = x._data
    offsets = _offsets(kernel)
    best = bk.add(bk.slice(d, _offset_slices(offsets[0], stride, dilation, out)), 0)
    index_dtype = arange(1).dtype.np
    where_k = bk.full(best.shape, 0, index_dtype)
    for k, off in enumerate(offsets[1:], 1):
        piece = bk.slice(d, _offset_slices(off, stride, dilation, out))
        better = bk.logical_or(bk.gt(piece, best), bk.isnan(piece))  # strict: the first maximum wins
        best = bk.where(better, piece, best)
        where_k = bk.where(better, bk.full((), k, index_dtype), where_k)
    values = _wrap(best, bk)
    kidx = _wrap(where_k, bk)
    if x.requires_grad and STATE.enabled:
        shape = x.shape

        def bw(g: Tensor, kidx: Tensor):
            if STATE.enabled:  # create_graph: the differentiable (materialised) form
                return (_window_max_grad(g, kidx, shape, kernel, stride, dilation),)
            bk = g._backend
            where_k = kidx._data
            gd = g._data
            zero = bk.full((), 0, gd.dtype)
            base = bk.full(tuple(shape), 0, gd.dtype)
            for k, off in enumerate(offsets):
                view = bk.slice(base, _offset_slices(off, stride, dilation, out))
                picked = bk.where(bk.eq(where_k, bk.full((), k, index_dtype)), gd, zero)
                bk.assign(view, bk.add(view, picked))
            return (_wrap(base, bk),)

        _record(values, "WindowMax", (x,), (kidx,), bw)
    return values, kidx


def _block_max(x: Tensor, kernel: tuple, out: tuple) -> Tensor:
    """Max pooling with non-overlapping windows that tile the input (stride == kernel, no padding or
    dilation) through the backend's ``max_pool_blocks`` (``Backend.max_pool_blocks``: the generic default is
    the window loop in primitives, NumPy overrides it)."""
    bk = x._backend
    values = _wrap(bk.max_pool_blocks(x._data, kernel), bk)
    if x.requires_grad and STATE.enabled:
        _record(values, "BlockMax", (x,), (x, values), _block_max_backward(kernel, out))
    return values


@functools.lru_cache(maxsize=1024)
def _block_max_backward(kernel: tuple, out: tuple):
    """``_block_max``'s backward, built once per geometry (a closure made per call is objects the cyclic
    garbage collector tracks for as long as the step's graph lives: ``nn.linear._linear_rows_backward``)."""
    ones_ = (1,) * len(kernel)

    def bw(g: Tensor, x: Tensor, y: Tensor):
        if STATE.enabled:  # create_graph: the window path's differentiable form
            with no_grad():
                kidx = _window_max(x.detach(), kernel, kernel, ones_, out)[1]
            return (_window_max_grad(g, kidx, tuple(x.shape), kernel, kernel, ones_),)
        bk = g._backend
        return (_wrap(bk.max_pool_blocks_backward(x._data, y._data, g._data, kernel), bk),)

    return bw


# ---------------------------------------------------------------------- max pooling
def _max_poolnd(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices, nd: int):
    where = f"max_pool{nd}d"
    x, unbatched = _check_input(x, nd, where)
    kernel, stride, padding, dilation = _pool_args(kernel_size, stride, padding, dilation, nd, where)
    in_size = tuple(x.shape[2:])
    out, widths = _pool_geometry(in_size, kernel, stride, padding, dilation, ceil_mode, where)
    tiled = all(o * k == n for o, k, n in zip(out, kernel, in_size))
    if not return_indices and stride == kernel and all(d == 1 for d in dilation) and not any(padding) and tiled:
        values = _block_max(x, kernel, out)
        return values.squeeze(0) if unbatched else values
    values, kidx = _window_max(_pad_spatial(x, widths, "constant", -math.inf), kernel, stride, dilation, out)
    if not return_indices:
        return values.squeeze(0) if unbatched else values
    indices = _flat_indices(kidx, in_size, kernel, stride, padding, dilation, out)
    if unbatched:
        return values.squeeze(0), indices.squeeze(0)
    return values, indices


def _flat_indices(kidx: Tensor, in_size, kernel, stride, padding, dilation, out) -> Tensor:
    """PyTorch's ``return_indices``: the flat position in each input plane of every window's maximum."""
    nd = len(kernel)
    flat = None
    for i in range(nd):
        inner = math.prod(kernel[i + 1 :])
        k_i = (kidx // inner) % kernel[i] if nd > 1 else kidx
        shape = [1] * (nd + 2)
        shape[2 + i] = out[i]
        start = arange(out[i], device=kidx.device).reshape(shape) * stride[i] - padding[i]
        pos = start + k_i * dilation[i]
        term = pos * math.prod(in_size[i + 1 :])
        flat = term if flat is None else flat + term
    return flat


def max_pool1d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """1-d max pooling of ``(N, C, L)`` (``stride`` defaults to ``kernel_size``)."""
    return _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1)


def max_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """2-d max pooling of ``(N, C, H, W)``; with ``return_indices`` also the flat argmax in each plane::

    y = F.max_pool2d(x, 2)                  # halve H and W
    y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    """
    return _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2)


def max_pool3d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """3-d max pooling of ``(N, C, D, H, W)``."""
    return _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 3)


# ---------------------------------------------------------------------- average pooling
def _avg_poolnd(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd: int):
    where = f"avg_pool{nd}d"
    x, unbatched = _check_input(x, nd, where)
    kernel, stride, padding, dilation = _pool_args(kernel_size, stride, padding, 1, nd, where)
    in_size = tuple(x.shape[2:])
    out, widths = _pool_geometry(in_size, kernel, stride, padding, dilation, ceil_mode, where)
    total = _window_sum(_pad_spatial(x, widths), kernel, stride, dilation, out)
    if divisor_override is not None:
        if divisor_override == 0:
            raise FlowError(f"{where}: divisor_override must be non-zero")
        result = total / divisor_override
    elif all(lo == 0 and hi == 0 for lo, hi in widths):
        result = total / math.prod(kernel)
    else:
        with no_grad():  # how many real (or, with count_include_pad, padded) cells each window covers
            if count_include_pad:
                size = tuple(n + 2 * p for n, p in zip(in_size, padding))
                cover = [(0, hi - lo) for lo, hi in widths]
            else:
                size, cover = in_size, widths
            one = ones((1, 1) + size, dtype=x.dtype, device=x.device)
            count = _window_sum(_pad_spatial(one, cover), kernel, stride, dilation, out)
        result = total / count
    return result.squeeze(0) if unbatched else result


def avg_pool1d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """1-d average pooling of ``(N, C, L)``."""
    return _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


def avg_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """2-d average pooling; ``count_include_pad=False`` divides by the number of real cells per window."""
    return _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


def avg_pool3d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """3-d average pooling."""
    return _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


# ---------------------------------------------------------------------- adaptive pooling
def _adaptive_sizes(x: Tensor, output_size, nd: int, where: str) -> tuple[int, ...]:
    if isinstance(output_size, int) or output_size is None:
        output_size = (output_size,) * nd
    output_size = tuple(output_size)
    if len(output_size) != nd:
        raise FlowError(f"{where}: output_size must be an int or a tuple of {nd} (int or None), got {output_size}")
    sizes = tuple(n if o is None else int(o) for o, n in zip(output_size, x.shape[-nd:]))
    if any(o <= 0 for o in sizes):
        raise FlowError(f"{where}: output sizes must be positive, got {sizes}")
    return sizes


def _ranges(n: int, o: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: ``[floor(j*n/o), ceil((j+1)*n/o))``."""
    return [((j * n) // o, -((-(j + 1) * n) // o)) for j in range(o)]


def _adaptive_avg_poolnd(x: Tensor, output_size, nd: int) -> Tensor:
    where = f"adaptive_avg_pool{nd}d"
    x, unbatched = _check_input(x, nd, where)
    sizes = _adaptive_sizes(x, output_size, nd, where)
    spatial = x.shape[2:]
    if all(o == 1 for o in sizes):  # one window: the mean over the spatial dims (no reshape, which realizes x)
        out = x.mean(tuple(range(2, 2 + nd)), keepdim=True)
        return out.squeeze(0) if unbatched else out
    if all(n % o == 0 for n, o in zip(spatial, sizes)):  # equal windows everywhere: one reshape, one mean
        split = tuple(v for n, o in zip(spatial, sizes) for v in (o, n // o))
        out = x.reshape(tuple(x.shape[:2]) + split).mean(tuple(3 + 2 * i for i in range(nd)))
        return out.squeeze(0) if unbatched else out
    out = x
    for i, o in enumerate(sizes):
        dim = 2 + i
        n = x.shape[dim]
        if o == n:
            continue
        if n % o == 0:  # equal windows: a reshape and a mean
            shape = out.shape
            out = out.reshape(shape[:dim] + (o, n // o) + shape[dim + 1 :]).mean(dim + 1)
            continue
        rows = [[0.0] * n for _ in range(o)]
        for j, (a, b) in enumerate(_ranges(n, o)):
            for t in range(a, b):
                rows[j][t] = 1.0 / (b - a)
        weights = tensor(rows, dtype=x.dtype, device=x.device)
        out = out.movedim(dim, -1).matmul(weights.t()).movedim(-1, dim)
    return out.squeeze(0) if unbatched else out


def _adaptive_max_poolnd(x: Tensor, output_size, return_indices: bool, nd: int):
    where = f"adaptive_max_pool{nd}d"
    if return_indices:
        raise FlowError(
            f"{where}: return_indices=True is not supported; use max_pool{nd}d when the input size "
            "is a multiple of the output size"
        )
    x, unbatched = _check_input(x, nd, where)
    sizes = _adaptive_sizes(x, output_size, nd, where)
    out = x
    # last dim first: the separable maximum then picks the first maximum in row-major order, as PyTorch does
    for i, o in reversed(list(enumerate(sizes))):
        dim = 2 + i
        n = x.shape[dim]
        ranges = _ranges(n, o)
        width = max(b - a for a, b in ranges)
        index = [min(a + t, b - 1) for a, b in ranges for t in range(width)]  # short windows repeat their end
        shape = out.shape
        picked = out.index_select(dim, tensor(index, device=x.device))
        picked = picked.reshape(shape[:dim] + (o, width) + shape[dim + 1 :])
        out = picked.gather(dim + 1, picked.argmax(dim + 1, keepdim=True)).squeeze(dim + 1)
    return out.squeeze(0) if unbatched else out


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """Average pooling of ``(N, C, L)`` to ``output_size`` regardless of ``L``."""
    return _adaptive_avg_poolnd(input, output_size, 1)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Average pooling of ``(N, C, H, W)`` to ``output_size`` (an int, a pair; ``None`` keeps a size)::

    features = F.adaptive_avg_pool2d(x, 1).flatten(1)   # global average pooling
    """
    return _adaptive_avg_poolnd(input, output_size, 2)


def adaptive_avg_pool3d(input: Tensor, output_size) -> Tensor:
    """Average pooling of ``(N, C, D, H, W)`` to ``output_size``."""
    return _adaptive_avg_poolnd(input, output_size, 3)


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False) -> Tensor:
    """Max pooling of ``(N, C, L)`` to ``output_size``."""
    return _adaptive_max_poolnd(input, output_size, return_indices, 1)


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False) -> Tensor:
    """Max pooling of ``(N, C, H, W)`` to ``output_size``."""
    return _adaptive_max_poolnd(input, output_size, return_indices, 2)


def adaptive_max_pool3d(input: Tensor, output_size, return_indices: bool = False) -> Tensor:
    """Max pooling of ``(N, C, D, H, W)`` to ``output_size``."""
    return _adaptive_max_poolnd(input, output_size, return_indices, 3)


# ---------------------------------------------------------------------- unpooling and power-average pooling
def _max_unpoolnd(x: Tensor, indices: Tensor, kernel_size, stride, padding, output_size, nd: int) -> Tensor:
    where = f"max_unpool{nd}d"
    x, unbatched = _check_input(x, nd, where)
    if unbatched:
        indices = indices.unsqueeze(0)
    if tuple(indices.shape) != tuple(x.shape):
        raise FlowError(
            f"{where}: indices have shape {tuple(indices.shape)}, the input {tuple(x.shape)}; "
            "pass the indices max_pool returned with return_indices=True"
        )
    kernel, stride, padding, _ = _pool_args(kernel_size, stride, padding, 1, nd, where)
    in_size = tuple(x.shape[2:])
    default = tuple((i - 1) * s - 2 * p + k for i, s, p, k in zip(in_size, stride, padding, kernel))
    if output_size is None:
        size = default
    else:
        size = tuple(int(v) for v in tuple(output_size)[-nd:])
        if len(size) != nd or any(not d - s <= o <= d + s for o, d, s in zip(size, default, stride)):
            raise FlowError(
                f"{where}: output_size {tuple(output_size)} is not within a stride of the default {default}"
            )
    n, c = x.shape[:2]
    plane = math.prod(size)
    flat = x.new_zeros((n, c, plane)).scatter(2, indices.reshape(n, c, -1).long(), x.reshape(n, c, -1))
    out = flat.reshape((n, c) + size)
    return out.squeeze(0) if unbatched else out


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool1d``: each value goes back to its index, zeros elsewhere."""
    return _max_unpoolnd(input, indices, kernel_size, stride, padding, output_size, 1)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool2d``::

    y, idx = F.max_pool2d(x, 2, return_indices=True)
    x_sparse = F.max_unpool2d(y, idx, 2)          # x's maxima in place, zeros elsewhere
    """
    return _max_unpoolnd(input, indices, kernel_size, stride, padding, output_size, 2)


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool3d``."""
    return _max_unpoolnd(input, indices, kernel_size, stride, padding, output_size, 3)


def _lp_poolnd(x: Tensor, norm_type: float, kernel_size, stride, ceil_mode: bool, nd: int) -> Tensor:
    kernel = _ntuple(kernel_size, nd, "kernel_size", f"lp_pool{nd}d")
    if norm_type == math.inf:
        return _max_poolnd(x.abs(), kernel_size, stride, 0, 1, ceil_mode, False, nd)
    if norm_type == -math.inf:
        return -_max_poolnd(-x.abs(), kernel_size, stride, 0, 1, ceil_mode, False, nd)
    out = _avg_poolnd(x.pow(norm_type), kernel_size, stride, 0, ceil_mode, True, None, nd)
    return (out.sign() * out.abs().relu() * math.prod(kernel)).pow(1.0 / norm_type)  # PyTorch's formula


def lp_pool1d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    """Power-average pooling: ``(sum over the window of x**p) ** (1/p)``."""
    return _lp_poolnd(input, norm_type, kernel_size, stride, ceil_mode, 1)


def lp_pool2d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    """2-d power-average pooling (``norm_type=inf`` is max pooling of ``|x|``)."""
    return _lp_poolnd(input, norm_type, kernel_size, stride, ceil_mode, 2)


def lp_pool3d(input: Tensor, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    """3-d power-average pooling."""
    return _lp_poolnd(input, norm_type, kernel_size, stride, ceil_mode, 3)


# ---------------------------------------------------------------------- modules
class _MaxPoolNd(Module):
    _nd = 0

    def __init__(
        self,
        kernel_size,
        stride=None,
        padding=0,
        dilation=1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ):
        super().__init__()
        _pool_args(kernel_size, stride, padding, dilation, self._nd, type(self).__name__)  # validates at once
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor):
        return _max_poolnd(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil_mode,
            self.return_indices,
            self._nd,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    """1-d max pooling (``stride`` defaults to ``kernel_size``)."""

    _nd = 1


class MaxPool2d(_MaxPoolNd):
    """2-d max pooling with PyTorch's arguments::

    nn.MaxPool2d(kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False)
    """

    _nd = 2


class MaxPool3d(_MaxPoolNd):
    """3-d max pooling."""

    _nd = 3


class _AvgPoolNd(Module):
    _nd = 0

    def __init__(
        self,
        kernel_size,
        stride=None,
        padding=0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ):
        super().__init__()
        if self._nd:  # every concrete class has its dimension count
            _pool_args(kernel_size, stride, padding, 1, self._nd, type(self).__name__)  # validates at once
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return _avg_poolnd(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
            self._nd,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    """1-d average pooling: ``nn.AvgPool1d(kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True)``."""

    _nd = 1

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        # PyTorch keeps 1-tuples here (its repr shows kernel_size=(3,))
        self.kernel_size = _ntuple(kernel_size, 1, "kernel_size", "AvgPool1d")
        self.stride = _ntuple(self.stride, 1, "stride", "AvgPool1d")
        self.padding = _ntuple(padding, 1, "padding", "AvgPool1d")


class AvgPool2d(_AvgPoolNd):
    """2-d average pooling (``count_include_pad``, ``ceil_mode``, ``divisor_override`` as in PyTorch)."""

    _nd = 2


class AvgPool3d(_AvgPoolNd):
    """3-d average pooling."""

    _nd = 3


class _AdaptivePool(Module):
    _nd = 0
    _max = False

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        self.output_size = output_size
        if return_indices and not self._max:
            raise FlowError(f"{type(self).__name__} has no return_indices")
        self.return_indices = return_indices

    def forward(self, input: Tensor):
        if self._max:
            return _adaptive_max_poolnd(input, self.output_size, self.return_indices, self._nd)
        return _adaptive_avg_poolnd(input, self.output_size, self._nd)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePool):
    """Average pooling to a fixed output length."""

    _nd = 1

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool2d(_AdaptivePool):
    """Average pooling to a fixed output size: ``nn.AdaptiveAvgPool2d((1, 1))`` is global average pooling."""

    _nd = 2

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool3d(_AdaptivePool):
    """Average pooling to a fixed ``(D, H, W)``."""

    _nd = 3

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveMaxPool1d(_AdaptivePool):
    """Max pooling to a fixed output length."""

    _nd = 1
    _max = True


class AdaptiveMaxPool2d(_AdaptivePool):
    """Max pooling to a fixed output size."""

    _nd = 2
    _max = True


class AdaptiveMaxPool3d(_AdaptivePool):
    """Max pooling to a fixed ``(D, H, W)``."""

    _nd = 3
    _max = True


class _MaxUnpoolNd(Module):
    _nd = 0

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        nd = self._nd
        name = type(self).__name__
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size", name)
        self.stride = _ntuple(stride if stride is not None else kernel_size, nd, "stride", name)
        self.padding = _ntuple(padding, nd, "padding", name)

    def forward(self, input: Tensor, indices: Tensor, output_size=None) -> Tensor:
        return _max_unpoolnd(input, indices, self.kernel_size, self.stride, self.padding, output_size, self._nd)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """Put ``MaxPool1d``'s maxima back at their indices (zeros elsewhere)."""

    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    """Put ``MaxPool2d``'s maxima back at their indices: ``unpool(y, indices, output_size=None)``."""

    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    """Put ``MaxPool3d``'s maxima back at their indices."""

    _nd = 3


class _LPPoolNd(Module):
    _nd = 0

    def __init__(self, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False):
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Tensor:
        return _lp_poolnd(input, self.norm_type, self.kernel_size, self.stride, self.ceil_mode, self._nd)

    def extra_repr(self) -> str:
        return (
            f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"ceil_mode={self.ceil_mode}"
        )


class LPPool1d(_LPPoolNd):
    """1-d power-average pooling: ``nn.LPPool1d(norm_type, kernel_size, stride=None, ceil_mode=False)``."""

    _nd = 1


class LPPool2d(_LPPoolNd):
    """2-d power-average pooling."""

    _nd = 2


class LPPool3d(_LPPoolNd):
    """3-d power-average pooling."""

    _nd = 3
