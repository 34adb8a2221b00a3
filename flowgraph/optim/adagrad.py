"""``Adagrad``: per-coordinate learning rates from the running sum of squared gradients."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor, full_like
from .optimizer import Optimizer, ParamsT, check_range, write_


def adagrad_lr(group: dict[str, Any], step: float) -> float:
    """Adagrad's decayed learning rate at ``step``: ``lr / (1 + (step - 1) * lr_decay)``."""
    return group["lr"] / (1 + (step - 1) * group["lr_decay"])


class Adagrad(Optimizer):
    """PyTorch's ``torch.optim.Adagrad`` (same arguments, defaults and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s += g * g                  (s starts at initial_accumulator_value)
        p -= clr * g / (sqrt(s) + eps)

    >>> opt = optim.Adagrad(model.parameters(), lr=1e-2)
    """

    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, fused: bool | None = None) -> None:
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("Adagrad", "lr", group["lr"], 0.0)
        check_range("Adagrad", "lr_decay", group["lr_decay"], 0.0)
        check_range("Adagrad", "weight_decay", group["weight_decay"], 0.0)
        check_range("Adagrad", "initial_accumulator_value", group["initial_accumulator_value"], 0.0)
        check_range("Adagrad", "eps", group["eps"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["sum"] = full_like(p, group["initial_accumulator_value"])

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        clr = adagrad_lr(group, state["step"])
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        s = write_(state["sum"], state["sum"] + g * g)
        write_(p, p - (g * clr) / (s.sqrt() + group["eps"]))
