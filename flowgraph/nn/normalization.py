"""Normalization: ``BatchNorm1d/2d/3d``, ``LayerNorm``, ``GroupNorm``, ``InstanceNorm1d/2d/3d``, ``RMSNorm``.

Group and instance norm standardise over some axes through one graph node,
``_standardize(x, axes, eps, weight, bias)``, whose forward runs on backend primitives (one mean, one
variance, one scale, the affine) and whose backward is the closed form
``rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with ``gy = g * weight`` (plus the weight and bias
reductions), written in tensor ops. Under ``create_graph`` the backward rebuilds ``xhat`` from ``x`` with
differentiable ops, so second derivatives are right too.

Batch norm in training has a node of its own, ``_batch_norm_train``, on the backend's ``batch_norm`` /
``batch_norm_backward`` (two kernels each way on CUDA and OpenCL, which also update the running statistics):
it saves ``x`` and the per-channel ``mean``/``rstd``, as PyTorch does.

Layer norm has a node of its own, ``_layer_norm``, on the backend's ``layer_norm``/``layer_norm_backward``
(one kernel forward and one backward on CUDA and OpenCL): it saves only ``x``, the per-row ``mean``/``rstd``
and the weight, as PyTorch does, and falls back to the same composed formula under ``create_graph``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..autograd.grad_mode import STATE, no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, empty, ones, tensor, zeros
from ..tensor.elementwise import sum_to
from ..tensor.indexing import apply_inplace
from ..tensor.tensor import _needs_grad, _record, _wrap
from . import init
from .module import Module, Parameter

__all__ = [
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "RMSNorm",
]  # fmt: skip
__functional__ = ["batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm", "normalize"]


# ---------------------------------------------------------------------- the shared node
def _standardize(
    x: Tensor, axes: tuple[int, ...], eps: float, weight: Tensor | None = None, bias: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``((x - mean) / sqrt(var + eps) * weight + bias, mean, var)`` over ``axes`` as one graph node.

    The variance is biased; ``mean``/``var`` come back detached. ``weight``/``bias`` (optional) broadcast
    against ``x`` (e.g. ``(C,)`` for layer norm, ``(1, C, 1, 1)`` for batch norm).
    """
    bk = x._backend
    d = x._data
    count = math.prod(d.shape[a] for a in axes)
    if count == 0:
        raise ShapeError(f"normalization over axes {axes} of an input of shape {x.shape} with no elements")
    wd = None if weight is None else (weight._data if weight.dtype == x.dtype else bk.cast(weight._data, d.dtype))
    bd = None if bias is None else (bias._data if bias.dtype == x.dtype else bk.cast(bias._data, d.dtype))
    y, mean, var, xhat, rstd = bk.standardize(d, axes, eps, wd, bd)
    out = _wrap(y, bk)
    if _needs_grad(x, weight, bias):
        has_w = weight is not None
        need_x, need_w = x.requires_grad, has_w and weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        w_shape = None if weight is None else tuple(weight.shape)
        b_shape = None if bias is None else tuple(bias.shape)

        def bw(g: Tensor, x: Tensor, *rest: Tensor):
            weight = rest[0] if has_w else None
            if STATE.enabled:  # create_graph: make the gradient itself differentiable in x
                return _standardize_grads_composed(g, x, axes, eps, weight, need_x, w_shape if need_w else None,
                                                   b_shape if need_b else None)
            xh, rs = rest[-2], rest[-1]
            if keep_mean:  # xhat was the output: recompute it from the saved mean
                xh = _wrap(g._backend.mul(g._backend.sub(x._data, xh._data), rs._data), g._backend)
            gbk = g._backend
            wd = None if weight is None else (weight._data if weight._data.dtype == g._data.dtype
                                              else gbk.cast(weight._data, g._data.dtype))
            grads = gbk.standardize_backward(g._data, xh._data, rs._data, wd, axes, need_x,
                                             w_shape if need_w else None, b_shape if need_b else None)
            return tuple(None if a is None else _wrap(a, gbk) for a in grads)

        # Backward recomputes xhat from x and the saved mean without an affine, where the output is xhat itself,
        # which an in-place op on the output (a following inplace ReLU) must not change under backward.
        # Otherwise xhat is kept: group and instance norm rows are short and the two passes saved count there
        # (batch norm, whose xhat would be a second input-sized tensor, has a node of its own that keeps none).
        keep_mean = y is xhat
        saved = (x,) + ((weight,) if has_w else ()) + (_wrap(mean if keep_mean else xhat, bk), _wrap(rstd, bk))
        _record(out, "Standardize", (x, weight, bias), saved, bw)
    return out, _wrap(mean, bk), _wrap(var, bk)


def _standardize_composed(x: Tensor, axes, eps: float) -> tuple[Tensor, Tensor]:
    mean = x.mean(axes, keepdim=True)
    centred = x - mean
    rstd = ((centred * centred).mean(axes, keepdim=True) + eps).rsqrt()
    return centred * rstd, rstd


def _standardize_grads_composed(g: Tensor, x: Tensor, axes: tuple[int, ...], eps: float, weight: Tensor | None,
                                need_x: bool, w_shape: tuple[int, ...] | None,
                                b_shape: tuple[int, ...] | None) -> tuple:
    """``(gx, gw, gb)`` of a standardization in differentiable tensor ops (the ``create_graph`` backward):
    ``gx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with ``gy = g * weight``, ``gw = sum_to(g * xhat)``,
    ``gb = sum_to(g)``, with ``xhat`` rebuilt from ``x`` (None where not asked)."""
    xh, rs = _standardize_composed(x, axes, eps)
    gx = gw = gb = None
    if need_x:
        gy = g if weight is None else g * weight
        gx = (gy - gy.mean(axes, keepdim=True) - xh * (gy * xh).mean(axes, keepdim=True)) * rs
    if w_shape is not None:
        gw = sum_to(g * xh, w_shape)
    if b_shape is not None:
        gb = sum_to(g, b_shape)
    return gx, gw, gb


def _layer_norm(x: Tensor, shape: tuple[int, ...], eps: float, weight: Tensor | None,
                bias: Tensor | None, residual: Tensor | None = None) -> Tensor:
    """Layer norm over the trailing dims ``shape`` as one graph node on ``Backend.layer_norm``.

    ``x`` is viewed as ``(rows, cols)``; ``weight``/``bias`` (shaped ``shape``, or None) are used in ``x``'s
    dtype. Backward reads ``x``, the per-row ``mean`` and ``rstd`` and the weight (``layer_norm_backward``);
    under ``create_graph`` it is the composed formula in tensor ops, differentiable again. With ``residual``
    (``x``'s shape, dtype and device) the result is ``residual + layer_norm(x)`` in one kernel
    (:func:`layer_norm_residual`), and the residual's gradient is the output's.
    """
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ShapeError(f"layer_norm: {name} has shape {tuple(t.shape)}; it must have the normalized_shape "
                             f"{shape}")
    cols = math.prod(shape)
    if cols == 0:
        raise ShapeError(f"layer_norm: normalized_shape {shape} has no elements; normalise over non-empty dims")
    rows = math.prod(x.shape) // cols
    x_shape = tuple(x.shape)
    bk = x._backend
    d = x._data
    y, mean, rstd = bk.layer_norm(_flat(x, bk, d.dtype, (rows, cols)), _flat(weight, bk, d.dtype, (cols,)),
                                  _flat(bias, bk, d.dtype, (cols,)), eps,
                                  None if residual is None else _flat(residual, bk, d.dtype, (rows, cols)))
    out = _wrap(_shaped(bk, y, x_shape), bk)
    if _needs_grad(x, weight, bias, residual):
        need_r = residual is not None and residual.requires_grad
        has_w = weight is not None
        need_x, need_w = x.requires_grad, has_w and weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        saved = (x, _wrap(mean, bk), _wrap(rstd, bk)) + ((weight,) if has_w else ())
        _record(out, "LayerNorm", (x, weight, bias, residual), saved,
                _layer_norm_backward(x_shape, shape, eps, need_x, need_w, need_b, need_r, has_w))
    return out


def _flat(t: Tensor | None, backend, dtype, size: tuple[int, ...]):
    """``t``'s array in ``dtype``, shaped ``size`` (None for None)."""
    if t is None:
        return None
    data = t._data if t._data.dtype == dtype else backend.cast(t._data, dtype)
    # no reshape when the shape is already right: a device reshape realizes a pending value, and the
    # kernels compute a pending input themselves (``LazyEngine._row_input``: the forward's input, a linear
    # layer's bias and activation; ``LazyEngine._pending_pair_sum``: the backward's sum of two gradients)
    return _shaped(backend, data, size)


def _shaped(backend, a, shape: tuple[int, ...]):
    """The backend array ``a`` with ``shape``: itself where it has it already (a 2-d input's rows, the common
    case), so no view is made on every call."""
    return a if tuple(a.shape) == shape else backend.reshape(a, shape)


@functools.lru_cache(maxsize=1024)
def _layer_norm_backward(x_shape: tuple, shape: tuple, eps: float, need_x: bool, need_w: bool, need_b: bool,
                         need_r: bool, has_w: bool):
    """``_layer_norm``'s backward, built once per layout and set of needed gradients: a closure made per call
    is a function, a tuple and a cell per captured value the cyclic collector tracks (see
    ``linear._linear_rows_backward``)."""
    cols = math.prod(shape)
    rows = math.prod(x_shape) // cols
    axes = tuple(range(len(x_shape) - len(shape), len(x_shape)))

    def bw(g: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, *rest: Tensor):
        weight = rest[0] if has_w else None
        gr = g if need_r else None  # the residual's gradient is the output's
        if not (need_x or need_w or need_b):  # only the residual asks
            return None, None, None, gr
        if STATE.enabled:  # create_graph: make the gradient itself differentiable in x
            return (*_standardize_grads_composed(g, x, axes, eps, weight, need_x, shape if need_w else None,
                                                 shape if need_b else None), gr)
        gbk = g._backend
        dtype = x._data.dtype
        gx, gw, gb = gbk.layer_norm_backward(
            _flat(g, gbk, dtype, (rows, cols)), _shaped(gbk, x._data, (rows, cols)), mean._data, rstd._data,
            _flat(weight, gbk, dtype, (cols,)), need_x, need_w, need_b)
        return (None if gx is None else _wrap(_shaped(gbk, gx, x_shape), gbk),
                None if gw is None else _wrap(_shaped(gbk, gw, shape), gbk),
                None if gb is None else _wrap(_shaped(gbk, gb, shape), gbk), gr)

    return bw


def layer_norm_residual(input: Tensor, module: LayerNorm, residual: Tensor) -> Tensor:
    """``residual + module(input)`` for a :class:`LayerNorm` ``module`` in one kernel on CUDA and OpenCL (the
    sum written in place of the normalised values: a residual block ending in a LayerNorm, as
    ``FlowBuilder.also`` runs one). Falls back to the two ops where the operands differ in shape, dtype or
    device. Hooks on ``module`` are the caller's business (``also`` takes this path only without them)."""
    shape = tuple(module.normalized_shape)
    k = len(shape)
    if (tuple(residual.shape) != tuple(input.shape) or residual.dtype != input.dtype
            or residual._backend is not input._backend or k == 0 or tuple(input.shape[input.ndim - k:]) != shape):
        return residual + module(input)
    return _layer_norm(input, shape, module.eps, module.weight, module.bias, residual)


def _batch_norm_train(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                      running_mean: Tensor | None, running_var: Tensor | None, momentum: float,
                      count: int, batches: Tensor | None = None) -> Tensor:
    """Batch norm with the batch's statistics as one graph node on ``Backend.batch_norm`` (two kernels on CUDA
    and OpenCL, the output left pending), which also updates the running buffers in place and counts the batch
    in ``batches`` (a layer's ``num_batches_tracked``, a plain buffer: ``_NormBase._batch_counter``); backward
    on ``Backend.batch_norm_backward`` from the saved input, mean and rstd (PyTorch's), or the composed
    formula, differentiable again, under ``create_graph``."""
    bk = x._backend
    d = x._data
    wd, bd = (None if t is None else (t._data if t.dtype == x.dtype else bk.cast(t._data, d.dtype))
              for t in (weight, bias))
    # buffers the backend writes as arrays: plain tensors (a view or a tensor that records autograd takes the
    # tensor-level in-place path below, from the statistics returned)
    direct = [r is not None and r._view is None and not r.requires_grad and r._backend is bk
              for r in (running_mean, running_var)]
    y, mean, var, rstd = bk.batch_norm(d, wd, bd, eps, running_mean._data if direct[0] else None,
                                       running_var._data if direct[1] else None, momentum,
                                       None if batches is None else batches._data)
    if batches is not None:
        batches._bump_version()
    unbias = count / max(count - 1, 1)
    for run, ok, stat, k in ((running_mean, direct[0], mean, 1.0), (running_var, direct[1], var, unbias)):
        if run is None:
            continue
        if ok:
            run._bump_version()
        else:
            _update_running(run, _wrap(stat, bk), momentum, k)
    out = _wrap(y, bk)
    if _needs_grad(x, weight, bias):
        has_w = weight is not None
        need_x, need_w = x.requires_grad, has_w and weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        saved = (x, _wrap(mean, bk), _wrap(rstd, bk)) + ((weight,) if has_w else ())
        _record(out, "BatchNorm", (x, weight, bias), saved,
                _batch_norm_backward(x.ndim, x.shape[1], eps, has_w, need_x, need_w, need_b))
    return out


@functools.lru_cache(maxsize=1024)
def _batch_norm_backward(nd: int, c: int, eps: float, has_w: bool, need_x: bool, need_w: bool, need_b: bool):
    """``_batch_norm_train``'s backward, built once per rank, channel count and set of needed gradients (see
    ``_layer_norm_backward``)."""
    axes = (0,) + tuple(range(2, nd))

    def bw(g: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, *rest: Tensor):
        weight = rest[0] if has_w else None
        if STATE.enabled:  # create_graph: make the gradient itself differentiable in x
            view = (1, c) + (1,) * (nd - 2)
            gx, gw, gb = _standardize_grads_composed(
                g, x, axes, eps, None if weight is None else _channel_view(weight, nd), need_x,
                view if need_w else None, view if need_b else None)
            return gx, None if gw is None else gw.reshape((c,)), None if gb is None else gb.reshape((c,))
        gbk = g._backend
        dtype = x._data.dtype
        wd = None if weight is None else (weight._data if weight._data.dtype == dtype
                                          else gbk.cast(weight._data, dtype))
        grads = gbk.batch_norm_backward(g._data if g._data.dtype == dtype else gbk.cast(g._data, dtype),
                                        x._data, mean._data, rstd._data, wd, need_x, need_w, need_b)
        return tuple(None if a is None else _wrap(a, gbk) for a in grads)

    return bw


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    """A per-channel ``(C,)`` tensor shaped ``(1, C, 1, ...)`` to broadcast over ``ndim`` dims."""
    return t.reshape((1, t.shape[0]) + (1,) * (ndim - 2))


def _affine(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """``y * weight + bias`` in ``y``'s dtype (float32 parameters do not promote a float16 input)."""
    if weight is not None:
        y = y * (weight if weight.dtype == y.dtype else weight.to(y.dtype))
    if bias is not None:
        y = y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))
    return y


def _write_buffer(buffer: Tensor, compute, op: str) -> None:
    """Write ``compute(data)`` (a backend array from the buffer's current backend array) into ``buffer`` in
    place, outside autograd: one in-place op whatever ``compute`` does (views rebased as any in-place op)."""
    with no_grad():
        apply_inplace(buffer, lambda t: _wrap(compute(t._data), t._backend), op)


def _update_running(running: Tensor | None, value: Tensor, momentum: float, scale: float = 1.0) -> None:
    """``running = (1 - momentum) * running + momentum * scale * value`` in place (``value`` detached, of
    ``running``'s size): one pending expression (``Backend.running_average``) and one write."""
    if running is None:
        return
    bk = running._backend
    v = value._data if tuple(value.shape) == tuple(running.shape) else bk.reshape(value._data, tuple(running.shape))
    _write_buffer(running, lambda r: bk.running_average(r, v, momentum, scale), "running statistics update")


# ---------------------------------------------------------------------- functional forms
def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each channel (dim 1) over the batch and spatial dims.

    In training (or without running statistics) the batch statistics are used and, when given, the
    running buffers are updated in place (``running = (1 - momentum) * running + momentum * batch``, the
    variance unbiased). Otherwise the running statistics are used.
    """
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                bias: Tensor | None, training: bool, momentum: float, eps: float,
                batches: Tensor | None = None) -> Tensor:
    """``batch_norm``, and in training the batch counted in ``batches`` (the layers' path: see
    ``_NormBase._batch_counter``)."""
    if input.ndim < 2:
        raise ShapeError(f"batch_norm: expected an input of at least 2 dims (N, C, ...), got shape {input.shape}")
    nd = input.ndim
    c = input.shape[1]
    for name, t in (
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ):
        if t is not None and t.numel() != c:
            raise ShapeError(f"batch_norm: {name} has {t.numel()} elements, the input has {c} channels")
    if training or running_mean is None or running_var is None:
        axes = (0,) + tuple(range(2, nd))
        count = math.prod(input.shape[a] for a in axes)
        if training and count <= 1:
            raise FlowError(
                f"batch_norm: expected more than 1 value per channel when training, got input shape {input.shape}"
            )
        if not training:
            running_mean = running_var = None
            batches = None
        return _batch_norm_train(input, weight, bias, eps, running_mean, running_var, momentum, count, batches)
    w = None if weight is None else _channel_view(weight, nd)
    b = None if bias is None else _channel_view(bias, nd)
    scale = _channel_view((running_var.detach() + eps).rsqrt(), nd)
    shift = _channel_view(running_mean.detach(), nd)
    if w is not None:
        scale = scale * w
    dtype = input.dtype  # float32 statistics must not promote a float16 input
    out = (input - shift.to(dtype)) * scale.to(dtype)
    return out + b.to(dtype) if b is not None else out


def layer_norm(
    input: Tensor,
    normalized_shape,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale and shift elementwise."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or tuple(input.shape[input.ndim - k :]) != shape:
        raise ShapeError(
            f"layer_norm: normalized_shape {shape} does not match the trailing dims of the input {input.shape}"
        )
    return _layer_norm(input, shape, eps, weight, bias)


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each of ``num_groups`` channel groups over its channels and spatial dims."""
    if input.ndim < 2:
        raise ShapeError(f"group_norm: expected an input of at least 2 dims (N, C, ...), got shape {input.shape}")
    n, c = input.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise FlowError(f"group_norm: num_groups ({num_groups}) must divide the number of channels ({c})")
    grouped = input.reshape(n, num_groups, -1)
    y, _, _ = _standardize(grouped, (2,), eps)
    y = y.reshape(input.shape)
    nd = input.ndim
    return _affine(
        y,
        None if weight is None else _channel_view(weight, nd),
        None if bias is None else _channel_view(bias, nd),
    )


def instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each (sample, channel) plane over its spatial dims."""
    if input.ndim < 3:
        raise ShapeError(
            f"instance_norm: expected an input of at least 3 dims (N, C, *spatial), got shape {input.shape}"
        )
    nd = input.ndim
    w = None if weight is None else _channel_view(weight, nd)
    b = None if bias is None else _channel_view(bias, nd)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise FlowError("instance_norm: use_input_stats=False needs running_mean and running_var")
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    axes = tuple(range(2, nd))
    count = math.prod(input.shape[a] for a in axes)
    y, mean, var = _standardize(input, axes, eps, w, b)
    if running_mean is not None:
        _update_running(running_mean, mean.mean(0), momentum)
    if running_var is not None:
        _update_running(running_var, (var * (count / max(count - 1, 1))).mean(0), momentum)
    return y


def _finfo_eps(t: Tensor) -> float:
    return float(np.finfo(t.dtype.np).eps)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing dims (``eps=None``: the dtype's epsilon)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or tuple(input.shape[input.ndim - k :]) != shape:
        raise ShapeError(
            f"rms_norm: normalized_shape {shape} does not match the trailing dims of the input {input.shape}"
        )
    if eps is None:
        eps = _finfo_eps(input)
    axes = tuple(range(input.ndim - k, input.ndim))
    y = input * ((input * input).mean(axes, keepdim=True) + eps).rsqrt()
    return _affine(y, weight, None)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_p, eps)`` along ``dim``."""
    return input / input.norm(p, dim, keepdim=True).clamp(min=eps).expand_as(input)


# ---------------------------------------------------------------------- modules
class _NormBase(Module):
    """Running statistics and affine parameters shared by batch and instance norm."""

    _expected: tuple[int, ...] = ()
    _name = ""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(empty(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        if affine and bias:
            self.bias = Parameter(empty(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0, dtype="int64", device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Zero the running mean, set the running variance to 1 and the batch count to 0."""
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1.0)
                self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset running statistics; weight 1, bias 0."""
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _check_input(self, input: Tensor) -> None:
        if input.ndim not in self._expected:
            want = " or ".join(f"{d}-d" for d in self._expected)
            raise ShapeError(f"{type(self).__name__}: expected a {want} input, got shape {input.shape}")

    def _batch_counter(self, input: Tensor) -> Tensor | None:
        """``num_batches_tracked`` where the forward counts the batch in the backend call that updates the
        running statistics (``Backend.batch_norm``'s ``batches``; on CUDA and OpenCL its statistics kernel, no
        launch of its own): in training with a fixed ``momentum``, a plain buffer (no view, no autograd) on
        ``input``'s backend, a lazy one (CUDA, OpenCL: the write lands in the buffer itself). None where
        ``_factor`` counts it (a cumulative average reads the count back)."""
        count = self.num_batches_tracked
        if (count is None or not self.training or not self.track_running_stats or self.momentum is None
                or count._view is not None or count.requires_grad or count._backend is not input._backend
                or not count._backend.defers_elementwise):
            return None
        return count

    def _factor(self) -> float:
        """The running-average factor for this step (``momentum``, or ``1/n`` for a cumulative average)."""
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            count = self.num_batches_tracked
            _write_buffer(count, lambda n: count._backend.add(n, 1), "num_batches_tracked update")
            if self.momentum is None:
                return 1.0 / float(count.item())
        return 0.0 if self.momentum is None else self.momentum

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class _BatchNorm(_NormBase):
    def forward(self, input: Tensor) -> Tensor:
        self._check_input(input)
        batches = self._batch_counter(input)
        factor = self._factor() if batches is None else self.momentum
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return _batch_norm(
            input,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            use_batch,
            factor,
            self.eps,
            batches,
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalization of ``(N, C)`` or ``(N, C, L)``: PyTorch's arguments, buffers and update rule::

    bn = nn.BatchNorm1d(16)              # momentum=0.1; momentum=None for a cumulative average
    """

    _expected = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of ``(N, C, H, W)`` (running statistics in ``running_mean``/``running_var``)."""

    _expected = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalization of ``(N, C, D, H, W)``."""

    _expected = (5,)


class _InstanceNorm(_NormBase):
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input(input)
        unbatched = input.ndim == self._expected[0]
        if unbatched:
            input = input.unsqueeze(0)
        factor = 0.0 if self.momentum is None else self.momentum  # PyTorch does not count batches here
        use_input_stats = self.training or not self.track_running_stats
        out = instance_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            use_input_stats,
            factor,
            self.eps,
        )
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of ``(N, C, L)`` (or unbatched ``(C, L)``); ``affine=False`` by default."""

    _expected = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of ``(N, C, H, W)`` (or unbatched ``(C, H, W)``)."""

    _expected = (3, 4)


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of ``(N, C, D, H, W)`` (or unbatched)."""

    _expected = (4, 5)


def _normalized_shape(normalized_shape, where: str) -> tuple[int, ...]:
    """``normalized_shape`` (an int or a sequence of ints >= 0) as a tuple; a FlowError naming it otherwise."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    if not isinstance(shape, (tuple, list)) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                                                   for s in shape):
        raise FlowError(f"{where}: normalized_shape must be an int or a tuple of ints >= 0, got {normalized_shape!r}")
    return tuple(shape)


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims::

    ln = nn.LayerNorm(64)                       # elementwise_affine=True, bias=True, eps=1e-5
    """

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        shape = _normalized_shape(normalized_shape, type(self).__name__)
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(*shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(zeros(*shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """Weight 1, bias 0."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class GroupNorm(Module):
    """Group normalization: ``nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True)``."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ):
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise FlowError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(ones(num_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        if affine and bias:
            self.bias = Parameter(zeros(num_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """Weight 1, bias 0."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """Root-mean-square normalization: ``nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True)``.

    ``eps=None`` uses the machine epsilon of the input's dtype, as PyTorch does.
    """

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        shape = _normalized_shape(normalized_shape, type(self).__name__)
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(*shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        """Weight 1."""
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
