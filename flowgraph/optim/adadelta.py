"""``Adadelta``: step sizes from running averages of squared gradients and of squared updates."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor, zeros_like
from .optimizer import Optimizer, ParamsT, check_range, write_


class Adadelta(Optimizer):
    """PyTorch's ``torch.optim.Adadelta`` (same arguments, defaults, state names and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        square_avg = rho * square_avg + (1 - rho) * g * g
        delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
        acc_delta = rho * acc_delta + (1 - rho) * delta * delta
        p -= lr * delta

    >>> opt = optim.Adadelta(model.parameters(), lr=1.0, rho=0.9)
    """

    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None, *, maximize: bool = False) -> None:
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("Adadelta", "lr", group["lr"], 0.0)
        check_range("Adadelta", "rho", group["rho"], 0.0, 1.0, high_open=False)
        check_range("Adadelta", "eps", group["eps"], 0.0)
        check_range("Adadelta", "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["square_avg"] = zeros_like(p)
        state["acc_delta"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        rho, eps = group["rho"], group["eps"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        sq, acc = state["square_avg"], state["acc_delta"]
        s = write_(sq, sq * rho + (g * (1 - rho)) * g)
        delta = (acc + eps).sqrt() / (s + eps).sqrt() * g
        write_(acc, acc * rho + (delta * (1 - rho)) * delta)
        write_(p, p - delta * group["lr"])
