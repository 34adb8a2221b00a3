"""``fg.cuda``: CUDA device queries and memory statistics, PyTorch's ``torch.cuda`` names.

    import flowgraph as fg
    if fg.cuda.is_available():
        x = fg.randn(1024, 1024, device="cuda")
        fg.cuda.synchronize()
        print(fg.cuda.memory_allocated(), fg.cuda.max_memory_allocated())

Every function works without CuPy or a GPU: ``is_available()`` is False and ``device_count()`` 0 then,
and the others raise a BackendError saying what is missing. Memory figures are bytes of CuPy's memory
pool on that device (flowgraph's tensors and anything else allocated through CuPy).
"""

from __future__ import annotations

from typing import Any

from .backends.registry import get_backend, parse_device
from .errors import BackendError


def _cuda_class() -> Any:
    try:
        from .backends.cuda import CupyBackend
    except ImportError:
        return None
    return CupyBackend


def is_available() -> bool:
    """Whether a CUDA device can be used (CuPy installed, a driver and at least one GPU)."""
    cls = _cuda_class()
    return bool(cls is not None and cls.is_available())


def device_count() -> int:
    """Number of visible CUDA devices (0 without CuPy or a GPU)."""
    cls = _cuda_class()
    return len(cls.list_devices()) if cls is not None else 0


def _backend(device: Any) -> Any:
    spec = "cuda" if device is None else device
    if isinstance(spec, int):
        spec = f"cuda:{spec}"
    name = parse_device(spec)
    if not name.startswith("cuda"):
        raise BackendError(f"fg.cuda: {device!r} is not a CUDA device; use 'cuda', 'cuda:N' or an index")
    if not is_available():
        raise BackendError(
            "fg.cuda: no CUDA device is available (install CuPy with: pip install 'flowgraph[cuda]', and "
            "check the NVIDIA driver with nvidia-smi)"
        )
    return get_backend(name)


def synchronize(device: Any = None) -> None:
    """Wait until all queued work on the device (default ``cuda:0``) has finished."""
    _backend(device).synchronize()


def memory_allocated(device: Any = None) -> int:
    """Bytes currently held by live arrays on the device."""
    return int(_backend(device).memory_stats()["allocated"])


def max_memory_allocated(device: Any = None) -> int:
    """The peak of :func:`memory_allocated` since the start or the last :func:`reset_peak_memory_stats`."""
    return int(_backend(device).memory_stats()["peak"])


def memory_reserved(device: Any = None) -> int:
    """Bytes the memory pool holds from the driver (allocated plus cached free blocks)."""
    return int(_backend(device).memory_stats()["reserved"])


def reset_peak_memory_stats(device: Any = None) -> None:
    """Restart :func:`max_memory_allocated` from the bytes allocated now."""
    _backend(device).reset_peak_memory_stats()


def empty_cache() -> None:
    """Give the memory pool's cached free blocks back to the driver (live arrays stay)."""
    if is_available():
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


def get_device_name(device: Any = None) -> str:
    """The GPU's name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
    return str(_backend(device).device_name)


__all__ = [
    "device_count", "empty_cache", "get_device_name", "is_available", "max_memory_allocated",
    "memory_allocated", "memory_reserved", "reset_peak_memory_stats", "synchronize",
]
