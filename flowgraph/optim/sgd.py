"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

from __future__ import annotations

from typing import Any

from ..errors import FlowError
from ..tensor import Tensor
from ..tensor.tensor import _wrap
from .optimizer import Optimizer, ParamsT, check_range


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
        """One step through the backend's ``sgd_step`` (``Backend.sgd_step``: its generic default is the formula
        above in primitives; CUDA and OpenCL run a momentum step in one kernel). Inside ``fg.capture`` ``lr``
        is a 0-d device tensor; its array is passed."""
        buf = state.get("momentum_buffer")
        lr = group["lr"]
        p_data, buf_data = p._backend.sgd_step(
            p._data, grad._data, None if buf is None else buf._data, lr._data if isinstance(lr, Tensor) else lr,
            group["momentum"], group["dampening"], group["weight_decay"], group["nesterov"], group["maximize"])
        p._data = p_data
        p._bump_version()
        if buf is not None:
            buf._data = buf_data
            buf._bump_version()
        elif buf_data is not None:  # the first momentum step: the buffer starts as a copy of the gradient
            state["momentum_buffer"] = _wrap(buf_data, p._backend)
