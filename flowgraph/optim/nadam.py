"""``NAdam``: Adam with Nesterov momentum and a momentum-decay schedule, optional decoupled weight decay."""

from __future__ import annotations

import struct
from typing import Any

from ..tensor import Tensor, zeros_like
from .adam import decayed_grad, update_moments
from .optimizer import Optimizer, ParamsT, check_betas, check_range, write_


def _as_float32(x: float) -> float:
    """``x`` rounded to the nearest float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def nadam_scalars(group: dict[str, Any], step: float, mu_product: float) -> tuple[float, float, float, float]:
    """NAdam's per-step scalars: ``(mu_product, grad coef, exp_avg coef, 1 / bias_correction2)``.

    ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``; the coefficients already carry ``-lr``.
    """
    beta1, beta2 = group["betas"]
    lr, decay = group["lr"], group["momentum_decay"]
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * decay)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * decay)))
    mu_product = _as_float32(_as_float32(mu_product) * _as_float32(mu))  # PyTorch keeps it in a float32 tensor
    grad_coef = -lr * (1.0 - mu) / (1.0 - mu_product)
    avg_coef = -lr * mu_next / (1.0 - mu_product * mu_next)
    return mu_product, grad_coef, avg_coef, 1.0 / (1 - beta2 ** step)


class NAdam(Optimizer):
    """PyTorch's ``torch.optim.NAdam`` (same arguments, defaults and update)::

        m, v as in Adam;  mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay));  P_t = prod(mu_1..mu_t)
        denom = sqrt(v / (1 - beta2**t)) + eps
        p += (-lr (1 - mu_t) / (1 - P_t) * g - lr mu_{t+1} / (1 - P_t mu_{t+1}) * m) / denom

    >>> opt = optim.NAdam(model.parameters(), lr=2e-3)
    """

    _host_scalars = ("step", "mu_product")

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                        foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("NAdam", "lr", group["lr"], 0.0)
        check_range("NAdam", "eps", group["eps"], 0.0)
        check_betas("NAdam", group["betas"])
        check_range("NAdam", "weight_decay", group["weight_decay"], 0.0)
        check_range("NAdam", "momentum_decay", group["momentum_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["mu_product"] = 1.0
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        state["mu_product"], grad_coef, avg_coef, inv_bc2 = nadam_scalars(group, state["step"],
                                                                          state["mu_product"])
        g, p_base = decayed_grad(p, grad, group)
        m, v = update_moments(state, g, group["betas"])
        denom = (v * inv_bc2).sqrt() + group["eps"]
        write_(p, p_base + (g * grad_coef + m * avg_coef) / denom)
