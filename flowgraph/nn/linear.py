"""``Linear`` (and its functional form lives in ``nn.functional.linear``)."""

from __future__ import annotations

import math

from ..tensor import Tensor, empty
from ..tensor.amp import is_autocast_enabled, low_precision_inputs
from . import init
from .module import Module, Parameter


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (under ``fg.autocast`` all three in the low-precision dtype)."""
    if bias is not None and is_autocast_enabled():
        x, weight, bias = low_precision_inputs(x, weight, bias)
    out = x.matmul(weight.t())
    return out + bias if bias is not None else out


class Linear(Module):
    """``y = x @ W.T + b`` with PyTorch's default initialisation (Kaiming-uniform with a=sqrt(5))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
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
