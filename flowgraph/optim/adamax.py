"""``Adamax``: Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor, maximum, zeros_like
from .optimizer import Optimizer, ParamsT, check_betas, check_range, lerp, write_


class Adamax(Optimizer):
    """PyTorch's ``torch.optim.Adamax`` (same arguments, defaults, state names and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        exp_avg = beta1 * exp_avg + (1 - beta1) * g
        exp_inf = max(beta2 * exp_inf, |g| + eps)
        p -= lr / (1 - beta1**t) * exp_avg / exp_inf

    >>> opt = optim.Adamax(model.parameters(), lr=2e-3, betas=(0.9, 0.999))
    """

    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, foreach: bool | None = None, *,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("Adamax", "lr", group["lr"], 0.0)
        check_range("Adamax", "eps", group["eps"], 0.0)
        check_betas("Adamax", group["betas"])
        check_range("Adamax", "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["exp_avg"] = zeros_like(p)
        state["exp_inf"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        beta1, beta2 = group["betas"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        m = write_(state["exp_avg"], lerp(state["exp_avg"], g, 1 - beta1))
        u = write_(state["exp_inf"], maximum(state["exp_inf"] * beta2, g.abs() + group["eps"]))
        clr = group["lr"] / (1 - beta1 ** state["step"])
        write_(p, p - (m / u) * clr)
