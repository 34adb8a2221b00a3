"""``Linear`` (and its functional form lives in ``nn.functional.linear``)."""

from __future__ import annotations

import math

from ..autograd.grad_mode import STATE, no_grad
from ..autograd.node import ColumnSumGrad, MatmulGrad
from ..errors import FlowError
from ..tensor import Tensor, empty
from ..tensor.amp import is_autocast_enabled, low_precision_inputs
from ..tensor.tensor import _record, _wrap
from . import init
from .module import Module, Parameter


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (under ``fg.autocast`` all three in the low-precision dtype).

    One graph node: its backward computes ``grad_weight = g.T @ x`` directly in ``weight``'s layout (a
    row-major array the optimizer streams through), ``grad_x = g @ weight`` and ``grad_bias = g.sum(0)``.
    """
    if bias is not None and is_autocast_enabled():
        x, weight, bias = low_precision_inputs(x, weight, bias)
    bk = x._backend
    if (x.ndim >= 2 and weight.ndim == 2 and weight._backend is bk and x._data.dtype == weight._data.dtype
            and (bias is None or (bias._backend is bk and bias._data.dtype == x._data.dtype))
            and x.shape[-1] == weight.shape[1] and (bias is None or tuple(bias.shape) == (weight.shape[0],))):
        return _linear_rows(x, weight, bias)
    with no_grad():
        out = x.matmul(weight.t())
        if bias is not None:
            out = out + bias
    if not (STATE.enabled and (x.requires_grad or weight.requires_grad
                               or (bias is not None and bias.requires_grad))):
        return out
    out_features, in_features = weight.shape[0], weight.shape[-1]
    need_x, need_w = x.requires_grad, weight.requires_grad
    need_b = bias is not None and bias.requires_grad

    def backward(g: Tensor, *saved: Tensor):
        x, weight = saved[0] if need_w else None, saved[-1] if need_x else None  # see _linear_saved
        g2 = g.reshape(-1, out_features)
        gx = g.matmul(weight) if need_x else None
        gw = g2.t().matmul(x.reshape(-1, in_features)) if need_w else None
        gb = g2.sum(0) if need_b else None
        return gx, gw, gb

    return _record(out, "Linear", (x, weight, bias), _linear_saved(x, weight, need_x, need_w), backward)


def _linear_saved(x: Tensor, weight: Tensor, need_x: bool, need_w: bool) -> tuple:
    """What linear's backward reads: x for the weight's gradient, the weight for x's gradient (in that order)."""
    return ((x,) if need_w else ()) + ((weight,) if need_x else ())


def _linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``linear`` for an input of two or more dimensions of the weight's dtype and device, its leading
    dimensions as rows of one GEMM, on backend arrays: no Tensor per transpose, reshape or partial result
    (the small-model step is host-bound). The bias is added into the GEMM's fresh output where the backend
    adds in place (``add_into``: NumPy reads and writes one array instead of writing a third, a (1024, 256)
    float32 sum 150 -> 70 us here). Under ``create_graph`` the backward uses tensor ops, so the gradient stays
    differentiable."""
    bk = x._backend
    xd = x._data
    if x.ndim != 2:
        xd = bk.reshape(xd, (-1, x.shape[-1]))
    out = bk.matmul(xd, bk.permute(weight._data, (1, 0)))
    if bias is not None:
        out = bk.add_into(out, bias._data)
    if x.ndim != 2:
        out = bk.reshape(out, (*x.shape[:-1], weight.shape[0]))
    out = _wrap(out, bk)
    need_x, need_w = x.requires_grad, weight.requires_grad
    need_b = bias is not None and bias.requires_grad
    if not (STATE.enabled and (need_x or need_w or need_b)):
        return out
    return _record(out, "Linear", (x, weight, bias), _linear_saved(x, weight, need_x, need_w),
                   _LINEAR_ROWS_BACKWARD[need_x, need_w, need_b])


def _bias_gradient(bk, gd):
    """A bias's gradient, the column sums of the 2-d backend array ``gd``: deferred (``ColumnSumGrad``, added by
    the engine into its running sum in the kernel) where the backend accumulates in place and ``gd`` is
    realized; computed (``Backend.bias_grad``) otherwise. A pending ``gd`` is summed eagerly: its kernel computes
    ``gd`` itself (the activation's backward) for the GEMMs that read it next."""
    if bk.accumulates_in_place and not bk.is_pending(gd):
        return ColumnSumGrad(bk, gd)
    return _wrap(bk.bias_grad(gd), bk)


def _linear_rows_backward(need_x: bool, need_w: bool, need_b: bool):
    """``_linear_rows``'s backward for the inputs that need a gradient. The eight of them are built once
    (``_LINEAR_ROWS_BACKWARD``): a closure made per call is a function, a tuple and a cell per flag the cyclic
    garbage collector tracks, and the graph of an eager step is alive when it runs (each collection of the
    middle generation moves the whole graph to the oldest, whose full collections cost 80-110 ms with torch
    and CuPy loaded: docs/cuda.md)."""

    def backward(g: Tensor, *saved: Tensor):
        x, weight = saved[0] if need_w else None, saved[-1] if need_x else None  # see _linear_saved
        if STATE.enabled:  # create_graph (g itself may be a constant): tensor ops, differentiable in x and W
            g2 = g if g.ndim == 2 else g.reshape(-1, g.shape[-1])
            return (g.matmul(weight) if need_x else None,
                    g2.t().matmul(x if x.ndim == 2 else x.reshape(-1, x.shape[-1])) if need_w else None,
                    g2.sum(0) if need_b else None)
        gd = g._data
        bk = g._backend
        shape = tuple(g.shape)
        if len(shape) != 2:
            gd = bk.reshape(gd, (-1, shape[-1]))
        # Where the backend adds into a sum in its kernel, the parameters' gradients go back deferred: the
        # engine adds them into the running sum of a weight shared by the steps of a loop (one GEMM a step, no
        # add). The bias first (``_bias_gradient``): a pending g is computed by its kernel for the GEMMs.
        gb = _bias_gradient(bk, gd) if need_b else None
        gw = None
        if need_w:
            gt = bk.permute(gd, (1, 0))
            xd = x._data if x.ndim == 2 else bk.reshape(x._data, (-1, x.shape[-1]))
            gw = MatmulGrad(bk, gt, xd) if bk.accumulates_in_place else _wrap(bk.matmul(gt, xd), bk)
        gx = None
        if need_x:
            gx = bk.matmul(gd, weight._data)
            if len(shape) != 2:
                gx = bk.reshape(gx, (*shape[:-1], gx.shape[-1]))
            gx = _wrap(gx, bk)
        return gx, gw, gb

    return backward


_LINEAR_ROWS_BACKWARD = {(a, b, c): _linear_rows_backward(a, b, c) for a in (False, True)
                         for b in (False, True) for c in (False, True)}


class Linear(Module):
    """``y = x @ W.T + b`` with PyTorch's default initialisation (Kaiming-uniform with a=sqrt(5))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not hasattr(type(value), "__index__") or value < 0:
                raise FlowError(f"Linear: {name} must be an int >= 0, got {value!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: weight ~ U(-1/sqrt(in), 1/sqrt(in)), same bound for the bias."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def bilinear(x1: Tensor, x2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y[..., o] = x1[..., i] * weight[o, i, j] * x2[..., j] + bias[o]`` (PyTorch's ``F.bilinear``)."""
    out_features, in1, in2 = weight.shape
    lead = x1.shape[:-1]
    a = x1.reshape(-1, in1)
    b = x2.reshape(-1, in2)
    # (N, in1) @ (in1, out*in2) -> (N, out, in2), then contract in2 with x2: two GEMM-shaped steps.
    t = a.matmul(weight.permute(1, 0, 2).reshape(in1, out_features * in2)).reshape(-1, out_features, in2)
    y = (t * b.unsqueeze(1)).sum(-1)
    if bias is not None:
        y = y + bias
    return y.reshape(lead + (out_features,))


class Bilinear(Module):
    """``y = x1^T A x2 + b`` with PyTorch's initialisation U(-1/sqrt(in1), 1/sqrt(in1))."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = Parameter(empty(out_features, in1_features, in2_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(-1/sqrt(in1), 1/sqrt(in1)) for weight and bias, as PyTorch."""
        bound = 1 / math.sqrt(self.in1_features) if self.in1_features > 0 else 0
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return bilinear(x1, x2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
