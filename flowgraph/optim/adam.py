"""``Adam`` and ``AdamW``: adaptive moment estimation, with L2 or decoupled weight decay and AMSGrad."""

from __future__ import annotations

import math
from typing import Any

from ..tensor import Tensor, maximum, zeros_like
from .optimizer import Optimizer, ParamsT, check_betas, check_range, lerp, write_


def adam_scalars(group: dict[str, Any], step: float) -> tuple[float, float]:
    """Adam's per-step scalars: ``(step_size, sqrt(bias_correction2))``.

    ``step_size = lr / (1 - beta1**step)``; all the host-side math of one Adam step lives here.
    """
    beta1, beta2 = group["betas"]
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    return group["lr"] / bias_correction1, math.sqrt(bias_correction2)


class Adam(Optimizer):
    """PyTorch's ``torch.optim.Adam`` (same arguments, defaults and update)::

        g = -grad if maximize else grad
        p *= 1 - lr * weight_decay  (decoupled)   or   g += weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g        (v_max = max(v_max, v) with amsgrad)
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    Each line is one fused-friendly expression ending in one in-place write.

    >>> opt = optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    """

    _name = "Adam"

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        name = self._name
        check_range(name, "lr", group["lr"], 0.0)
        check_range(name, "eps", group["eps"], 0.0)
        check_betas(name, group["betas"])
        check_range(name, "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        step_size, sqrt_bc2 = adam_scalars(group, state["step"])
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        g = -grad if group["maximize"] else grad
        if wd != 0:
            if group["decoupled_weight_decay"]:
                write_(p, p * (1 - lr * wd))
            else:
                g = g + p * wd
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        m = write_(exp_avg, lerp(exp_avg, g, 1 - beta1))
        v = write_(exp_avg_sq, exp_avg_sq * beta2 + (g * (1 - beta2)) * g)
        if group["amsgrad"]:
            v = write_(state["max_exp_avg_sq"], maximum(state["max_exp_avg_sq"], v))
        write_(p, p - (m * step_size) / (v.sqrt() / sqrt_bc2 + group["eps"]))


class AdamW(Adam):
    """PyTorch's ``torch.optim.AdamW``: Adam with decoupled weight decay (``p *= 1 - lr * weight_decay``),
    default ``weight_decay=1e-2``.

    >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    _name = "AdamW"

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, fused: bool | None = None) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, fused=fused, decoupled_weight_decay=True)
