"""``Rprop``: resilient backpropagation, a per-coordinate step size driven by the gradient's sign only."""

from __future__ import annotations

from typing import Any

from ..errors import FlowError
from ..tensor import Tensor, full_like, where, zeros_like
from .optimizer import Optimizer, ParamsT, check_range, write_


class Rprop(Optimizer):
    """PyTorch's ``torch.optim.Rprop`` (same arguments, defaults, state names and update)::

        g = -grad if maximize else grad
        s = sign(g * prev)
        step_size = clamp(step_size * (etaplus if s > 0, etaminus if s < 0, 1 if s == 0), *step_sizes)
        g = 0 where s < 0                     (after a sign change the coordinate waits one step)
        p -= sign(g) * step_size;  prev = g

    ``step_size`` starts at ``lr`` in every coordinate; ``lr`` is read only then, so a scheduler changes the
    starting step size of parameters that have no state yet, as in PyTorch.

    >>> opt = optim.Rprop(model.parameters(), lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50))
    """

    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes), foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("Rprop", "lr", group["lr"], 0.0)
        etas, sizes = group["etas"], group["step_sizes"]
        if not isinstance(etas, (tuple, list)) or len(etas) != 2 or not 0.0 < etas[0] < 1.0 < etas[1]:
            raise FlowError(f"Rprop: invalid etas {etas!r}; it must be a pair (etaminus, etaplus) with "
                            "0 < etaminus < 1 < etaplus, e.g. (0.5, 1.2)")
        if not isinstance(sizes, (tuple, list)) or len(sizes) != 2 or not 0.0 <= sizes[0] <= sizes[1]:
            raise FlowError(f"Rprop: invalid step_sizes {sizes!r}; it must be a pair (min, max) with "
                            "0 <= min <= max, e.g. (1e-6, 50)")

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["prev"] = zeros_like(p)
        state["step_size"] = full_like(p, group["lr"])

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] += 1
        etaminus, etaplus = group["etas"]
        lo, hi = group["step_sizes"]
        g = -grad if group["maximize"] else grad
        prev, size = state["prev"], state["step_size"]
        s = (g * prev).sign()
        # s + 1 is 1 where s == 0 and stays NaN where the product was NaN, as PyTorch's masked writes leave it
        factor = where(s > 0, etaplus, where(s < 0, etaminus, s + 1))
        size = write_(size, (size * factor).clamp(lo, hi))
        g = where(s < 0, 0.0, g)
        write_(p, p - g.sign() * size)
        write_(prev, g)
