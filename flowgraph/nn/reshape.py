"""Reshaping layers: ``Flatten``, ``Unflatten``, ``PixelShuffle``, ``PixelUnshuffle``, ``ChannelShuffle``,
``Upsample`` (``interpolate``), ``Unfold``/``Fold`` (im2col/col2im) and the padding layers.

``unfold``/``fold`` are convolution's window primitive and its adjoint (``conv._windows``/``_fold_windows``)
with the ``(N, C*K, L)`` layout PyTorch uses. ``interpolate`` resizes one spatial dim at a time: nearest
modes are one ``index_select``; linear modes gather the two neighbours and blend them with constant weights
(computed in float32 on the host, as PyTorch's kernels do), so bilinear and trilinear are the same code.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FlowError, ShapeError
from ..tensor import Tensor, tensor
from ..tensor import pad as _pad
from .conv import _fold_windows, _im2col, _ntuple, _pad_spatial
from .module import Module

__all__ = [
    "Flatten", "Unflatten", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Upsample",
    "UpsamplingNearest2d", "UpsamplingBilinear2d", "Unfold", "Fold", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d",
]  # fmt: skip
__functional__ = ["pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "interpolate", "upsample", "unfold",
                  "fold", "pad"]  # fmt: skip


# ---------------------------------------------------------------------- pixel and channel shuffles
def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """``(*, C*r*r, H, W) -> (*, C, H*r, W*r)``."""
    r = upscale_factor
    if input.ndim < 3:
        raise ShapeError(f"pixel_shuffle: expected at least 3 dims (*, C, H, W), got shape {input.shape}")
    *lead, c, h, w = input.shape
    if r < 1 or c % (r * r):
        raise ShapeError(f"pixel_shuffle: channels ({c}) must be divisible by upscale_factor^2 ({r * r})")
    nl = len(lead)
    x = input.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    x = x.permute(tuple(range(nl)) + (nl, nl + 3, nl + 1, nl + 4, nl + 2))
    return x.reshape(tuple(lead) + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """``(*, C, H*r, W*r) -> (*, C*r*r, H, W)`` (the inverse of ``pixel_shuffle``)."""
    r = downscale_factor
    if input.ndim < 3:
        raise ShapeError(f"pixel_unshuffle: expected at least 3 dims (*, C, H, W), got shape {input.shape}")
    *lead, c, h, w = input.shape
    if r < 1 or h % r or w % r:
        raise ShapeError(f"pixel_unshuffle: height ({h}) and width ({w}) must be divisible by {r}")
    nl = len(lead)
    x = input.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    x = x.permute(tuple(range(nl)) + (nl, nl + 2, nl + 4, nl + 1, nl + 3))
    return x.reshape(tuple(lead) + (c * r * r, h // r, w // r))


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """Interleave the channels of ``groups`` groups: ``(N, g*k, *) -> (N, k*g, *)`` (ShuffleNet)."""
    n, c = input.shape[:2]
    if groups < 1 or c % groups:
        raise ShapeError(f"channel_shuffle: channels ({c}) must be divisible by groups ({groups})")
    rest = tuple(input.shape[2:])
    return input.reshape((n, groups, c // groups) + rest).transpose(1, 2).reshape(input.shape)


# ---------------------------------------------------------------------- interpolation
_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
_CUBIC_A = -0.75  # PyTorch's (and OpenCV's) cubic convolution coefficient


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """The four cubic-convolution weights for taps at offsets -1, 0, 1, 2 from ``floor(src)``."""
    a = np.float32(_CUBIC_A)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    one = np.float32(1)
    return [far(t + one), near(t), near(one - t), far(2 * one - t)]


def _output_sizes(x: Tensor, size, scale_factor, nd: int) -> tuple[tuple[int, ...], tuple | None]:
    if (size is None) == (scale_factor is None):
        raise FlowError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (
            _ntuple(size, nd, "size", "interpolate")
            if not isinstance(size, (tuple, list)) or len(size) != 1
            else (int(size[0]),) * nd
        )
        return tuple(int(s) for s in sizes), None
    scales = (scale_factor,) * nd if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if len(scales) != nd:
        raise FlowError(f"interpolate: scale_factor needs {nd} values for a {nd + 2}-d input, got {scale_factor}")
    sizes = tuple(int(math.floor(n * float(s))) for n, s in zip(x.shape[2:], scales))
    return sizes, tuple(float(s) for s in scales)


def _coord_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.float32:
    """PyTorch's ``area_pixel_compute_scale`` in float32."""
    if align_corners:
        return np.float32((n_in - 1) / (n_out - 1)) if n_out > 1 else np.float32(0)
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(n_in / n_out)


def _resize_dim(x: Tensor, dim: int, n_out: int, mode: str, align_corners: bool, scale: float | None) -> Tensor:
    n_in = x.shape[dim]
    dst = np.arange(n_out, dtype=np.float32)
    s = _coord_scale(n_in, n_out, align_corners, scale)
    if mode in ("nearest", "nearest-exact"):
        src = dst * s if mode == "nearest" else (dst + np.float32(0.5)) * s
        idx = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        factor = n_out // n_in
        if n_out == factor * n_in and np.array_equal(idx, np.arange(n_out) // factor):
            return x.repeat_interleave(factor, dim)  # integer upscaling: expand + reshape, gradient a sum
        return x.index_select(dim, tensor(idx, device=x.device))
    if mode == "bicubic":  # four clamped taps; the source coordinate is not clamped (PyTorch's cubic rule)
        src = dst * s if align_corners else (dst + np.float32(0.5)) * s - np.float32(0.5)
        base = np.floor(src)
        weights = _cubic_weights((src - base).astype(np.float32))
        shape = [1] * x.ndim
        shape[dim] = n_out
        out = None
        for tap, w in zip(range(-1, 3), weights):
            idx = np.clip(base.astype(np.int64) + tap, 0, n_in - 1)
            term = x.index_select(dim, tensor(idx, device=x.device)) * tensor(
                w.reshape(shape), dtype=x.dtype, device=x.device
            )
            out = term if out is None else out + term
        return out
    src = dst * s if align_corners else np.maximum((dst + np.float32(0.5)) * s - np.float32(0.5), np.float32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = (src - i0.astype(np.float32)).astype(np.float32)
    shape = [1] * x.ndim
    shape[dim] = n_out
    weight = tensor(lam.reshape(shape), dtype=x.dtype, device=x.device)
    a = x.index_select(dim, tensor(i0, device=x.device))
    b = x.index_select(dim, tensor(i1, device=x.device))
    return a + (b - a) * weight


def interpolate(
    input: Tensor,
    size=None,
    scale_factor=None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Resize the spatial dims of ``(N, C, *spatial)``: modes ``nearest``, ``nearest-exact``, ``linear``,
    ``bilinear``, ``bicubic``, ``trilinear``, ``area``; ``size`` or ``scale_factor`` as in PyTorch::

        y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    """
    nd = input.ndim - 2
    if nd < 1:
        raise ShapeError(f"interpolate: expected an input of at least 3 dims (N, C, *spatial), got {input.shape}")
    if antialias:
        raise FlowError("interpolate: antialias=True is not supported")
    if mode in _LINEAR_MODES:
        if _LINEAR_MODES[mode] != nd:
            raise ShapeError(
                f"interpolate: mode {mode!r} needs a {_LINEAR_MODES[mode] + 2}-d input, got shape {input.shape}"
            )
        align_corners = bool(align_corners)
    elif mode in ("nearest", "nearest-exact", "area"):
        if align_corners is not None:
            raise FlowError(
                "interpolate: align_corners can only be set with the interpolating modes "
                "(linear, bilinear, bicubic, trilinear)"
            )
    else:
        raise FlowError(
            f"interpolate: unsupported mode {mode!r}; use nearest, nearest-exact, linear, bilinear, "
            "bicubic, trilinear or area"
        )
    sizes, scales = _output_sizes(input, size, scale_factor, nd)
    if any(s <= 0 for s in sizes):
        raise FlowError(f"interpolate: output sizes must be positive, got {sizes}")
    if mode == "area":
        from .pooling import _adaptive_avg_poolnd

        return _adaptive_avg_poolnd(input, sizes, nd)
    if recompute_scale_factor:
        scales = None
    out = input
    for i, n_out in enumerate(sizes):
        if n_out == input.shape[2 + i] and (scales is None or scales[i] == 1.0):
            continue
        out = _resize_dim(out, 2 + i, n_out, mode, bool(align_corners), None if scales is None else scales[i])
    return out


def upsample(
    input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None
) -> Tensor:
    """``interpolate`` under its older name."""
    return interpolate(input, size, scale_factor, mode, align_corners)


# ---------------------------------------------------------------------- unfold / fold
def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sliding local blocks (im2col): ``(N, C, H, W) -> (N, C*kH*kW, L)``; ``L`` is the number of windows."""
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 4:
        raise ShapeError(f"unfold: expected a 3-d or 4-d input (N, C, H, W), got shape {input.shape}")
    kernel = _ntuple(kernel_size, 2, "kernel_size", "unfold")
    dilation = _ntuple(dilation, 2, "dilation", "unfold")
    stride = _ntuple(stride, 2, "stride", "unfold")
    widths = [(p, p) for p in _ntuple(padding, 2, "padding", "unfold")]
    cols, out = _im2col(x, kernel, stride, dilation, widths, where="unfold")
    n, c = x.shape[:2]
    result = cols.reshape(n, c * math.prod(kernel), math.prod(out))
    return result.squeeze(0) if unbatched else result


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sum sliding blocks back into an image (col2im): ``(N, C*kH*kW, L) -> (N, C, *output_size)``.

    ``fold(unfold(x))`` multiplies each pixel by the number of windows that cover it.
    """
    unbatched = input.ndim == 2
    x = input.unsqueeze(0) if unbatched else input
    if x.ndim != 3:
        raise ShapeError(f"fold: expected a 2-d or 3-d input (N, C*K, L), got shape {input.shape}")
    size = _ntuple(output_size, 2, "output_size", "fold")
    kernel = _ntuple(kernel_size, 2, "kernel_size", "fold")
    dilation = _ntuple(dilation, 2, "dilation", "fold")
    stride = _ntuple(stride, 2, "stride", "fold")
    padding = _ntuple(padding, 2, "padding", "fold")
    padded = tuple(s + 2 * p for s, p in zip(size, padding))
    out = tuple((n - d * (k - 1) - 1) // st + 1 for n, k, st, d in zip(padded, kernel, stride, dilation))
    n, ck, length = x.shape
    k = math.prod(kernel)
    if ck % k or length != math.prod(out) or any(o <= 0 for o in out):
        raise ShapeError(
            f"fold: input of shape {tuple(input.shape)} does not match output_size {size}, kernel {kernel}, "
            f"stride {stride}, padding {padding}, dilation {dilation}: expected (N, C*{k}, {math.prod(out)})"
        )
    cols = x.reshape((n, ck // k, k) + out)
    result = _fold_windows(cols, (n, ck // k) + padded, kernel, stride, dilation)
    result = _pad_spatial(result, [(-p, -p) for p in padding])
    return result.squeeze(0) if unbatched else result


def pad(input: Tensor, pad: tuple[int, ...], mode: str = "constant", value: float | None = None) -> Tensor:
    """PyTorch's ``F.pad``: (left, right) widths from the last dim backwards; modes constant, reflect,
    replicate, circular."""
    return _pad(input, pad, mode, 0.0 if value is None else value)


# ---------------------------------------------------------------------- modules
class Flatten(Module):
    """Flatten dims ``start_dim..end_dim`` (default 1..-1, keeping the batch)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input: Tensor) -> Tensor:
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size``: ``nn.Unflatten(1, (C, H, W))``."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        sizes = tuple(unflattened_size) if isinstance(unflattened_size, (tuple, list)) else None
        if sizes is None or not sizes or any(isinstance(s, bool) or not isinstance(s, int) for s in sizes) \
                or any(s < -1 for s in sizes) or sizes.count(-1) > 1:
            raise FlowError(f"Unflatten: unflattened_size must be a non-empty tuple of ints >= 0 (one may be -1), "
                            f"got {unflattened_size!r}")
        self.dim = dim
        self.unflattened_size = sizes

    def forward(self, input: Tensor) -> Tensor:
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class PixelShuffle(Module):
    """``(*, C*r*r, H, W) -> (*, C, H*r, W*r)`` (sub-pixel convolution upsampling)."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input: Tensor) -> Tensor:
        return pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``(*, C, H*r, W*r) -> (*, C*r*r, H, W)``."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input: Tensor) -> Tensor:
        return pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
    """Interleave the channels of ``groups`` groups."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, input: Tensor) -> Tensor:
        return channel_shuffle(input, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


class Upsample(Module):
    """Resize spatial dims: ``nn.Upsample(scale_factor=2, mode='bilinear', align_corners=False)``."""

    def __init__(
        self,
        size=None,
        scale_factor=None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        self.scale_factor = (
            float(scale_factor)
            if isinstance(scale_factor, (int, float))
            else (tuple(float(s) for s in scale_factor) if scale_factor is not None else None)
        )
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input: Tensor) -> Tensor:
        return interpolate(
            input, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )

    def extra_repr(self) -> str:
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """``Upsample(mode='nearest')`` for 4-d inputs."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """``Upsample(mode='bilinear', align_corners=True)`` for 4-d inputs."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class Unfold(Module):
    """Extract sliding blocks: ``nn.Unfold(kernel_size, dilation=1, padding=0, stride=1)``."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        return unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, stride={self.stride}"


class Fold(Module):
    """Sum sliding blocks into an image::

    nn.Fold(output_size, kernel_size, dilation=1, padding=0, stride=1)
    """

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size = output_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        return fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"padding={self.padding}, stride={self.stride}"
        )


class _PadNd(Module):
    _nd = 0
    _mode = "constant"

    def __init__(self, padding, value: float = 0.0):
        super().__init__()
        nd = self._nd
        if isinstance(padding, int):
            padding = (padding,) * (2 * nd)
        padding = tuple(padding)
        if len(padding) != 2 * nd or not all(isinstance(p, int) for p in padding):
            raise FlowError(f"{type(self).__name__}: padding must be an int or {2 * nd} ints, got {padding}")
        self.padding = padding
        self.value = value

    def forward(self, input: Tensor) -> Tensor:
        return _pad(input, self.padding, self._mode, self.value)

    def extra_repr(self) -> str:
        if self._mode == "constant" and not type(self).__name__.startswith("Zero"):
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


def _pad_class(name: str, nd: int, mode: str, doc: str, constant: bool = False):
    def __init__(self, padding, value: float = 0.0):
        _PadNd.__init__(self, padding, value)

    def zero_init(self, padding):
        _PadNd.__init__(self, padding, 0.0)

    attrs = {
        "_nd": nd,
        "_mode": mode,
        "__doc__": doc,
        "__module__": __name__,
        "__init__": __init__ if constant else zero_init,
    }
    return type(name, (_PadNd,), attrs)


ZeroPad1d = _pad_class("ZeroPad1d", 1, "constant", "Pad the last dim with zeros: ``nn.ZeroPad1d((left, right))``.")
ZeroPad2d = _pad_class("ZeroPad2d", 2, "constant", "Pad the last 2 dims with zeros (left, right, top, bottom).")
ZeroPad3d = _pad_class("ZeroPad3d", 3, "constant", "Pad the last 3 dims with zeros.")
ConstantPad1d = _pad_class("ConstantPad1d", 1, "constant", "Pad the last dim with ``value``.", True)
ConstantPad2d = _pad_class("ConstantPad2d", 2, "constant", "Pad the last 2 dims with ``value``.", True)
ConstantPad3d = _pad_class("ConstantPad3d", 3, "constant", "Pad the last 3 dims with ``value``.", True)
ReflectionPad1d = _pad_class("ReflectionPad1d", 1, "reflect", "Pad the last dim by reflection.")
ReflectionPad2d = _pad_class("ReflectionPad2d", 2, "reflect", "Pad the last 2 dims by reflection.")
ReflectionPad3d = _pad_class("ReflectionPad3d", 3, "reflect", "Pad the last 3 dims by reflection.")
ReplicationPad1d = _pad_class("ReplicationPad1d", 1, "replicate", "Pad the last dim by repeating the edge.")
ReplicationPad2d = _pad_class("ReplicationPad2d", 2, "replicate", "Pad the last 2 dims by repeating the edge.")
ReplicationPad3d = _pad_class("ReplicationPad3d", 3, "replicate", "Pad the last 3 dims by repeating the edge.")
CircularPad1d = _pad_class("CircularPad1d", 1, "circular", "Pad the last dim circularly.")
CircularPad2d = _pad_class("CircularPad2d", 2, "circular", "Pad the last 2 dims circularly.")
CircularPad3d = _pad_class("CircularPad3d", 3, "circular", "Pad the last 3 dims circularly.")
