"""Gradient clipping: ``clip_grad_norm_`` and ``clip_grad_value_``."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...autograd.grad_mode import no_grad
from ...errors import FlowError
from ...tensor import Tensor, stack


def clip_grad_norm_(parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale gradients so their total ``norm_type``-norm is at most ``max_norm``; returns the total norm.

    The norm is computed on the device and the scale applied without a host read (no sync), as PyTorch does.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        from ...tensor import tensor

        return tensor(0.0)
    with no_grad():
        if norm_type == math.inf:
            total = stack([g.abs().amax() for g in grads]).amax()
        else:
            total = stack([g.norm(norm_type) for g in grads]).norm(norm_type)
        if error_if_nonfinite and not bool(total.isfinite().item()):
            raise FlowError(f"clip_grad_norm_: the total gradient norm is {total.item()}; "
                            "pass error_if_nonfinite=False to clip anyway")
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """Clamp every gradient element to ``[-clip_value, clip_value]``."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    with no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.clamp_(-clip_value, clip_value)
