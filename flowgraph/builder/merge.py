"""``MergeOp``: how ``.merge(op)`` combines the outputs of ``.split(...)`` branches."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from ..tensor import Tensor, cat, maximum


class MergeOp(Enum):
    """Combination of parallel branches: ``ADD``, ``MEAN``, ``CAT`` (last dim), ``MUL``, ``MAX`` (elementwise)

    ``.merge()`` also accepts a callable taking the list of branch outputs:
    ``.merge(lambda xs: xs[0] - xs[1])``.
    """

    ADD = "add"
    MEAN = "mean"
    CAT = "cat"
    MUL = "mul"
    MAX = "max"

    def __call__(self, tensors: Sequence[Tensor]) -> Tensor:
        """Combine ``tensors`` (one per branch, in branch order)."""
        if self is MergeOp.CAT:
            return cat(list(tensors), -1)
        out = tensors[0]
        for t in tensors[1:]:
            if self is MergeOp.MUL:
                out = out * t
            elif self is MergeOp.MAX:
                out = maximum(out, t)
            else:
                out = out + t
        if self is MergeOp.MEAN:
            out = out * (1.0 / len(tensors))
        return out
