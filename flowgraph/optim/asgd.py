"""``ASGD``: averaged stochastic gradient descent (Polyak-Ruppert averaging with a decaying step)."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor, zeros_like
from .nadam import _as_float32
from .optimizer import Optimizer, ParamsT, check_range, write_


def asgd_scalars(group: dict[str, Any], step: float) -> tuple[float, float]:
    """ASGD's ``(eta, mu)`` after ``step`` steps, rounded to float32 as PyTorch keeps them (0-d float32 tensors)::

        eta = lr / (1 + lambd * lr * step) ** alpha
        mu = 1 / max(1, step - t0)
    """
    lr = group["lr"]
    eta = lr / ((1 + group["lambd"] * lr * step) ** group["alpha"])
    mu = 1 / max(1, step - group["t0"])
    return _as_float32(eta), _as_float32(mu)


class ASGD(Optimizer):
    """PyTorch's ``torch.optim.ASGD`` (same arguments, defaults, state names and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        p = p * (1 - lambd * eta) - eta * g
        ax = p  if mu == 1  else  ax + mu * (p - ax)          (the averaged parameters, in state["ax"])
        eta, mu = asgd_scalars(group, t)                       (used by the next step)

    ``eta`` starts at ``lr`` and ``mu`` at 1; like ``step`` they are Python floats in the state (PyTorch keeps
    0-d float32 tensors; the values are rounded to float32 to match). Averaging starts after ``t0`` steps.

    >>> opt = optim.ASGD(model.parameters(), lr=1e-2, t0=1000)
    """

    _host_scalars = ("step", "eta", "mu")

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0.0, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("ASGD", "lr", group["lr"], 0.0)
        check_range("ASGD", "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["eta"] = _as_float32(group["lr"])
        state["mu"] = 1.0
        state["ax"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        eta = state["eta"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        new = write_(p, p * (1 - group["lambd"] * eta) - g * eta)
        ax = state["ax"]
        write_(ax, new if state["mu"] == 1 else ax + (new - ax) * state["mu"])
        state["eta"], state["mu"] = asgd_scalars(group, state["step"])
