"""Kernel launches with their argument block packed once (``cuLaunchKernel``'s ``kernelParams``).

CuPy's ``RawKernel.__call__`` converts every argument on every launch (a pointer object per array, a C value
per NumPy scalar): about 10 us of host time for a 13-argument launch on the H200's host, against about 4 us
for the driver's own ``cuLaunchKernel``. The backend's elementwise and reduction launches repeat one layout
many times (``_ew_plan``, ``_sum_plan``), so a :class:`PackedLaunch` made with the plan keeps the argument
block in an 8-byte word per parameter, with the integers already in place; a launch writes only the arrays'
device pointers and the scalars, then calls the driver (about 5 us for the same launch, measured with
``.probe/launchprobe.py``-style loops: 9.9 -> 5.2-5.7 us).

Each parameter gets an 8-byte word whatever its C type: the driver reads as many bytes as the kernel declares
from the start of the word, and the words are little-endian, so an ``int`` (4 bytes) or a ``bool`` (1 byte)
sits in the word's first bytes. A launch inside a CUDA graph's recording is recorded with the words' values
of that moment (the driver copies the block), as a ``RawKernel`` call is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

#: A parameter slot that the launch fills with an array's device pointer.
ARRAY = object()


class PackedLaunch:
    """One kernel launch layout: ``kernel`` (a ``cupy.RawKernel``), ``grid`` and ``block``, and the parameter
    template ``params``: NumPy scalars (written once, in their own type) and :data:`ARRAY` or scalar-dtype
    placeholders (a ``numpy.dtype``) filled at each launch, in order, by ``launch(values)``."""

    __slots__ = ("_fn", "_grid", "_block", "_words", "_block_ptr", "_fills", "_keep")

    def __init__(self, kernel: Any, grid: Sequence[int], block: Sequence[int], params: Sequence[Any]):
        n = len(params)
        words = np.zeros(max(n, 1), dtype=np.int64)
        self._fills: list[tuple[Any, int]] = []  # (target array, index) per placeholder, in order
        views: dict[np.dtype, np.ndarray] = {}
        for i, p in enumerate(params):
            if p is ARRAY:
                self._fills.append((words, i))
                continue
            dtype = p if isinstance(p, np.dtype) else np.asarray(p).dtype
            view = views.get(dtype)
            if view is None:
                view = views[dtype] = words.view(dtype)
            index = i * (8 // dtype.itemsize)
            if isinstance(p, np.dtype):
                self._fills.append((view, index))
            else:
                view[index] = p
        pointers = np.array([words.ctypes.data + 8 * i for i in range(max(n, 1))], dtype=np.uint64)
        self._words = words
        self._keep = (pointers, kernel)  # the pointer table and the kernel's module live as long as the plan
        self._block_ptr = pointers.ctypes.data
        self._fn = kernel.kernel.ptr
        self._grid = tuple(grid) + (1,) * (3 - len(grid))
        self._block = tuple(block) + (1,) * (3 - len(block))

    def launch(self, values: Sequence[Any]) -> None:
        """Launch on the current stream with ``values`` for the placeholders, in order: a ``cupy.ndarray``
        for each :data:`ARRAY` slot (its data pointer), a scalar for each dtype slot."""
        for (target, index), v in zip(self._fills, values):
            target[index] = v.data.ptr if type(v) is cupy.ndarray else v
        gx, gy, gz = self._grid
        bx, by, bz = self._block
        cupy.cuda.driver.launchKernel(self._fn, gx, gy, gz, bx, by, bz, 0,
                                      cupy.cuda.get_current_stream().ptr, self._block_ptr, 0)
