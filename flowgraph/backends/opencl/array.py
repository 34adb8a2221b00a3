"""``CLArray``: the OpenCL backend's native array, a strided view of a device buffer or a pending expression.

A realized array is (buffer, shape, strides, offset, dtype) with strides and offset counted in elements;
views (reshape of a contiguous array, permute, expand with zero strides, slicing, flips with negative
strides) share the buffer. A lazy array has no buffer yet: ``lazy`` holds the fused elementwise
expression (``flowgraph.backends.fusion.Expr``) that computes it, and its backend realizes it into a
fresh contiguous buffer at the first point that needs one.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..lazy import LazyArrayBase

if TYPE_CHECKING:
    from ..fusion import Expr
    from .backend import OpenCLBackend

Shape = tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """Row-major strides (in elements) of ``shape`` (memoised: every new array asks, for a few shapes)."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=4096)
def is_contiguous(shape: Shape, strides: tuple[int, ...]) -> bool:
    """Whether ``strides`` lay ``shape`` out row-major (size-1 axes may have any stride); memoised."""
    step = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 0:
            return True
        if n != 1 and s != step:
            return False
        step *= n
    return True


def shape_size(shape: Shape) -> int:
    """Number of elements of ``shape``."""
    return math.prod(shape)


class CLArray(LazyArrayBase):
    """A strided array on an OpenCL device (or a pending fused expression that will become one).

    Layers above read only ``shape``, ``ndim``, ``dtype``, ``size`` and ``len()``; the backend owns the rest.
    """

    __slots__ = ("backend", "buffer", "shape", "strides", "offset", "dtype", "lazy", "consumers", "__weakref__")

    def __init__(
        self,
        backend: OpenCLBackend,
        buffer: Any,
        shape: Shape,
        strides: tuple[int, ...] | None,
        offset: int,
        dtype: np.dtype,
        lazy: Expr | None = None,
    ):
        self.backend = backend
        self.buffer = buffer
        self.shape = shape
        self.strides = contiguous_strides(shape) if strides is None else strides
        self.offset = offset
        self.dtype = dtype
        self.lazy = lazy
        #: lazy arrays whose expression reads this (still lazy) array directly; see OpenCLBackend.assign
        self.consumers: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes the elements take when contiguous."""
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        """Whether this is a realized row-major layout (any offset)."""
        return self.lazy is None and is_contiguous(self.shape, self.strides)

    def __repr__(self) -> str:
        state = "lazy" if self.lazy is not None else f"strides={self.strides}, offset={self.offset}"
        return f"CLArray(shape={self.shape}, dtype={self.dtype}, {state}, device={self.backend.device})"
