"""Routing helpers for the graph builder: state adders, routers and selectors, loop halting conditions.

They plug into ``FlowBuilder`` verbs: ``StateAdd`` with ``.using`` (recurrent state), ``SoftmaxRouter`` /
``SigmoidRouter`` with ``.gate``, ``FixedSelector`` / ``ArgmaxSelector`` with ``.switch``, ``ThresholdHalt`` /
``LearnedHalt`` with ``.loop_body(...).while_cond/until_cond``. Routers and ``StateAdd`` accept any refs as
keyword arguments and add them to their input.
"""

from __future__ import annotations

from typing import Any

from ..errors import FlowError
from ..tensor import Tensor, int64, tensor
from .linear import Linear
from .module import Module

__all__ = ["ArgmaxSelector", "FixedSelector", "LearnedHalt", "SigmoidRouter", "SoftmaxRouter", "StateAdd",
           "ThresholdHalt"]
__functional__: list[str] = []


def _add_refs(x: Tensor, refs: dict[str, Any]) -> Tensor:
    for value in refs.values():
        x = x + value
    return x


class StateAdd(Module):
    """``x + sum(refs)``: with ``.through(StateAdd()).using("h").tag("h")`` it accumulates across calls.

    Example::

        g = FlowBuilder.from_(nn.Linear(4, 4)).through(nn.StateAdd()).using("memory").tag("memory").build()
    """

    def forward(self, x: Tensor, **refs: Tensor) -> Tensor:
        return _add_refs(x, refs)


def _check_count(n: int, name: str, where: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise FlowError(f"{where}: {name} (the number of experts or branches) must be an int >= 1, got {n!r}")


class SoftmaxRouter(Module):
    """Gate router: ``softmax(Linear(d, n)(x + sum(refs)))`` over the last dim; weights sum to 1."""

    def __init__(self, d: int, n: int):
        super().__init__()
        _check_count(n, "n", type(self).__name__)
        self.proj = Linear(d, n)

    def forward(self, x: Tensor, **refs: Tensor) -> Tensor:
        return self.proj(_add_refs(x, refs)).softmax(-1)


class SigmoidRouter(Module):
    """Gate router: ``sigmoid(Linear(d, n)(x + sum(refs)))``; each expert gated independently in (0, 1)."""

    def __init__(self, d: int, n: int):
        super().__init__()
        _check_count(n, "n", type(self).__name__)
        self.proj = Linear(d, n)

    def forward(self, x: Tensor, **refs: Tensor) -> Tensor:
        return self.proj(_add_refs(x, refs)).sigmoid()


class FixedSelector(Module):
    """Switch selector that always picks branch ``index`` for the whole batch (a 0-d int64 tensor)."""

    def __init__(self, index: int):
        super().__init__()
        self.index = int(index)

    def forward(self, x: Tensor, **refs: Tensor) -> Tensor:
        return tensor(self.index, dtype=int64, device=x.device)

    def extra_repr(self) -> str:
        return f"index={self.index}"


class ArgmaxSelector(Module):
    """Switch selector: per row, the argmax of ``Linear(d, n)(x + sum(refs))`` (shape ``(B,)``).

    The choice is not differentiable; the projection is a parameter for policy-gradient style training.
    """

    def __init__(self, d: int, n: int):
        super().__init__()
        _check_count(n, "n", type(self).__name__)
        self.proj = Linear(d, n)

    def forward(self, x: Tensor, **refs: Tensor) -> Tensor:
        return self.proj(_add_refs(x, refs)).argmax(-1)


class ThresholdHalt(Module):
    """Loop condition: per row, ``max(state row) - threshold`` (halts a row once its maximum exceeds it)."""

    def __init__(self, threshold: float):
        super().__init__()
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise FlowError(f"ThresholdHalt: threshold must be a number, got {threshold!r}")
        self.threshold = float(threshold)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim <= 1:
            return x.amax() - self.threshold
        return x.reshape(x.shape[0], -1).amax(-1) - self.threshold

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}"


class LearnedHalt(Module):
    """Loop condition: a learned probe ``Linear(d, 1)`` per row; a row halts where it is positive."""

    def __init__(self, d: int):
        super().__init__()
        self.proj = Linear(d, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).reshape(-1) if x.ndim == 2 else self.proj(x).squeeze(-1)
