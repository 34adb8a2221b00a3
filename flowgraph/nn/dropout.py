"""Dropout: ``Dropout``, ``Dropout1d/2d/3d`` (whole channels), ``AlphaDropout``.

Masks come from ``fg.rand`` on the input's device, so ``fg.manual_seed`` makes them reproducible; every
layer is the identity in ``eval()`` mode (or with ``training=False``).
"""

from __future__ import annotations

from ..errors import FlowError, ShapeError
from ..tensor import Tensor, rand
from ..tensor.indexing import apply_inplace
from .module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout"]
__functional__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout"]


def _check_p(p: float, where: str) -> None:
    if not 0.0 <= p <= 1.0:
        raise FlowError(f"{where}: dropout probability has to be between 0 and 1, got {p}")


def _keep_mask(x: Tensor, shape: tuple[int, ...], p: float) -> Tensor:
    """1 with probability ``1 - p``, else 0, in ``x``'s dtype, of ``shape`` (broadcastable to ``x``)."""
    return (rand(*shape, dtype=x.dtype, device=x.device) >= p).to(x.dtype)


def _apply(x: Tensor, fn, inplace: bool, name: str) -> Tensor:
    return apply_inplace(x, fn, name + "_") if inplace else fn(x)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p``, scale the rest by ``1/(1-p)``; identity when not training::

    h = F.dropout(h, 0.1, training=model.training)
    """
    _check_p(p, "dropout")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _apply(input, lambda x: x * 0.0, inplace, "dropout")
    return _apply(input, lambda x: x * (_keep_mask(x, x.shape, p) * (1.0 / (1.0 - p))), inplace, "dropout")


def _feature_dropout(input: Tensor, p: float, training: bool, inplace: bool, nd: int) -> Tensor:
    where = f"dropout{nd}d"
    _check_p(p, where)
    if input.ndim not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{where}: expected a {nd + 1}-d (unbatched) or {nd + 2}-d input (N, C, *spatial), "
            f"got shape {input.shape}"
        )
    if not training or p == 0.0:
        return input
    lead = input.ndim - nd  # (N, C) or (C,)
    shape = tuple(input.shape[:lead]) + (1,) * nd
    if p == 1.0:
        return _apply(input, lambda x: x * 0.0, inplace, where)
    return _apply(input, lambda x: x * (_keep_mask(x, shape, p) * (1.0 / (1.0 - p))), inplace, where)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, L)`` (or ``(C, L)``) with probability ``p``."""
    return _feature_dropout(input, p, training, inplace, 1)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, H, W)`` (or ``(C, H, W)``) with probability ``p``."""
    return _feature_dropout(input, p, training, inplace, 2)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels of ``(N, C, D, H, W)`` (or ``(C, D, H, W)``) with probability ``p``."""
    return _feature_dropout(input, p, training, inplace, 3)


_SELU_ALPHA_PRIME = -1.7580993408473766  # -scale * alpha of SELU


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped units take SELU's negative saturation value and an affine map
    keeps the mean and variance (identity when not training)."""
    _check_p(p, "alpha_dropout")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _apply(input, lambda x: x * 0.0, inplace, "alpha_dropout")
    a = ((1.0 - p) * (1.0 + p * _SELU_ALPHA_PRIME**2)) ** -0.5
    b = -a * _SELU_ALPHA_PRIME * p

    def fn(x: Tensor) -> Tensor:
        keep = _keep_mask(x, x.shape, p)
        return (x * keep + (1.0 - keep) * _SELU_ALPHA_PRIME) * a + b

    return _apply(input, fn, inplace, "alpha_dropout")


class _DropoutNd(Module):
    _fn = staticmethod(dropout)

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        _check_p(p, type(self).__name__)
        self.p = p
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero elements with probability ``p`` in training and scale the rest by ``1/(1-p)``."""


class Dropout1d(_DropoutNd):
    """Zero whole channels of ``(N, C, L)`` inputs with probability ``p``."""

    _fn = staticmethod(dropout1d)


class Dropout2d(_DropoutNd):
    """Zero whole channels of ``(N, C, H, W)`` inputs with probability ``p``."""

    _fn = staticmethod(dropout2d)


class Dropout3d(_DropoutNd):
    """Zero whole channels of ``(N, C, D, H, W)`` inputs with probability ``p``."""

    _fn = staticmethod(dropout3d)


class AlphaDropout(_DropoutNd):
    """Alpha dropout for self-normalising (SELU) networks."""

    _fn = staticmethod(alpha_dropout)
