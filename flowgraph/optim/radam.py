"""``RAdam``: Adam with a rectified variance term (warm-up free), optional decoupled weight decay."""

from __future__ import annotations

import math
from typing import Any

from ..tensor import Tensor, zeros_like
from .adam import decayed_grad, update_moments
from .optimizer import Optimizer, ParamsT, check_betas, check_range, write_


def radam_scalars(group: dict[str, Any], step: float) -> tuple[float, float | None]:
    """RAdam's per-step scalars: ``(lr / bias_correction1, rect * sqrt(bias_correction2))``.

    The second is ``None`` while the variance is not tractable (``rho_t <= 5``): then the step is plain
    momentum SGD.
    """
    beta1, beta2 = group["betas"]
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
    step_size = group["lr"] / bias_correction1
    if rho_t <= 5.0:
        return step_size, None
    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
    return step_size, rect * math.sqrt(bias_correction2)


class RAdam(Optimizer):
    """PyTorch's ``torch.optim.RAdam`` (same arguments, defaults and update)::

        m, v as in Adam;  rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
        p -= lr / (1 - beta1**t) * m * rect * sqrt(1 - beta2**t) / (sqrt(v) + eps)   (rho_t > 5)
        p -= lr / (1 - beta1**t) * m                                                  (otherwise)

    >>> opt = optim.RAdam(model.parameters(), lr=1e-3, decoupled_weight_decay=True, weight_decay=0.01)
    """

    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay, foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("RAdam", "lr", group["lr"], 0.0)
        check_range("RAdam", "eps", group["eps"], 0.0)
        check_betas("RAdam", group["betas"])
        check_range("RAdam", "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        step_size, adaptive = radam_scalars(group, state["step"])
        g, p_base = decayed_grad(p, grad, group)
        m, v = update_moments(state, g, group["betas"])
        if adaptive is None:
            write_(p, p_base - m * step_size)
        else:
            write_(p, p_base - (m * (step_size * adaptive)) / (v.sqrt() + group["eps"]))
