"""Activation functions and their modules, with PyTorch's names, arguments and boundary gradients.

Each function is composed from tensor ops (``where`` picks the branch, so the gradient at a kink is the
one PyTorch uses: e.g. ``hardtanh``'s gradient is 0 at its limits, ``leaky_relu``'s is the slope at 0).
``inplace=True`` writes the result into the input (through the in-place machinery, so autograd stays right).
"""

from __future__ import annotations

from ..autograd.grad_mode import STATE, no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, maximum, rand, where
from ..tensor import gelu as _gelu
from ..tensor import log_softmax as _log_softmax
from ..tensor import relu as _relu
from ..tensor import sigmoid as _sigmoid
from ..tensor import silu as _silu
from ..tensor import softmax as _softmax
from ..tensor import softplus as _softplus
from ..tensor import tanh as _tanh
from ..tensor.indexing import apply_inplace
from ..tensor.tensor import _record, _wrap
from .module import Module, Parameter

__all__ = [
    "ReLU", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Softplus", "Softsign", "Hardswish",
    "Hardsigmoid", "Hardtanh", "ReLU6", "PReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Softmin", "GLU",
    "LogSigmoid", "Tanhshrink", "Softshrink", "Hardshrink", "Threshold", "RReLU", "Softmax2d",
]  # fmt: skip
__functional__ = [
    "relu", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "softsign",
    "hardswish", "hardsigmoid", "hardtanh", "relu6", "prelu", "sigmoid", "tanh", "softmax", "log_softmax",
    "softmin", "glu", "logsigmoid", "rrelu", "tanhshrink", "softshrink", "hardshrink", "threshold",
]  # fmt: skip

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _pointwise(x: Tensor, forward, derivative, name: str) -> Tensor:
    """One graph node for a pointwise function: ``forward(x)`` runs without recording (no intermediate
    nodes), the backward is ``g * derivative(x)``; both are written in tensor ops, so every backend has it.
    ``derivative`` picks PyTorch's one-sided value at each kink."""
    with no_grad():
        out = forward(x)
    if x.requires_grad and STATE.enabled:

        def bw(g: Tensor, x: Tensor):
            # under create_graph the derivative is taken of x itself, so second derivatives flow through it
            return (g * derivative(x if STATE.enabled else x.detach()),)

        _record(out, name, (x,), (x,), bw)
    return out


def _maybe_inplace(x: Tensor, fn, inplace: bool, name: str) -> Tensor:
    # apply_inplace keeps a copy of the overwritten input where fn's backward needs it (silu) and makes a
    # saved output refer to x itself (relu), as PyTorch's in-place activations do.
    return apply_inplace(x, fn, name + "_") if inplace else fn(x)


# ---------------------------------------------------------------------- functional forms
def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(x, 0)``."""
    return _maybe_inplace(input, _relu, inplace, "relu")


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` for ``x > 0``, ``negative_slope * x`` otherwise."""

    def fn(x: Tensor) -> Tensor:
        if negative_slope < 0:  # the sign of the output no longer tells the branch: the derivative reads x
            return _pointwise(x, lambda v: where(v > 0, v, v * negative_slope),
                              lambda v: where(v > 0, 1.0, negative_slope), "LeakyRelu")
        return _leaky_relu(x, negative_slope)

    return _maybe_inplace(input, fn, inplace, "leaky_relu")


def _leaky_relu(x: Tensor, slope: float) -> Tensor:
    """Leaky ReLU for ``slope >= 0``, its backward reading the output (``y > 0`` exactly where ``x > 0``), as
    PyTorch's does: the in-place form then keeps no copy of its input (dcgan_d: one input-sized copy fewer per
    layer). For ``0 < slope <= 1`` the forward is ``maximum(x, slope * x)``, two passes instead of ``where``'s
    three, with the same values: rounding is monotonic, so ``slope * x <= x`` for ``x > 0`` and ``>= x`` for
    ``x <= 0`` (signed zeros, infinities and NaN included)."""
    with no_grad():
        out = maximum(x, x * slope) if 0 < slope <= 1 else where(x > 0, x, x * slope)
    if x.requires_grad and STATE.enabled:

        def bw(g: Tensor, y: Tensor):
            if STATE.enabled or g.dtype != y.dtype:  # create_graph, or a gradient of another dtype
                return (g * where(y > 0, 1.0, slope),)
            bk = g._backend
            return (_wrap(bk.leaky_relu_backward(g._data, y._data, slope), bk),)

        _record(out, "LeakyRelu", (x,), (out,), bw)
    return out


def _elu_like(x: Tensor, alpha: float, scale: float, input_scale: float, name: str) -> Tensor:
    """``scale * x`` for ``x > 0``, ``scale * alpha * (exp(x * input_scale) - 1)`` otherwise."""

    def forward(v: Tensor) -> Tensor:
        neg = (v.clamp(max=0) * input_scale).expm1() * (alpha * scale)
        return where(v > 0, v * scale if scale != 1.0 else v, neg)

    def derivative(v: Tensor) -> Tensor:
        return where(v > 0, scale, (v.clamp(max=0) * input_scale).exp() * (alpha * scale * input_scale))

    return _pointwise(x, forward, derivative, name)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise."""
    return _maybe_inplace(input, lambda x: _elu_like(x, alpha, 1.0, 1.0, "Elu"), inplace, "elu")


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """Scaled ELU with the self-normalising constants (``scale * elu(x, alpha)``)."""
    return _maybe_inplace(input, lambda x: _elu_like(x, _SELU_ALPHA, _SELU_SCALE, 1.0, "Selu"), inplace, "selu")


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    if alpha == 0:
        raise FlowError("celu: alpha must be non-zero")
    return _maybe_inplace(input, lambda x: _elu_like(x, alpha, 1.0, 1.0 / alpha, "Celu"), inplace, "celu")


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit: exact (``'none'``) or the ``'tanh'`` approximation."""
    return _gelu(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)`` (swish)."""
    return _maybe_inplace(input, _silu, inplace, "silu")


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``."""

    def derivative(v: Tensor) -> Tensor:
        t = _softplus(v).tanh()
        return t + v * _sigmoid(v) * (1.0 - t * t)

    return _maybe_inplace(
        input, lambda x: _pointwise(x, lambda v: v * _softplus(v).tanh(), derivative, "Mish"), inplace, "mish"
    )


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold``."""
    return _softplus(input, beta, threshold)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    return _pointwise(input, lambda v: v / (v.abs() + 1.0), lambda v: (v.abs() + 1.0).square().reciprocal(), "Softsign")


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``clamp(x, min_val, max_val)`` with gradient 0 at and beyond the limits (PyTorch's)."""
    if min_val > max_val:
        raise FlowError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")

    def fn(x: Tensor) -> Tensor:
        return _pointwise(
            x, lambda v: v.clamp(min_val, max_val), lambda v: ((v > min_val) & (v < max_val)).to(v.dtype), "Hardtanh"
        )

    return _maybe_inplace(input, fn, inplace, "hardtanh")


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """``min(max(x, 0), 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``: 0 below -3, 1 above 3, linear between."""

    def fn(x: Tensor) -> Tensor:
        return _pointwise(
            x,
            lambda v: (v / 6.0 + 0.5).clamp(0.0, 1.0),
            lambda v: ((v > -3.0) & (v < 3.0)).to(v.dtype) / 6.0,
            "Hardsigmoid",
        )

    return _maybe_inplace(input, fn, inplace, "hardsigmoid")


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``."""

    def derivative(v: Tensor) -> Tensor:  # PyTorch's one-sided values: 0 at -3, 1.5 at 3
        return where(v <= -3.0, 0.0, where(v < 3.0, v / 3.0 + 0.5, 1.0))

    def fn(x: Tensor) -> Tensor:
        return _pointwise(x, lambda v: v * (v / 6.0 + 0.5).clamp(0.0, 1.0), derivative, "Hardswish")

    return _maybe_inplace(input, fn, inplace, "hardswish")


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """``x`` for ``x > 0``, ``weight * x`` otherwise; ``weight`` has 1 or ``C`` (channel dim 1) entries."""
    n = weight.numel()
    if n != 1:
        if input.ndim < 2 or input.shape[1] != n:
            raise ShapeError(
                f"prelu: weight has {n} entries but the input {input.shape} has "
                f"{input.shape[1] if input.ndim > 1 else 1} channels (dim 1)"
            )
        weight = weight.reshape((1, n) + (1,) * (input.ndim - 2))
    elif weight.ndim:
        weight = weight.reshape(())
    return where(input > 0, input, input * weight)


def sigmoid(input: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``."""
    return _sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    return _tanh(input)


def _implicit_dim(x: Tensor, dim: int | None) -> int:
    if dim is not None:
        return dim
    return 0 if x.ndim in (0, 1, 3) else 1  # PyTorch's legacy rule for dim=None


def softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``."""
    return _softmax(input, _implicit_dim(input, dim), dtype)


def log_softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """``log(softmax(x))`` computed stably."""
    return _log_softmax(input, _implicit_dim(input, dim), dtype)


def softmin(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """``softmax(-x)``."""
    return _softmax(-input, _implicit_dim(input, dim), dtype)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: split ``dim`` in halves ``a, b`` and return ``a * sigmoid(b)``."""
    n = input.shape[dim]
    if n % 2:
        raise ShapeError(f"glu: dim {dim} has odd size {n}; it must split into two halves")
    a, b = input.split(n // 2, dim)
    return a * _sigmoid(b)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x)) = -softplus(-x)``."""
    return _pointwise(input, lambda v: -_softplus(-v), lambda v: _sigmoid(-v), "LogSigmoid")


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    return input - _tanh(input)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, 0 between."""
    return _pointwise(
        input, lambda v: v - v.clamp(-lambd, lambd), lambda v: ((v > lambd) | (v < -lambd)).to(v.dtype), "Softshrink"
    )


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""

    def mask(v: Tensor) -> Tensor:
        return ((v > lambd) | (v < -lambd)).to(v.dtype)

    return _pointwise(input, lambda v: v * mask(v), mask, "Hardshrink")


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, else ``value``."""

    def fn(x: Tensor) -> Tensor:
        return _pointwise(
            x, lambda v: where(v > threshold, v, value), lambda v: (v > threshold).to(v.dtype), "Threshold"
        )

    return _maybe_inplace(input, fn, inplace, "threshold")


def rrelu(
    input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, inplace: bool = False
) -> Tensor:
    """Randomized leaky ReLU: in training each non-positive element gets a slope drawn from
    ``U(lower, upper)`` (``fg.rand`` on the input's device); otherwise the fixed slope ``(lower + upper) / 2``."""
    if not 0 <= lower <= upper:
        raise FlowError(f"rrelu: need 0 <= lower <= upper, got lower={lower}, upper={upper}")
    if not training:
        return leaky_relu(input, (lower + upper) / 2, inplace)

    def fn(x: Tensor) -> Tensor:
        slope = rand(*x.shape, dtype=x.dtype, device=x.device) * (upper - lower) + lower
        return where(x > 0, x, x * slope)

    return _maybe_inplace(input, fn, inplace, "rrelu")


# ---------------------------------------------------------------------- modules
class _Activation(Module):
    """An activation module: calls ``_fn(x, **self._kwargs())``."""

    _args: tuple[str, ...] = ()

    def _fn(self, x: Tensor, **kwargs) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(self, input: Tensor) -> Tensor:
        return type(self)._fn(input, **{a: getattr(self, a) for a in self._args})

    def extra_repr(self) -> str:
        parts = []
        for a in self._args:
            v = getattr(self, a)
            if a == "inplace":
                if v:
                    parts.append("inplace=True")
            else:
                parts.append(f"{a}={v!r}" if isinstance(v, str) else f"{a}={v}")
        return ", ".join(parts)


def _simple(name: str, fn, doc: str, inplace: bool = False):
    """A parameterless activation module class around ``fn``."""

    def __init__(self, inplace: bool = False):
        _Activation.__init__(self)
        self.inplace = inplace

    attrs = {"_fn": staticmethod(fn), "__doc__": doc, "_args": ("inplace",) if inplace else ()}
    if inplace:
        attrs["__init__"] = __init__
    return type(name, (_Activation,), attrs)


ReLU = _simple("ReLU", relu, "``max(x, 0)``: ``nn.ReLU(inplace=False)``.", True)
SELU = _simple("SELU", selu, "Scaled exponential linear unit.", True)
SiLU = _simple("SiLU", silu, "``x * sigmoid(x)``.", True)
Mish = _simple("Mish", mish, "``x * tanh(softplus(x))``.", True)
Hardswish = _simple("Hardswish", hardswish, "``x * relu6(x + 3) / 6``.", True)
Hardsigmoid = _simple("Hardsigmoid", hardsigmoid, "``relu6(x + 3) / 6``.", True)
ReLU6 = _simple("ReLU6", relu6, "``min(max(x, 0), 6)``.", True)
Softsign = _simple("Softsign", softsign, "``x / (1 + |x|)``.")
Sigmoid = _simple("Sigmoid", sigmoid, "Logistic sigmoid.")
Tanh = _simple("Tanh", tanh, "Hyperbolic tangent.")
LogSigmoid = _simple("LogSigmoid", logsigmoid, "``log(sigmoid(x))``.")
Tanhshrink = _simple("Tanhshrink", tanhshrink, "``x - tanh(x)``.")
for _cls in (
    ReLU,
    SELU,
    SiLU,
    Mish,
    Hardswish,
    Hardsigmoid,
    ReLU6,
    Softsign,
    Sigmoid,
    Tanh,
    LogSigmoid,
    Tanhshrink,
):
    _cls.__module__ = __name__
del _cls


class LeakyReLU(_Activation):
    """``x`` for ``x > 0``, ``negative_slope * x`` otherwise."""

    _fn = staticmethod(leaky_relu)
    _args = ("negative_slope", "inplace")

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace


class ELU(_Activation):
    """Exponential linear unit: ``nn.ELU(alpha=1.0, inplace=False)``."""

    _fn = staticmethod(elu)
    _args = ("alpha", "inplace")

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace


class CELU(_Activation):
    """Continuously differentiable ELU: ``nn.CELU(alpha=1.0, inplace=False)``."""

    _fn = staticmethod(celu)
    _args = ("alpha", "inplace")

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace


class GELU(_Activation):
    """Gaussian error linear unit: ``nn.GELU(approximate='none')`` or ``approximate='tanh'``."""

    _fn = staticmethod(gelu)
    _args = ("approximate",)

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise FlowError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate


class Softplus(_Activation):
    """``log(1 + exp(beta * x)) / beta``: ``nn.Softplus(beta=1.0, threshold=20.0)``."""

    _fn = staticmethod(softplus)
    _args = ("beta", "threshold")

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold


class Hardtanh(_Activation):
    """``clamp(x, min_val, max_val)``: ``nn.Hardtanh(min_val=-1.0, max_val=1.0, inplace=False)``."""

    _fn = staticmethod(hardtanh)
    _args = ("min_val", "max_val", "inplace")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        if min_val > max_val:
            raise FlowError(f"Hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace


class Softshrink(_Activation):
    """Soft shrinkage: ``nn.Softshrink(lambd=0.5)``."""

    _fn = staticmethod(softshrink)
    _args = ("lambd",)

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Hardshrink(_Activation):
    """Hard shrinkage: ``nn.Hardshrink(lambd=0.5)``."""

    _fn = staticmethod(hardshrink)
    _args = ("lambd",)

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Threshold(_Activation):
    """``x`` where ``x > threshold``, else ``value``: ``nn.Threshold(threshold, value, inplace=False)``."""

    _fn = staticmethod(threshold)
    _args = ("threshold", "value", "inplace")

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace


class _SoftmaxLike(_Activation):
    _args = ("dim",)

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim


class Softmax(_SoftmaxLike):
    """Softmax along ``dim``: ``nn.Softmax(dim=-1)``."""

    _fn = staticmethod(softmax)


class LogSoftmax(_SoftmaxLike):
    """Log-softmax along ``dim``."""

    _fn = staticmethod(log_softmax)


class Softmin(_SoftmaxLike):
    """Softmin (softmax of ``-x``) along ``dim``."""

    _fn = staticmethod(softmin)


class GLU(_Activation):
    """Gated linear unit along ``dim`` (default -1)."""

    _fn = staticmethod(glu)
    _args = ("dim",)

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim


class PReLU(Module):
    """Leaky ReLU with a learned slope: ``nn.PReLU(num_parameters=1, init=0.25)`` (one per channel if > 1)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        from ..tensor import full

        super().__init__()
        if num_parameters < 1:
            raise FlowError(f"PReLU: num_parameters must be >= 1, got {num_parameters}")
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(full((num_parameters,), init, dtype=dtype, device=device))

    def reset_parameters(self) -> None:
        """Fill the slopes with ``init``."""
        from . import init as nn_init

        nn_init.constant_(self.weight, self.init)

    def forward(self, input: Tensor) -> Tensor:
        return prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(Module):
    """Randomized leaky ReLU: ``nn.RReLU(lower=1/8, upper=1/3, inplace=False)`` (random slopes in training)."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class Softmax2d(Module):
    """Softmax over the channels of ``(N, C, H, W)`` or ``(C, H, W)`` inputs (dim -3)."""

    def forward(self, input: Tensor) -> Tensor:
        if input.ndim not in (3, 4):
            raise ShapeError(f"Softmax2d: expected a 3-d or 4-d input, got shape {input.shape}")
        return _softmax(input, -3)
