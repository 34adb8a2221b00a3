"""Convolutions: ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d`` and their functional forms.

One n-d path serves every dimensionality (and pooling, ``unfold`` and ``fold``):

* ``_windows(x, kernel, stride, dilation, out, axis)`` takes a padded ``(A, B, *S)`` input and stacks the
  ``K = prod(kernel)`` shifted, strided slices along a new dim at ``axis``: ``(A, B, K, *out)`` or
  ``(A, K, B, *out)`` (im2col without a strided-view primitive: one basic slice per kernel offset, then
  one concatenate).
* ``_fold_windows`` is its adjoint (col2im): it adds each of the ``K`` slices back into a zero buffer of
  the padded shape. Each one is the other's backward, so both are differentiable to any order.
* With ``batch_last`` both work on ``(A, *S, B)`` inputs and ``(A, K, *out, B)`` windows.

A convolution runs channels-first, batch-last: the input is laid out ``(C_in, *S, N)``, so its windows
are ``(C_in, K, *out, N)`` = ``(C_in * K, L * N)`` without a copy, each window slice copies runs of
``out[-1] * N`` elements (small feature maps stay cheap), and the whole convolution is one GEMM per group,
``weight.reshape(G, C_out/G, C_in/G * K) @ cols``. Its ``(C_out, *out, N)`` result is returned as an
``(N, C_out, *out)`` view, which the next convolution reads without a copy. A transposed convolution is
the same GEMM with the transposed weight, followed by ``_fold_windows`` (in the ``(C, N, *S)`` layout).

Where the backend asks for the batch-last layout, the window stacking, GEMM and fold run inside the backend's
``conv_gemm`` / ``conv_gemm_backward`` / ``conv_gemm_transpose`` composites (NumPy works them a cache-sized block
of output rows at a time). In every layout a convolution keeps only its input and weight for backward, as
PyTorch does: the im2col is rebuilt in backward rather than kept from the forward.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

from ..autograd.functional import grad as autograd_grad
from ..autograd.grad_mode import STATE, enable_grad, no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, empty, pad
from ..tensor.tensor import _record, _wrap
from . import init
from .module import Module, Parameter

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
__functional__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]


# ---------------------------------------------------------------------- argument helpers
#: The smallest value each window argument may take (PyTorch refuses the same).
_MINIMUM = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


#: ``_ntuple``'s results by the identity of the value checked: ``id -> (value, n, name, result)``. A module passes
#: the same tuples to its functional at every call (``self.stride``); the check with its generator expressions
#: was about 2% of an eager convnet step's host work on the GPU. The entry holds the value, so its id is not
#: reused while the entry lives, and ``is`` tells ``True`` from ``1``. Bounded: cleared when full.
_NTUPLE_SEEN: dict[int, tuple] = {}


def _ntuple(value, n: int, name: str, where: str) -> tuple[int, ...]:
    """``value`` as an ``n``-tuple of ints (an int is repeated), with a clear error otherwise; each at least
    ``_MINIMUM[name]`` (a kernel, stride or dilation of 0 or a negative padding is refused)."""
    seen = _NTUPLE_SEEN.get(id(value))
    if seen is not None and seen[0] is value and seen[1] == n and seen[2] == name:
        return seen[3]
    out = _ntuple_checked(value, n, name, where)
    if type(value) is tuple or type(value) is int:  # immutable: the answer cannot change
        if len(_NTUPLE_SEEN) >= 256:
            _NTUPLE_SEEN.clear()
        _NTUPLE_SEEN[id(value)] = (value, n, name, out)
    return out


def _ntuple_checked(value, n: int, name: str, where: str) -> tuple[int, ...]:
    """``_ntuple`` without the memo."""
    out: tuple[int, ...] | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        out = (value,) * n
    elif isinstance(value, (tuple, list)) and len(value) == n and all(isinstance(v, int) for v in value):
        out = tuple(value)
    elif isinstance(value, (tuple, list)) and len(value) == 1 and isinstance(value[0], int):
        out = (value[0],) * n
    if out is None:
        raise FlowError(f"{where}: {name} must be an int or a tuple of {n} ints, got {value!r}")
    low = _MINIMUM.get(name)
    if low is not None and any(v < low for v in out):
        raise FlowError(f"{where}: {name} must be >= {low} in every dimension, got {value!r}")
    return out


def _window_out(size: int, k: int, s: int, d: int) -> int:
    """Number of windows of extent ``d*(k-1)+1`` and step ``s`` that fit in ``size``."""
    return (size - d * (k - 1) - 1) // s + 1


def _check_input(x: Tensor, nd: int, where: str) -> tuple[Tensor, bool]:
    """Accept ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``; return the batched tensor and a flag."""
    if not isinstance(x, Tensor):
        raise FlowError(f"{where}: expected a flowgraph Tensor input, got {_type_name(x)}{_conversion_hint(x)}")
    if x.ndim == nd + 2:
        return x, False
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    raise ShapeError(
        f"{where}: expected a {nd + 2}-d input (N, C{', *spatial' if nd else ''}) or a {nd + 1}-d "
        f"unbatched one, got shape {x.shape}"
    )


def _offset_slices(offset: Sequence[int], stride, dilation, out, batch_last: bool = False) -> tuple[slice, ...]:
    spatial = tuple(slice(o * d, o * d + (n - 1) * s + 1, s) for o, s, d, n in zip(offset, stride, dilation, out))
    if batch_last:
        return (slice(None),) + spatial + (slice(None),)
    return (slice(None), slice(None)) + spatial


# ---------------------------------------------------------------------- the shared window primitive
def _windows(
    x: Tensor, kernel: tuple, stride: tuple, dilation: tuple, out: tuple, axis: int = 2, batch_last: bool = False
) -> Tensor:
    """``(A, B, *S) -> (A, B, K, *out)`` (``axis=2``) or ``(A, K, B, *out)`` (``axis=1``): every kernel
    offset's strided slice of an (already padded) input, stacked along a new dim at ``axis``.

    With ``batch_last`` the input is ``(A, *S, B)`` and the result ``(A, K, *out, B)`` (``axis`` is then
    ignored): each slice then copies runs of ``out[-1] * B`` contiguous elements instead of ``out[-1]``,
    which is what makes small feature maps cheap.

    ``out`` must satisfy ``out[i] == (S[i] - dilation[i]*(kernel[i]-1) - 1) // stride[i] + 1`` or be smaller.
    """
    bk = x._backend
    d = x._data
    if batch_last:
        axis = 1
        piece_shape = (d.shape[0], 1) + tuple(out) + (d.shape[-1],)
    else:
        lead = list(d.shape[:2])
        lead.insert(axis, 1)
        piece_shape = tuple(lead) + tuple(out)
    pieces = [
        bk.reshape(bk.slice(d, _offset_slices(off, stride, dilation, out, batch_last)), piece_shape)
        for off in itertools.product(*(range(k) for k in kernel))
    ]
    result = _wrap(pieces[0] if len(pieces) == 1 else bk.concatenate(pieces, axis), bk)
    if x.requires_grad and STATE.enabled:
        shape = x.shape
        _record(result, "Windows", (x,), (),
                lambda g: (_fold_windows(g, shape, kernel, stride, dilation, axis, batch_last),))
    return result


def _fold_windows(
    cols: Tensor,
    shape: tuple,
    kernel: tuple,
    stride: tuple,
    dilation: tuple,
    axis: int = 2,
    batch_last: bool = False,
) -> Tensor:
    """The adjoint of ``_windows``: the ``K`` slices along ``axis`` added back into zeros of ``shape``
    ``(A, B, *S)`` (``(A, *S, B)`` with ``batch_last``; overlapping windows sum)."""
    bk = cols._backend
    g = cols._data
    if batch_last:
        axis = 1
        out = tuple(cols.shape[2:-1])
        piece_shape = (shape[0],) + out + (shape[-1],)
    else:
        out = tuple(cols.shape[3:])
        piece_shape = tuple(shape[:2]) + out
    base = bk.full(tuple(shape), 0, g.dtype)
    for k, off in enumerate(itertools.product(*(range(kk) for kk in kernel))):
        index = [slice(None)] * g.ndim
        index[axis] = slice(k, k + 1)
        piece = bk.reshape(bk.slice(g, tuple(index)), piece_shape)
        view = bk.slice(base, _offset_slices(off, stride, dilation, out, batch_last))
        summed = bk.add_into(view, piece)
        if summed is not view:  # add_into adds in place into a writable view of ``base``
            bk.assign(view, summed)
    result = _wrap(base, bk)
    if cols.requires_grad and STATE.enabled:
        _record(result, "FoldWindows", (cols,), (),
                lambda gg: (_windows(gg, kernel, stride, dilation, out, axis, batch_last),))
    return result


def _type_name(x) -> str:
    cls = type(x)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}" if cls.__module__ != "builtins" else cls.__name__


def _conversion_hint(x) -> str:
    if hasattr(x, "__dlpack__"):
        return " (convert it with fg.from_dlpack(t), or fg.tensor(t.numpy()) for a CPU tensor)"
    return ""


def _padding_widths(
    padding, kernel: tuple, dilation: tuple, stride: tuple, nd: int, where: str
) -> list[tuple[int, int]]:
    """Per-dim (left, right) zero padding from an int, a tuple, ``'valid'`` or ``'same'``."""
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise FlowError(f"{where}: padding='same' is not supported for strided convolutions (stride={stride})")
            widths = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                widths.append((total // 2, total - total // 2))
            return widths
        raise FlowError(f"{where}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    return [(p, p) for p in _ntuple(padding, nd, "padding", where)]


def _pad_spatial(x: Tensor, widths: list[tuple[int, int]], mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad the trailing spatial dims of ``(N, C, *S)`` by per-dim (left, right) widths."""
    if not any(lo or hi for lo, hi in widths):
        return x
    flat = []
    for lo, hi in reversed(widths):
        flat += [lo, hi]
    return pad(x, flat, mode, value)


def _im2col(
    x: Tensor,
    kernel: tuple,
    stride: tuple,
    dilation: tuple,
    widths,
    mode: str = "constant",
    value: float = 0.0,
    where: str = "conv",
    axis: int = 2,
) -> tuple[Tensor, tuple[int, ...]]:
    """Pad ``x`` and return its windows (``(A, B, K, *out)``, or ``(A, K, B, *out)`` with ``axis=1``) and
    ``out``."""
    xp = _pad_spatial(x, widths, mode, value)
    out = tuple(_window_out(n, k, s, d) for n, k, s, d in zip(xp.shape[2:], kernel, stride, dilation))
    if any(o <= 0 for o in out):
        raise ShapeError(
            f"{where}: input of spatial size {tuple(x.shape[2:])} (padded {tuple(xp.shape[2:])}) "
            "is smaller than "
            f"the kernel's extent (kernel {kernel}, dilation {dilation}); the output would be empty"
        )
    return _windows(xp, kernel, stride, dilation, out, axis), out


# ---------------------------------------------------------------------- functional convolution
def _weight_gemm(w: Tensor, cols: Tensor) -> Tensor:
    """``w @ cols`` for one group: ``(C_out, C_in*K) @ (C_in*K, L)``.

    The same product as ``matmul``, with the weight gradient taken as ``(cols @ g^T)^T`` when ``L`` is at
    least four times ``C_in*K``: with a long ``L`` and few channels that orientation runs 15-20% faster in
    OpenBLAS than ``g @ cols^T``. (With a short ``L`` it does not pay for the copy the transposed gradient
    costs later.)
    """
    if STATE.autocast is not None or w.ndim != 2 or w.dtype is not cols.dtype or w._backend is not cols._backend:
        return w.matmul(cols)  # groups, promotion, autocast, device errors: matmul
    bk = w._backend
    out = _wrap(bk.matmul(w._data, cols._data), bk)
    need_w, need_c = w.requires_grad, cols.requires_grad
    if STATE.enabled and (need_w or need_c):

        def backward(g: Tensor, *saved: Tensor):
            cols = saved[0] if need_w else None  # the weight's gradient reads cols, cols' gradient reads w
            w = saved[-1] if need_c else None
            gw = None
            if need_w:
                if cols.shape[1] >= 4 * cols.shape[0]:
                    gw = cols.matmul(g.transpose(0, 1)).transpose(0, 1)
                else:
                    gw = g.matmul(cols.transpose(0, 1))
            gc = w.transpose(0, 1).matmul(g) if need_c else None
            return gw, gc

        _record(out, "ConvGemm", (w, cols), ((cols,) if need_w else ()) + ((w,) if need_c else ()), backward)
    return out


def _conv_gemm(x: Tensor, w: Tensor, kernel: tuple, stride: tuple, dilation: tuple, widths, where: str,
               batch_first: bool = False) -> Tensor:
    """One convolution in the batch-last layout through ``Backend.conv_gemm``: ``x`` ``(C_in, *S, N)``
    (unpadded; ``widths`` are its zero padding), ``w`` ``(C_out, C_in * K)``, the result ``(C_out, *out, N)``,
    or with ``batch_first`` that array seen as ``(N, C_out, *out)`` by the node itself. The layer's output is
    then not a view of another tensor, so an in-place op on it (DCGAN's ``LeakyReLU(0.2, inplace=True)``
    right after a convolution) writes it directly instead of rebasing a base through ``CopySlices`` (a full-size
    mask, a ``where`` of zeros for the base and a gradient sum: dcgan_d's first layer, ~1 ms per step).

    ``x`` is not padded here: ``Backend.conv_gemm`` takes the padding (NumPy writes it into the im2col, no
    padded copy of ``x``). Backward keeps only ``x`` and ``w``, as PyTorch does: ``Backend.conv_gemm_backward``
    rebuilds the im2col, so no ``K``-times input-sized buffer lives from the forward to the backward (the
    im2col saved for the weight gradient was mnist's largest tensor: 42 MiB per step for its second conv).
    Under ``create_graph`` the backward is the same computation in differentiable tensor ops."""
    bk = x._backend
    nd = len(kernel)
    padding = tuple(map(tuple, widths)) if any(lo or hi for lo, hi in widths) else None
    padded_size = tuple(m + lo + hi for m, (lo, hi) in zip(x.shape[1:-1], widths))
    out_size = tuple(_window_out(m, kk, s, d) for m, kk, s, d in zip(padded_size, kernel, stride, dilation))
    if any(o <= 0 for o in out_size):
        raise ShapeError(
            f"{where}: input of spatial size {tuple(x.shape[1:-1])} (padded {padded_size}) is "
            f"smaller than the kernel's extent (kernel {kernel}, dilation {dilation}); the output would be empty"
        )
    y = bk.conv_gemm(x._data, w._data, kernel, stride, dilation, out_size, padding)
    to_first = (nd + 1, 0) + tuple(range(1, nd + 1))
    out = _wrap(bk.permute(y, to_first) if batch_first else y, bk)
    need_x, need_w = x.requires_grad, w.requires_grad
    if STATE.enabled and (need_x or need_w):
        _record(out, f"Conv{nd}dGemm", (x, w), (x, w),
                _conv_gemm_backward(kernel, stride, dilation, tuple(map(tuple, widths)), tuple(x.shape[1:-1]),
                                    out_size, batch_first, need_x, need_w))
    return out


@functools.lru_cache(maxsize=1024)
def _conv_gemm_backward(kernel: tuple, stride: tuple, dilation: tuple, widths: tuple, in_size: tuple,
                        out_size: tuple, batch_first: bool, need_x: bool, need_w: bool):
    """``_conv_gemm``'s backward, built once per geometry and set of needed gradients (a closure made per call
    is objects the cyclic garbage collector tracks while the step's graph lives: see ``_bilinear_backward``)."""
    nd = len(kernel)
    padded = any(lo or hi for lo, hi in widths)
    to_last = tuple(range(1, nd + 2)) + (0,)
    inner = (slice(None),) + tuple(slice(lo, lo + n) for (lo, _), n in zip(widths, in_size)) + (slice(None),)

    def backward(g: Tensor, x: Tensor, w: Tensor):
        if batch_first:
            g = g.permute(to_last) if STATE.enabled else _wrap(g._backend.permute(g._data, to_last), g._backend)
        if STATE.enabled:  # create_graph: the same steps in differentiable ops
            flat = [0, 0]
            for lo, hi in reversed(widths):
                flat += [lo, hi]
            xp = pad(x, flat, "constant", 0.0) if padded else x
            g2 = g.reshape(g.shape[0], -1)
            gw = gx = None
            if need_w:
                cols = _windows(xp, kernel, stride, dilation, out_size, batch_last=True)
                gw = g2.matmul(cols.reshape(w.shape[1], -1).transpose(0, 1))
            if need_x:
                gcols = w.transpose(0, 1).matmul(g2).reshape((x.shape[0], math.prod(kernel)) + g.shape[1:])
                gx = _fold_windows(gcols, tuple(xp.shape), kernel, stride, dilation, batch_last=True)
                gx = gx[inner] if padded else gx
            return gx, gw
        bk = g._backend
        gxd, gwd = bk.conv_gemm_backward(x._data, w._data, g._data, kernel, stride, dilation, need_x, need_w,
                                         widths if padded else None)
        return None if gxd is None else _wrap(gxd, bk), None if gwd is None else _wrap(gwd, bk)

    return backward


def _conv_transpose_gemm(x: Tensor, w: Tensor, kernel: tuple, stride: tuple, dilation: tuple, full: tuple,
                         crop) -> Tensor:
    """A transposed convolution in the batch-last layout through ``Backend.conv_gemm_transpose``: ``x``
    ``(C_in, *in, N)``, ``w`` ``(C_in, C_out * K)``, the result ``(C_out, *full, N)`` with ``crop`` (left, right)
    taken off each spatial dim by the backend (NumPy writes the cropped result contiguous). Its input gradient
    is the convolution ``conv_gemm`` of the output gradient (zero-padded back to ``full`` by that convolution's
    ``padding``, batch-last, no relayout), its weight gradient that convolution's weight gradient, both from
    ``Backend.conv_gemm_transpose_backward`` (one im2col of the gradient for the two); only ``x`` and ``w`` are
    kept for backward."""
    bk = x._backend
    n, k = x.shape[-1], math.prod(kernel)
    c_out = w.shape[1] // k
    shape = (c_out,) + tuple(full) + (n,)
    crop = tuple(map(tuple, crop)) if any(lo or hi for lo, hi in crop) else None
    out = _wrap(bk.conv_gemm_transpose(x._data, w._data, kernel, stride, dilation, shape, crop), bk)
    need_x, need_w = x.requires_grad, w.requires_grad
    if STATE.enabled and (need_x or need_w):
        in_size = tuple(x.shape[1:-1])

        def backward(g: Tensor, x: Tensor, w: Tensor):
            if STATE.enabled:  # create_graph: differentiable ops
                if crop is not None:  # the crop's adjoint: zeros around g (batch-last)
                    widths = [(0, 0), *crop, (0, 0)]
                    g = pad(g, [v for lo_hi in reversed(widths) for v in lo_hi], "constant", 0.0)
                gx = None
                if need_x:
                    gx = _conv_gemm(g, w, kernel, stride, dilation, [(0, 0)] * len(kernel), "conv_transpose")
                gw = None
                if need_w:
                    cols = _windows(g, kernel, stride, dilation, in_size, batch_last=True).reshape(w.shape[1], -1)
                    gw = x.reshape(x.shape[0], -1).matmul(cols.transpose(0, 1))
                return gx, gw
            bk = g._backend
            gxd, gwd = bk.conv_gemm_transpose_backward(x._data, w._data, g._data, kernel, stride, dilation, need_x,
                                                       need_w, crop)  # the crop's zeros: written by the im2col
            return None if gxd is None else _wrap(gxd, bk), None if gwd is None else _wrap(gwd, bk)

        _record(out, f"ConvTranspose{len(kernel)}dGemm", (x, w), (x, w), backward)
    return out


# ---------------------------------------------------------------------- native convolutions
# Where the backend runs convolutions itself (``Backend.native_conv``: cuDNN on CUDA, implicit-GEMM kernels on
# OpenCL), a convolution is three bilinear ops, each the others' adjoint: the forward F(x, w), the input gradient
# D(g, w) (a transposed convolution's forward) and the weight gradient W(x, g). Each one's backward is made of the
# other two, so gradients of any order stay on the native path and nothing but the inputs is kept for backward.
def _native_ok(x: Tensor, weight: Tensor, widths, mode: str, nd: int) -> bool:
    """Whether this convolution can run on the backend's native path: zero padding, equal on both sides, one
    dtype and backend for input and weight, no autocast, and a backend that says ``native_conv``."""
    bk = x._backend
    return (mode == "constant" and STATE.autocast is None and weight._backend is bk and weight.dtype is x.dtype
            and all(lo == hi for lo, hi in widths) and bk.native_conv(x.dtype.np, nd))


def _bilinear(name: str, a: Tensor, b: Tensor, compute, grads: tuple) -> Tensor:
    """``compute(a, b)`` on the arrays (made contiguous), recorded as node ``name`` of a bilinear op: for the
    output gradient ``h``, ``a``'s gradient is ``grad_a(h, b)`` and ``b``'s is ``grad_b(a, h)``
    (``grads = (grad_a, grad_b)``), so each input is saved only when the other one needs a gradient."""
    bk = a._backend
    out = _wrap(compute(bk.contiguous(a._data), bk.contiguous(b._data)), bk)
    need_a, need_b = a.requires_grad, b.requires_grad
    if STATE.enabled and (need_a or need_b):
        _record(out, name, (a, b), ((a,) if need_b else ()) + ((b,) if need_a else ()),
                _bilinear_backward(grads, need_a, need_b))
    return out


@functools.lru_cache(maxsize=1024)
def _bilinear_backward(grads: tuple, need_a: bool, need_b: bool):
    """``_bilinear``'s backward, built once per pair of gradient functions (themselves built once per layout:
    ``_native_grads``) and needed gradients. A closure made per call is a function, a tuple and cells that the
    cyclic garbage collector tracks for as long as the step's graph lives (``nn.linear._linear_rows_backward``)."""
    grad_a, grad_b = grads

    def backward(h: Tensor, *saved: Tensor):
        sa = saved[0] if need_b else None
        sb = saved[-1] if need_a else None
        return (grad_a(h, sb) if need_a else None), (grad_b(sa, h) if need_b else None)

    return backward


@functools.lru_cache(maxsize=1024)
def _native_grads(kind: str, x_shape: tuple, w_shape: tuple, geometry: tuple) -> tuple:
    """``(grad_a, grad_b)`` of the native convolution op ``kind`` (F, D or W below) for an input of ``x_shape``
    and a weight of ``w_shape``: each of F, D and W is bilinear and its gradients are the other two."""
    if kind == "F":
        return (lambda h, w: _native_input_grad(h, w, x_shape, geometry),
                lambda x, h: _native_weight_grad(x, h, w_shape, geometry))
    if kind == "D":
        return (lambda h, w: _native_forward(h, w, geometry),
                lambda g, h: _native_weight_grad(h, g, w_shape, geometry))
    return (lambda h, g: _native_input_grad(g, h, x_shape, geometry),
            lambda x, h: _native_forward(x, h, geometry))


def _native_forward(x: Tensor, w: Tensor, geometry: tuple) -> Tensor:
    """F(x, w): ``(N, C_in, *S)`` and ``(C_out, C_in/groups, *K)`` to ``(N, C_out, *out)``; ``geometry`` is
    ``(stride, padding, dilation, groups)``."""
    return _bilinear("Convolution", x, w, lambda xd, wd: x._backend.conv_forward(xd, wd, *geometry),
                     _native_grads("F", tuple(x.shape), tuple(w.shape), geometry))


def _native_forward_bias(x: Tensor, w: Tensor, b: Tensor, geometry: tuple) -> Tensor:
    """F(x, w) + b per output channel as one backend op (``Backend.conv_forward_bias``: one cuDNN graph on
    CUDA), recorded as one ``Convolution`` node: the input and weight gradients are F's (``_native_grads``), the
    bias's is the output gradient summed over the batch and spatial dims."""
    bk = x._backend
    out = _wrap(bk.conv_forward_bias(bk.contiguous(x._data), bk.contiguous(w._data), bk.contiguous(b._data),
                                     *geometry), bk)
    need_x, need_w, need_b = x.requires_grad, w.requires_grad, b.requires_grad
    if STATE.enabled and (need_x or need_w or need_b):
        _record(out, "Convolution", (x, w, b), ((x,) if need_w else ()) + ((w,) if need_x else ()),
                _biased_conv_backward(_native_grads("F", tuple(x.shape), tuple(w.shape), geometry), x.ndim,
                                      need_x, need_w, need_b))
    return out


@functools.lru_cache(maxsize=1024)
def _biased_conv_backward(grads: tuple, ndim: int, need_x: bool, need_w: bool, need_b: bool):
    """``_native_forward_bias``'s backward, built once per layout and set of needed gradients (see
    ``_bilinear_backward``)."""
    grad_x, grad_w = grads
    axes = (0,) + tuple(range(2, ndim))

    def backward(h: Tensor, *saved: Tensor):
        x = saved[0] if need_w else None
        w = saved[-1] if need_x else None
        return (grad_x(h, w) if need_x else None, grad_w(x, h) if need_w else None,
                h.sum(axes) if need_b else None)

    return backward


def _native_input_grad(g: Tensor, w: Tensor, x_shape: tuple, geometry: tuple) -> Tensor:
    """D(g, w): the input gradient of F for an input of ``x_shape`` (and a transposed convolution's forward)."""
    return _bilinear("ConvolutionInputGrad", g, w,
                     lambda gd, wd: g._backend.conv_input_grad(gd, wd, x_shape, *geometry),
                     _native_grads("D", x_shape, tuple(w.shape), geometry))


def _native_weight_grad(x: Tensor, g: Tensor, w_shape: tuple, geometry: tuple) -> Tensor:
    """W(x, g): the weight gradient of F, of ``w_shape``."""
    return _bilinear("ConvolutionWeightGrad", x, g,
                     lambda xd, gd: x._backend.conv_weight_grad(xd, gd, w_shape, *geometry),
                     _native_grads("W", tuple(x.shape), w_shape, geometry))


def _gemm_operands(weight: Tensor, cols: Tensor, groups: int, rows: int, length: int) -> tuple[Tensor, Tensor]:
    """The convolution GEMM's operands: ``(C_out, rows) @ (rows, length)``, batched over ``groups``."""
    c_out = weight.shape[0]
    if groups > 1:
        return weight.reshape(groups, c_out // groups, rows), cols.reshape(groups, rows, length)
    return weight.reshape(c_out, rows), cols.reshape(rows, length)


def _convnd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride,
    padding,
    dilation,
    groups: int,
    nd: int,
    padding_mode: str = "zeros",
) -> Tensor:
    where = f"conv{nd}d"
    x, unbatched = _check_input(x, nd, where)
    if weight.ndim != nd + 2:
        raise ShapeError(f"{where}: weight must be {nd + 2}-d (out, in/groups, *kernel), got shape {weight.shape}")
    c_out, c_in_g = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    n, c_in = x.shape[:2]
    if groups < 1 or c_in % groups or c_out % groups:
        raise FlowError(f"{where}: groups={groups} must divide both in_channels ({c_in}) and out_channels ({c_out})")
    if c_in_g * groups != c_in:
        raise ShapeError(
            f"{where}: input has {c_in} channels but the weight {tuple(weight.shape)} with groups={groups} "
            "expects "
            f"{c_in_g * groups}"
        )
    stride = _ntuple(stride, nd, "stride", where)
    dilation = _ntuple(dilation, nd, "dilation", where)
    widths = _padding_widths(padding, kernel, dilation, stride, nd, where)
    mode = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}.get(
        padding_mode
    )
    if mode is None:
        raise FlowError(
            f"{where}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {padding_mode!r}"
        )
    if _native_ok(x, weight, widths, mode, nd):
        padding = tuple(lo for lo, _ in widths)
        out_size = tuple(_window_out(m + 2 * p, kk, s, d)
                         for m, p, kk, s, d in zip(x.shape[2:], padding, kernel, stride, dilation))
        if any(o <= 0 for o in out_size):
            raise ShapeError(
                f"{where}: input of spatial size {tuple(x.shape[2:])} (padding {padding}) is smaller than the "
                f"kernel's extent (kernel {kernel}, dilation {dilation}); the output would be empty"
            )
        geometry = (stride, padding, dilation, groups)
        if bias is not None and bias.dtype is x.dtype and bias._backend is x._backend and bias.ndim == 1:
            out = _native_forward_bias(x, weight, bias, geometry)
        else:
            out = _native_forward(x, weight, geometry)
            if bias is not None:
                out = out + bias.reshape((1, c_out) + (1,) * nd)
        return out.squeeze(0) if unbatched else out
    k = math.prod(kernel)
    # Channels first, batch last: the input is laid out (C, *S, N), its windows stack to (C, K, *out, N),
    # which is (C*K, L*N) with no copy, and the whole convolution is one GEMM per group (BLAS-sized, not N
    # small ones). With the batch innermost every window slice copies runs of out[-1]*N elements (not
    # out[-1]), so small feature maps stay cheap, and the output (C_out, *out, N) is returned as an
    # (N, C_out, *out) view: the next convolution finds its input already in this layout.
    if not x._backend.conv_batch_last:
        return _convnd_batch_second(x, weight, bias, stride, dilation, widths, mode, groups, c_in_g, c_out, k, n,
                                    nd, unbatched, where)
    to_last = (1,) + tuple(range(2, nd + 2)) + (0,)
    if k == 1 and all(s == 1 for s in stride) and not any(lo or hi for lo, hi in widths):
        out_size = tuple(x.shape[2:])
        cols = x.permute(to_last)  # a 1x1 convolution is a plain matmul over channels
    elif groups == 1 and STATE.autocast is None and weight.dtype is x.dtype and weight._backend is x._backend:
        if mode == "constant":
            xl = x.permute(to_last)
        else:
            xl, widths = _pad_spatial(x, widths, mode).permute(to_last), [(0, 0)] * nd
        out = _conv_gemm(xl, weight.reshape(c_out, c_in * k), kernel, stride, dilation, widths, where,
                         batch_first=True)
        if bias is not None:
            out = out + bias.reshape((1, c_out) + (1,) * nd)
        return out.squeeze(0) if unbatched else out
    else:
        if mode == "constant":
            flat = [0, 0]
            for lo, hi in reversed(widths):
                flat += [lo, hi]
            xp = pad(x.permute(to_last), flat, "constant", 0.0) if any(flat) else x.permute(to_last)
        else:
            xp = _pad_spatial(x, widths, mode).permute(to_last)
        out_size = tuple(_window_out(m, kk, s, d) for m, kk, s, d in zip(xp.shape[1:-1], kernel, stride, dilation))
        if any(o <= 0 for o in out_size):
            raise ShapeError(
                f"{where}: input of spatial size {tuple(x.shape[2:])} (padded {tuple(xp.shape[1:-1])}) is "
                f"smaller than the kernel's extent (kernel {kernel}, dilation {dilation}); the output would be "
                "empty"
            )
        cols = _windows(xp, kernel, stride, dilation, out_size, batch_last=True)
    w, cols = _gemm_operands(weight, cols, groups, c_in_g * k, n * math.prod(out_size))
    out = _weight_gemm(w, cols).reshape((c_out,) + out_size + (n,)).permute((nd + 1, 0) + tuple(range(1, nd + 1)))
    if bias is not None:
        out = out + bias.reshape((1, c_out) + (1,) * nd)
    return out.squeeze(0) if unbatched else out


def _convnd_batch_second(x: Tensor, weight: Tensor, bias: Tensor | None, stride, dilation, widths, mode: str,
                         groups: int, c_in_g: int, c_out: int, k: int, n: int, nd: int, unbatched: bool,
                         where: str) -> Tensor:
    """The convolution in a ``(C, N, *S)`` layout: the windows stack to ``(C, K, N, *out)``, which is
    ``(C*K, N*L)`` with no copy, one GEMM per group. Used where the backend does not ask for the batch-last
    layout (``Backend.conv_batch_last``): on the H200 the batch-last layout made the CUDA convnet benchmark 14-21%
    slower (eager 1418 -> 1721 ms, captured 658 -> 753 ms per epoch) while it made the NumPy one 1.3-1.5x
    faster."""
    if k == 1 and all(s == 1 for s in stride) and not any(lo or hi for lo, hi in widths):
        out_size = tuple(x.shape[2:])
        cols = x.transpose(0, 1)  # a 1x1 convolution is a plain matmul over channels
        w, cols = _gemm_operands(weight, cols, groups, c_in_g * k, n * math.prod(out_size))
        out = w.matmul(cols)
    else:
        out, out_size = _conv_gemm_batch_second(x, weight, groups, stride, dilation, widths, mode, where)
    out = out.reshape((c_out, n) + out_size).transpose(0, 1)
    if bias is not None:
        out = out + bias.reshape((1, c_out) + (1,) * nd)
    return out.squeeze(0) if unbatched else out


def _conv_gemm_batch_second(x: Tensor, weight: Tensor, groups: int, stride, dilation, widths, mode: str,
                            where: str) -> tuple[Tensor, tuple[int, ...]]:
    """The ``(C_in, N, *S)``-layout convolution GEMM ``(C_out, N * L)`` (per group), keeping only ``x`` and
    ``weight`` for backward as PyTorch does: the backward builds the im2col again (the im2col saved for the
    weight gradient was the largest tensor of a convolution's graph) and takes the input gradient through the
    rebuilt im2col's own backward (col2im, and the padding's adjoint for every ``padding_mode``)."""
    kernel = tuple(weight.shape[2:])
    c_out, c_in_g = weight.shape[:2]
    rows = c_in_g * math.prod(kernel)

    def operands(x: Tensor, weight: Tensor):
        cols, out_size = _im2col(x.transpose(0, 1), kernel, stride, dilation, widths, mode, where=where, axis=1)
        return _gemm_operands(weight, cols, groups, rows, cols.numel() // (rows * groups)) + (out_size,)

    with no_grad():
        w, cols, out_size = operands(x, weight)
        out = w.matmul(cols)
    need_x, need_w = x.requires_grad, weight.requires_grad
    if STATE.enabled and (need_x or need_w):

        def backward(g: Tensor, x: Tensor, weight: Tensor):
            create = STATE.enabled  # create_graph: the saved tensors themselves, so the gradients stay differentiable
            with enable_grad():
                xs = x if create or not need_x else x.detach().requires_grad_(True)
                w, cols, _ = operands(xs, weight)
            gw = g.matmul(cols.transpose(-1, -2)).reshape(weight.shape) if need_w else None
            gx = None
            if need_x:
                gcols = w.transpose(-1, -2).matmul(g)
                (gx,) = autograd_grad(cols, xs, gcols, create_graph=create)
            return gx, gw

        _record(out, "ConvGemm", (x, weight), (x, weight), backward)
    return out, out_size


def _conv_transposend(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride,
    padding,
    output_padding,
    groups: int,
    dilation,
    nd: int,
) -> Tensor:
    where = f"conv_transpose{nd}d"
    x, unbatched = _check_input(x, nd, where)
    if weight.ndim != nd + 2:
        raise ShapeError(f"{where}: weight must be {nd + 2}-d (in, out/groups, *kernel), got shape {weight.shape}")
    c_in, c_out_g = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    n = x.shape[0]
    if x.shape[1] != c_in:
        raise ShapeError(f"{where}: input has {x.shape[1]} channels, the weight {tuple(weight.shape)} expects {c_in}")
    if groups < 1 or c_in % groups:
        raise FlowError(f"{where}: groups={groups} must divide in_channels ({c_in})")
    stride = _ntuple(stride, nd, "stride", where)
    dilation = _ntuple(dilation, nd, "dilation", where)
    padding = _ntuple(padding, nd, "padding", where)
    output_padding = _ntuple(output_padding, nd, "output_padding", where)
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= max(s, d):
            raise FlowError(
                f"{where}: output_padding {output_padding} must be smaller than stride {stride} or dilation {dilation}"
            )
    k = math.prod(kernel)
    c_in_g = c_in // groups
    in_size = tuple(x.shape[2:])
    length = n * math.prod(in_size)
    c_out = c_out_g * groups
    full = tuple((i - 1) * s + d * (kk - 1) + 1 for i, s, d, kk in zip(in_size, stride, dilation, kernel))
    out_full = tuple(f - 2 * p + op for f, p, op in zip(full, padding, output_padding))
    # Native: the transposed convolution is the input gradient D of the convolution it transposes (whose input
    # is this output). With output_padding >= stride that convolution would see one more window than this
    # input has, so those (rare) shapes take the path below.
    if (all(o > 0 for o in out_full) and all(op < s for op, s in zip(output_padding, stride))
            and _native_ok(x, weight, [(0, 0)] * nd, "constant", nd)):
        out = _native_input_grad(x, weight, (n, c_out) + out_full, (stride, padding, dilation, groups))
        if bias is not None:
            out = out + bias.reshape((1, c_out) + (1,) * nd)
        return out.squeeze(0) if unbatched else out
    if (x._backend.conv_batch_last and groups == 1 and STATE.autocast is None and weight.dtype is x.dtype
            and weight._backend is x._backend):
        # Batch last, as _convnd: the input is kept for backward as a view (the (C_in, N*L) GEMM operand of the
        # path below is a relaid-out copy), and the col2im adds run over out[-1] * N elements
        to_last = (1,) + tuple(range(2, nd + 2)) + (0,)
        crop = [(p, p - op) for p, op in zip(padding, output_padding)]  # taken off each side of ``full``
        inner = [(0, 0) if any(hi < 0 for _, hi in crop) else c for c in crop]  # cropped inside the node
        out = _conv_transpose_gemm(x.permute(to_last), weight.reshape(c_in, c_out * k), kernel, stride, dilation,
                                   full, inner).permute((nd + 1, 0) + tuple(range(1, nd + 1)))
        out = _pad_spatial(out, [(i - c, i_hi - c_hi) for (c, c_hi), (i, i_hi) in zip(crop, inner)])
        if bias is not None:
            out = out + bias.reshape((1, c_out) + (1,) * nd)
        return out.squeeze(0) if unbatched else out
    xt = x.transpose(0, 1)  # (C_in, N, *in): one GEMM per group, as in _convnd
    if groups > 1:
        xr = xt.reshape(groups, c_in_g, length)
        w = weight.reshape(groups, c_in_g, c_out_g * k)
    else:
        xr = xt.reshape(c_in, length)
        w = weight.reshape(c_in, c_out_g * k)
    cols = w.transpose(-1, -2).matmul(xr).reshape((c_out, k, n) + in_size)
    out = _fold_windows(cols, (c_out, n) + full, kernel, stride, dilation, axis=1).transpose(0, 1)
    out = _pad_spatial(out, [(-p, op - p) for p, op in zip(padding, output_padding)])
    if bias is not None:
        out = out + bias.reshape((1, c_out) + (1,) * nd)
    return out.squeeze(0) if unbatched else out


def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> Tensor:
    """1-d convolution (cross-correlation) of ``(N, C_in, L)`` with ``(C_out, C_in/groups, k)``."""
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> Tensor:
    """2-d convolution of ``(N, C_in, H, W)`` with ``(C_out, C_in/groups, kH, kW)``.

    ``padding`` is an int, a tuple, ``'valid'`` or ``'same'``::

        y = F.conv2d(x, w, b, stride=2, padding=1)
    """
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 2)


def conv3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> Tensor:
    """3-d convolution of ``(N, C_in, D, H, W)`` with ``(C_out, C_in/groups, kD, kH, kW)``."""
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 3)


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
) -> Tensor:
    """1-d transposed convolution; ``weight`` is ``(C_in, C_out/groups, k)`` (PyTorch's layout)."""
    return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 1)


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
) -> Tensor:
    """2-d transposed convolution (the gradient of ``conv2d`` with respect to its input)."""
    return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 2)


def conv_transpose3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
) -> Tensor:
    """3-d transposed convolution."""
    return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 3)


# ---------------------------------------------------------------------- modules
class _ConvNd(Module):
    """Shared constructor, initialisation and repr of the convolution modules."""

    _nd = 0
    _transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        output_padding=0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        nd = self._nd
        name = type(self).__name__
        if groups < 1 or in_channels % groups:
            raise FlowError(f"{name}: in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups:
            raise FlowError(f"{name}: out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise FlowError(
                f"{name}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {padding_mode!r}"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size", name)
        self.stride = _ntuple(stride, nd, "stride", name)
        self.dilation = _ntuple(dilation, nd, "dilation", name)
        if isinstance(padding, str):
            if self._transposed:
                raise FlowError(f"{name}: padding must be an int or a tuple, got {padding!r}")
            _padding_widths(padding, self.kernel_size, self.dilation, self.stride, nd, name)  # validates
            self.padding = padding
        else:
            self.padding = _ntuple(padding, nd, "padding", name)
        self.output_padding = _ntuple(output_padding, nd, "output_padding", name)
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = self._transposed
        if self._transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(empty(*shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: Kaiming-uniform(a=sqrt(5)) weight, bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        nd = self._nd
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ):
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            0,
            device,
            dtype,
        )

    def forward(self, input: Tensor) -> Tensor:
        return _convnd(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self._nd,
            self.padding_mode,
        )


class Conv1d(_Conv):
    """1-d convolution over ``(N, C_in, L)``: PyTorch's arguments and defaults::

    conv = nn.Conv1d(4, 8, kernel_size=3, padding=1)
    """

    _nd = 1


class Conv2d(_Conv):
    """2-d convolution over ``(N, C_in, H, W)`` (``stride``, ``padding`` int/tuple/'same'/'valid',
    ``dilation``, ``groups``, ``bias``, ``padding_mode`` zeros/reflect/replicate/circular)::

        conv = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1)
    """

    _nd = 2


class Conv3d(_Conv):
    """3-d convolution over ``(N, C_in, D, H, W)``."""

    _nd = 3


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ):
        if padding_mode != "zeros":
            raise FlowError(f"{type(self).__name__}: only padding_mode='zeros' is supported, got {padding_mode!r}")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            output_padding,
            device,
            dtype,
        )

    def _output_padding(self, input: Tensor, output_size) -> tuple[int, ...]:
        if output_size is None:
            return self.output_padding
        nd = self._nd
        output_size = tuple(output_size)[-nd:]
        if len(output_size) != nd:
            raise FlowError(f"{type(self).__name__}: output_size needs {nd} spatial sizes, got {output_size}")
        extra = []
        for i in range(nd):
            smallest = (
                (input.shape[-nd + i] - 1) * self.stride[i]
                - 2 * self.padding[i]
                + self.dilation[i] * (self.kernel_size[i] - 1)
                + 1
            )
            e = output_size[i] - smallest
            if not 0 <= e < max(self.stride[i], self.dilation[i]):
                raise FlowError(
                    f"{type(self).__name__}: requested output_size {output_size} is not reachable; "
                    f"dim {i} must be in [{smallest}, {smallest + self.stride[i] - 1}]"
                )
            extra.append(e)
        return tuple(extra)

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        return _conv_transposend(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self._output_padding(input, output_size),
            self.groups,
            self.dilation,
            self._nd,
        )


class ConvTranspose1d(_ConvTranspose):
    """1-d transposed convolution (weight ``(C_in, C_out/groups, k)``)::

    up = nn.ConvTranspose1d(8, 4, kernel_size=4, stride=2, padding=1)
    """

    _nd = 1


class ConvTranspose2d(_ConvTranspose):
    """2-d transposed convolution (``output_padding`` resolves the output-size ambiguity of strides)::

    up = nn.ConvTranspose2d(16, 8, kernel_size=3, stride=2, padding=1, output_padding=1)
    """

    _nd = 2


class ConvTranspose3d(_ConvTranspose):
    """3-d transposed convolution."""

    _nd = 3
