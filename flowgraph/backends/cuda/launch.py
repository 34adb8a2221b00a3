"""Kernel launches with their argument block packed once (``cuLaunchKernel``'s ``kernelParams``).

CuPy's ``RawKernel.__call__`` converts every argument on every launch (a pointer object per array, a C value
per NumPy scalar): about 10 us of host time for a 13-argument launch on the H200's host, against about 4 us
for the driver's own ``cuLaunchKernel``. The backend's elementwise and reduction launches repeat one layout
many times (``_ew_plan``, ``_sum_plan``), so a :class:`PackedLaunch` made with the plan keeps the argument
block in an 8-byte word per parameter, with the integers already in place; a launch writes only the arrays'
device pointers and the scalars (one ``struct.pack_into``), then calls the driver (about 5 us for the same
launch, measured with ``.probe/launchprobe.py``-style loops: 9.9 -> 5.2-5.7 us).

Each parameter gets an 8-byte word whatever its C type: the driver reads as many bytes as the kernel declares
from the start of the word, and the words are little-endian, so an ``int`` (4 bytes) or a ``bool`` (1 byte)
sits in the word's first bytes. A launch inside a CUDA graph's recording is recorded with the words' values
of that moment (the driver copies the block), as a ``RawKernel`` call is.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

#: A parameter slot that the launch fills with an array's device pointer.
ARRAY = object()

# Bound once: a launch is the most frequent host call of an eager step (about 7% of its bytecodes), and each
# ``cupy.cuda.x.y`` chain is a global and two or three attribute reads per call.
_launch_kernel = cupy.cuda.driver.launchKernel
_current_stream = cupy.cuda.get_current_stream
_ndarray = cupy.ndarray


#: ``struct`` codes of an 8-byte parameter word per placeholder dtype: the value in the word's first bytes
#: (little-endian), the rest padding.
_WORD_CODES = {
    np.dtype(np.int8): "b7x", np.dtype(np.uint8): "B7x", np.dtype(np.bool_): "?7x",
    np.dtype(np.int16): "h6x", np.dtype(np.uint16): "H6x", np.dtype(np.float16): "e6x",
    np.dtype(np.int32): "i4x", np.dtype(np.uint32): "I4x", np.dtype(np.float32): "f4x",
    np.dtype(np.int64): "q", np.dtype(np.uint64): "Q", np.dtype(np.float64): "d",
}


class PackedLaunch:
    """One kernel launch layout: ``kernel`` (a ``cupy.RawKernel``), ``grid`` and ``block``, and the parameter
    template ``params``: NumPy scalars (written once, in their own type) and :data:`ARRAY` or scalar-dtype
    placeholders (a ``numpy.dtype``) filled at each launch, in order, by ``launch(values)``.

    The constants live in one block of words and the placeholders in another, written by a single
    ``struct.pack_into`` per launch (one C call for all of them: a per-slot NumPy item assignment was about
    a third of a launch's Python); the driver's pointer table points each parameter at its word in either."""

    __slots__ = ("_fn", "_dims", "_pack", "_slots", "_block_ptr", "_keep")

    def __init__(self, kernel: Any, grid: Sequence[int], block: Sequence[int], params: Sequence[Any]):
        n = len(params)
        constants = np.zeros(max(n, 1), dtype=np.int64)
        codes: list[str] = []
        where: list[tuple[bool, int]] = []  # per parameter: (a placeholder?, its word index in its block)
        for i, p in enumerate(params):
            if p is ARRAY or isinstance(p, np.dtype):
                code = "Q" if p is ARRAY else _WORD_CODES.get(p)
                if code is None:
                    raise TypeError(f"PackedLaunch: no parameter word layout for dtype {p}")
                where.append((True, len(codes)))
                codes.append(code)
                continue
            value = np.asarray(p)
            constants.view(value.dtype)[i * (8 // value.itemsize)] = value
            where.append((False, i))
        slots = np.zeros(max(len(codes), 1), dtype=np.int64)
        pointers = np.array([(slots if placeholder else constants).ctypes.data + 8 * j for placeholder, j in where]
                            or [constants.ctypes.data], dtype=np.uint64)
        self._pack = struct.Struct("<" + "".join(codes)).pack_into
        self._slots = memoryview(slots).cast("B")
        # the word blocks, the pointer table and the kernel's module live as long as the plan
        self._keep = (constants, slots, pointers, kernel)
        self._block_ptr = pointers.ctypes.data
        self._fn = kernel.kernel.ptr
        # grid x, y, z then block x, y, z: the launch passes them as they are
        self._dims = tuple(grid) + (1,) * (3 - len(grid)) + tuple(block) + (1,) * (3 - len(block))

    def launch(self, values: Sequence[Any]) -> None:
        """Launch on the current stream with ``values`` for the placeholders, in order: a ``cupy.ndarray``
        for each :data:`ARRAY` slot (its data pointer), a scalar for each dtype slot."""
        self._pack(self._slots, 0, *[v.data.ptr if type(v) is _ndarray else v for v in values])
        _launch_kernel(self._fn, *self._dims, 0, _current_stream().ptr, self._block_ptr, 0)
