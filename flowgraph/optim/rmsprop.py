"""``RMSprop``: divide the gradient by a running root mean square, optionally centered and with momentum."""

from __future__ import annotations

from typing import Any

from ..tensor import Tensor, zeros_like
from .optimizer import Optimizer, ParamsT, check_range, lerp, write_


class RMSprop(Optimizer):
    """PyTorch's ``torch.optim.RMSprop`` (same arguments, defaults and update)::

        g = -grad if maximize else grad;  g += weight_decay * p
        s = alpha * s + (1 - alpha) * g * g
        avg = sqrt(s - a * a) + eps  with  a = alpha * a + (1 - alpha) * g   (centered)
        avg = sqrt(s) + eps                                                   (otherwise)
        buf = momentum * buf + g / avg;  p -= lr * buf        (momentum > 0)
        p -= lr * g / avg                                      (otherwise)

    >>> opt = optim.RMSprop(model.parameters(), lr=1e-2, alpha=0.99)
    """

    _capturable = True
    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, maximize=maximize, foreach=foreach)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("RMSprop", "lr", group["lr"], 0.0)
        check_range("RMSprop", "eps", group["eps"], 0.0)
        check_range("RMSprop", "momentum", group["momentum"], 0.0)
        check_range("RMSprop", "weight_decay", group["weight_decay"], 0.0)
        check_range("RMSprop", "alpha", group["alpha"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["square_avg"] = zeros_like(p)
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_like(p)
        if group["centered"]:
            state["grad_avg"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        alpha, lr, eps = group["alpha"], group["lr"], group["eps"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + p * group["weight_decay"]
        sq = state["square_avg"]
        s = write_(sq, sq * alpha + (g * (1 - alpha)) * g)
        if group["centered"]:
            ga = state["grad_avg"]
            a = write_(ga, lerp(ga, g, 1 - alpha))
            avg = (s - a * a).sqrt() + eps
        else:
            avg = s.sqrt() + eps
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            write_(buf, buf * group["momentum"] + g / avg)
            write_(p, p - buf * lr)
        else:
            write_(p, p - (g * lr) / avg)
