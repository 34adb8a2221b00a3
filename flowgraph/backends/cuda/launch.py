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

A launch fills its placeholders without a Python step per value: the placeholders' words are grouped by kind
(arrays, then the lazy engine's arrays, then scalars), so ``launch_split`` packs ``map(attrgetter("data.ptr"),
arrays)`` and the scalars as they are, and ``launch`` (values in parameter order, arrays and scalars mixed)
picks the two kinds apart with ``itemgetter`` s made once per plan: all of it C calls. A comprehension over the
values with a type test each was the most executed line of an eager step (about 8 bytecodes a value, 1,000
values a step of convnet, 3,000 of gru_seq).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any

import cupy
import numpy as np

#: A parameter slot that the launch fills with an array's device pointer.
ARRAY = object()
#: A parameter slot that the launch fills with the device pointer of an object's ``value`` array (the lazy
#: engine's realized arrays), read in C as ``ARRAY`` is.
LAZY = object()

# Bound once: a launch is the most frequent host call of an eager step (about 7% of its bytecodes), and each
# ``cupy.cuda.x.y`` chain is a global and two or three attribute reads per call.
_launch_kernel = cupy.cuda.driver.launchKernel
_current_stream = cupy.cuda.get_current_stream
#: A ``cupy.ndarray``'s device pointer, read in C.
pointer_of = attrgetter("data.ptr")
_lazy_pointer = attrgetter("value.data.ptr")


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
    template ``params``: NumPy scalars (written once, in their own type) and :data:`ARRAY`, :data:`LAZY` or
    scalar-dtype placeholders (a ``numpy.dtype``) filled at each launch, in order, by ``launch(values)``.

    The constants live in one block of words and the placeholders in another, written by a single
    ``struct.pack_into`` per launch (one C call for all of them: a per-slot NumPy item assignment was about
    a third of a launch's Python); the driver's pointer table points each parameter at its word in either."""

    __slots__ = ("_fn", "_dims", "_pack", "_slots", "_block_ptr", "_keep", "_arrays", "_lazy", "_scalars")

    def __init__(self, kernel: Any, grid: Sequence[int], block: Sequence[int], params: Sequence[Any]):
        n = len(params)
        constants = np.zeros(max(n, 1), dtype=np.int64)
        # per kind, (parameter index, placeholder ordinal) of each placeholder, in parameter order
        kinds: dict[Any, list[tuple[int, int]]] = {ARRAY: [], LAZY: [], None: []}
        scalar_codes: list[str] = []
        ordinal = 0
        for i, p in enumerate(params):
            if p is ARRAY or p is LAZY:
                kinds[p].append((i, ordinal))
            elif isinstance(p, np.dtype):
                code = _WORD_CODES.get(p)
                if code is None:
                    raise TypeError(f"PackedLaunch: no parameter word layout for dtype {p}")
                kinds[None].append((i, ordinal))
                scalar_codes.append(code)
            else:
                value = np.asarray(p)
                constants.view(value.dtype)[i * (8 // value.itemsize)] = value
                continue
            ordinal += 1
        # the placeholder words: the arrays' pointers first, then the lazy arrays', then the scalars
        order = kinds[ARRAY] + kinds[LAZY] + kinds[None]
        word = {i: j for j, (i, _) in enumerate(order)}
        slots = np.zeros(max(len(word), 1), dtype=np.int64)
        pointers = np.array([slots.ctypes.data + 8 * word[i] if i in word else constants.ctypes.data + 8 * i
                             for i in range(n)] or [constants.ctypes.data], dtype=np.uint64)
        pointer_words = len(kinds[ARRAY]) + len(kinds[LAZY])
        self._pack = struct.Struct("<" + "Q" * pointer_words + "".join(scalar_codes)).pack_into
        self._slots = memoryview(slots).cast("B")
        self._arrays, self._lazy, self._scalars = (picker([k for _, k in kinds[kind]])
                                                   for kind in (ARRAY, LAZY, None))
        # the word blocks, the pointer table and the kernel's module live as long as the plan
        self._keep = (constants, slots, pointers, kernel)
        self._block_ptr = pointers.ctypes.data
        self._fn = kernel.kernel.ptr
        # grid x, y, z then block x, y, z: the launch passes them as they are
        self._dims = tuple(grid) + (1,) * (3 - len(grid)) + tuple(block) + (1,) * (3 - len(block))

    def launch(self, values: Sequence[Any]) -> None:
        """Launch on the current stream with ``values`` for the placeholders, in order: a ``cupy.ndarray`` for
        each :data:`ARRAY` slot (its data pointer), an array with one in ``value`` for each :data:`LAZY` slot,
        a scalar for each dtype slot (a NumPy scalar, or a Python number)."""
        self._pack(self._slots, 0, *map(pointer_of, self._arrays(values)), *map(_lazy_pointer, self._lazy(values)),
                   *self._scalars(values))
        _launch_kernel(self._fn, *self._dims, 0, _current_stream().ptr, self._block_ptr, 0)

    def launch_split(self, arrays: Any, scalars: Any = ()) -> None:
        """``launch`` with the placeholders' values given by kind, for a plan without :data:`LAZY` slots:
        ``arrays`` (``cupy.ndarray`` s, any iterable) for the :data:`ARRAY` slots and ``scalars`` for the dtype
        slots, each in order."""
        self._pack(self._slots, 0, *map(pointer_of, arrays), *scalars)
        _launch_kernel(self._fn, *self._dims, 0, _current_stream().ptr, self._block_ptr, 0)


def picker(positions: Sequence[int]) -> Any:
    """A C callable taking a sequence to its items at ``positions`` (a sequence in every case: ``itemgetter``
    of one index returns the item itself, so one position is a one-element slice)."""
    if len(positions) == 1:
        return itemgetter(slice(positions[0], positions[0] + 1))
    if not positions:
        return itemgetter(slice(0, 0))
    return itemgetter(*positions)
