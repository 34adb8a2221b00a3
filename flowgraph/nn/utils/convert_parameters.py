"""``parameters_to_vector`` and ``vector_to_parameters``."""

from __future__ import annotations

from collections.abc import Iterable

from ...autograd.grad_mode import no_grad
from ...errors import ShapeError
from ...tensor import Tensor, cat


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """Concatenate the parameters, flattened, into one 1-d tensor."""
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of ``vec`` into the parameters (in place)."""
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if vec.ndim != 1 or vec.shape[0] != total:
        raise ShapeError(f"vector_to_parameters: expected a 1-d tensor of {total} elements, got shape {vec.shape}")
    start = 0
    with no_grad():
        for p in params:
            n = p.numel()
            p.copy_(vec[start:start + n].reshape(p.shape))
            start += n
