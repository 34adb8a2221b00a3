"""``SparseAdam``: PyTorch's lazy Adam for sparse gradients, which flowgraph does not have."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..autograd.grad_mode import enable_grad
from ..errors import FlowError
from .optimizer import Optimizer, ParamsT, check_betas, check_range


class SparseAdam(Optimizer):
    """PyTorch's ``torch.optim.SparseAdam``: same arguments, defaults and checks, and the same refusal of dense
    gradients at ``step()``.

    PyTorch's SparseAdam only accepts sparse gradients (from ``nn.Embedding(..., sparse=True)``) and raises on
    a dense one. Every flowgraph gradient is dense (``sparse=True`` is accepted and ignored), so ``step()``
    raises a ``FlowError`` as soon as a parameter has a gradient, saying to use ``optim.Adam`` (its dense
    update is what SparseAdam computes on the rows a sparse gradient touches). A step where no parameter has
    a gradient does nothing, as in PyTorch.

    >>> opt = optim.Adam(embedding.parameters(), lr=1e-3)     # instead of optim.SparseAdam
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("SparseAdam", "lr", group["lr"], 0.0, low_open=True)
        check_range("SparseAdam", "eps", group["eps"], 0.0, low_open=True)
        check_betas("SparseAdam", group["betas"])

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Raise a FlowError if any parameter has a gradient (they are dense); otherwise return the loss."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is not None:
                    raise FlowError(
                        f"SparseAdam.step: parameter {j} of group {i} has a dense gradient, and SparseAdam "
                        "(as in PyTorch) only takes sparse ones; flowgraph's gradients are always dense "
                        "(nn.Embedding(sparse=True) included), so use optim.Adam (or optim.AdamW) instead"
                    )
        return loss
