"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

from __future__ import annotations

from typing import Any

from ..errors import FlowError
from ..tensor import Tensor
from .optimizer import Optimizer, ParamsT, check_range, write_


class SGD(Optimizer):
    """PyTorch's ``torch.optim.SGD`` (same arguments, defaults and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        buf = g                                  (first step)
        buf = momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
        p -= lr * g

    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    """

    _capturable = True

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, fused: bool | None = None) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("SGD", "lr", group["lr"], 0.0)
        check_range("SGD", "momentum", group["momentum"], 0.0)
        check_range("SGD", "weight_decay", group["weight_decay"], 0.0)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise FlowError("SGD: nesterov=True requires momentum > 0 and dampening = 0 "
                            f"(got momentum={group['momentum']}, dampening={group['dampening']})")

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        momentum = group["momentum"]
        buf = state.get("momentum_buffer")
        if momentum != 0 and buf is not None and self._fused_update(p, grad, buf, group):
            return
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        if momentum != 0:
            if buf is None:
                buf = state["momentum_buffer"] = g.detach().clone()
            else:
                damped = g if group["dampening"] == 0 else g * (1 - group["dampening"])
                write_(buf, buf * momentum + damped)
            g = g + buf * momentum if group["nesterov"] else buf
        write_(p, p - g * group["lr"])

    @staticmethod
    def _fused_update(p: Tensor, grad: Tensor, buf: Tensor, group: dict[str, Any]) -> bool:
        """The backend's one-kernel momentum step where it has one (CUDA, OpenCL); False otherwise."""
        lr = group["lr"]
        lr = lr._data if isinstance(lr, Tensor) else lr
        if not p._backend.sgd_step(p._data, grad._data, buf._data, lr, group["momentum"], group["dampening"],
                     group["weight_decay"], group["nesterov"], group["maximize"]):
            return False
        p._bump_version()
        buf._bump_version()
        return True
