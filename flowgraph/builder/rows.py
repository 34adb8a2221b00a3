"""``unbind_rows``: split a tensor into its rows for ``map(...).each()`` in linear time, forward and backward.

Slicing row ``i`` with ``x[i:i+1]`` is cheap forward, but each slice's backward writes its gradient into a
zero tensor of the full input's size, so ``B`` rows cost ``O(B^2)`` in backward. Here every row routes its
gradient into one shared collector node, which concatenates the ``B`` row gradients once. (A multi-output
``unbind`` in the core autograd would make this unnecessary.)
"""

from __future__ import annotations

from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..tensor import Tensor, cat, zeros
from ..tensor.tensor import _attach


def unbind_rows(x: Tensor) -> list[Tensor]:
    """The rows ``x[i:i+1]`` (batch dimension kept) whose gradients are gathered by a single concatenation."""
    n = x.shape[0]
    if not (x.requires_grad and is_grad_enabled()):
        return [x[i:i + 1] for i in range(n)]
    row_grads: list[Tensor | None] = [None] * n
    row_shape = (1,) + tuple(x.shape[1:])

    def collect(_: Tensor) -> tuple:
        parts = [g if g is not None else zeros(row_shape, dtype=x.dtype, device=x.device) for g in row_grads]
        row_grads[:] = [None] * n
        return (cat(parts, 0),)

    with no_grad():
        hub = x.detach()
    _attach(hub, collect, (x,), "MapRows")
    rows = []
    for i in range(n):
        with no_grad():
            row = x[i:i + 1]

        def route(g: Tensor, i: int = i) -> tuple:
            row_grads[i] = g
            # The collector ignores this value; a 0-d zero keeps the hand-off O(1) per row.
            return (zeros((), dtype=g.dtype, device=g.device),)

        rows.append(_attach(row, route, (hub,), "MapRow"))
    return rows
