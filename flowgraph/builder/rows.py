"""``unbind_rows``: split a tensor into its rows for ``map(...).each()`` in linear time, forward and backward.

Slicing row ``i`` with ``x[i:i+1]`` is cheap forward, but each slice's backward writes its gradient into a
zero tensor of the full input's size, so ``B`` rows cost ``O(B^2)`` in backward. Here every row routes its
gradient into one shared collector node, which concatenates the ``B`` row gradients once. (A multi-output
``unbind`` in the core autograd would make this unnecessary.)
"""

from __future__ import annotations

from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..tensor import Tensor, cat, zeros
from ..tensor.tensor import _record_multi


def unbind_rows(x: Tensor) -> list[Tensor]:
    """The rows ``x[i:i+1]`` (batch dimension kept) whose gradients are gathered by a single concatenation."""
    n = x.shape[0]
    if not (x.requires_grad and is_grad_enabled()):
        return [x[i:i + 1] for i in range(n)]
    row_shape = (1,) + tuple(x.shape[1:])

    def collect(grads: tuple) -> tuple:
        g0 = next(g for g in grads if g is not None)
        parts = [g if g is not None else zeros(row_shape, dtype=g0.dtype, device=g0.device) for g in grads]
        return (cat(parts, 0),)

    with no_grad():
        rows = [x[i:i + 1] for i in range(n)]
    _record_multi(rows, "MapRows", (x,), (), collect)
    return rows
