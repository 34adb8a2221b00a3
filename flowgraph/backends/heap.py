"""Keep freed host memory mapped between training steps (glibc's ``malloc``), so each step reuses pages.

A CPU training step allocates and frees the same tens of MiB every step (activations, im2col blocks,
gradients). With glibc's defaults that memory goes back to the system between steps: the free top of the heap
is returned once it exceeds ``M_TRIM_THRESHOLD``, and blocks above ``M_MMAP_THRESHOLD`` are mapped and unmapped
on their own; both start at 128 KiB and only grow as large blocks are freed. The next step then writes fresh
pages, one minor page fault per 4 KiB (~1.7 us each on the CI machine): dcgan_d's step paid 2000-2300 faults
(35.0 -> 29.7 ms of CPU time without them, `docs/benchmark.md`), dcgan_g's 4500 (46.1 -> 35.9 ms).

``retain_freed_memory`` sets both thresholds once (``mallopt``), as PyTorch users do with ``MALLOC_*``
variables or a preloaded jemalloc: blocks below 32 MiB come from the heap and up to 128 MiB of its free top
stays mapped. Nothing changes where the process is not on glibc or the user tuned ``malloc`` already.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 128 << 20

_TUNED_BY_USER = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_done: list[bool] = []


def retain_freed_memory() -> bool:
    """Raise glibc's ``M_MMAP_THRESHOLD`` to ``MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` to ``TRIM_THRESHOLD``, once
    per process. Returns whether the thresholds are set by this call or an earlier one; False (nothing done) off
    Linux/glibc, or where the user set glibc's own ``MALLOC_*_`` variables or a ``glibc.malloc`` tunable.

    Example::

        from flowgraph.backends.heap import retain_freed_memory
        retain_freed_memory()  # the NumPy backend calls it when it is created
    """
    if _done:
        return _done[0]
    ok = False
    tuned = any(name in os.environ for name in _TUNED_BY_USER) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", "")
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and not tuned:
        try:
            libc = ctypes.CDLL(None)
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                      TRIM_THRESHOLD))
    _done.append(ok)
    return ok
