"""``fg.cuda``: CUDA device queries and memory statistics, PyTorch's ``torch.cuda`` names.

    import flowgraph as fg
    if fg.cuda.is_available():
        x = fg.randn(1024, 1024, device="cuda")
        fg.cuda.synchronize()
        print(fg.cuda.memory_allocated(), fg.cuda.max_memory_allocated())

Every function works without CuPy or a GPU: ``is_available()`` and ``is_bf16_supported()`` are False and
``device_count()`` 0 then, and the others raise a BackendError saying what is missing. ``set_device(n)`` makes
``"cuda"`` mean ``"cuda:n"``, as in PyTorch. Memory figures are bytes of CuPy's memory
pool on that device (flowgraph's tensors and anything else allocated through CuPy).
"""

from __future__ import annotations

from typing import Any

from .backends.registry import default_index, get_backend, parse_device, set_default_index
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


def _cuda_name(device: Any) -> str:
    """``"cuda:N"`` for an index, a device string or None (the current device); BackendError otherwise."""
    spec = "cuda" if device is None else device
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise BackendError(f"fg.cuda: device index {spec} is negative; use 0 .. device_count() - 1")
        spec = f"cuda:{spec}"
    name = parse_device(spec)
    if not name.startswith("cuda"):
        raise BackendError(f"fg.cuda: {device!r} is not a CUDA device; use 'cuda', 'cuda:N' or an index")
    if not is_available():
        raise BackendError(
            "fg.cuda: no CUDA device is available (install CuPy with: pip install 'flowgraph[cuda]', and "
            "check the NVIDIA driver with nvidia-smi)"
        )
    return name


def _backend(device: Any) -> Any:
    return get_backend(_cuda_name(device))


def set_device(device: Any) -> None:
    """Make ``device`` (an index, ``"cuda:N"``) the current CUDA device, as ``torch.cuda.set_device``: from now on
    ``"cuda"`` means ``"cuda:N"`` (``x.to("cuda")``, ``fg.zeros(..., device="cuda")``, ``fg.device("cuda")``),
    and CuPy's current device is N. Explicit ``"cuda:M"`` strings are unaffected.

        fg.cuda.set_device(int(os.environ["LOCAL_RANK"]))   # one GPU per process
    """
    name = _cuda_name(device)
    index = int(name.partition(":")[2])
    if index >= device_count():
        raise BackendError(f"fg.cuda.set_device: device {name!r} does not exist: {device_count()} CUDA device(s) "
                           f"visible; use 0 .. {device_count() - 1}")
    import cupy

    cupy.cuda.Device(index).use()
    set_default_index("cuda", index)


def current_device() -> int:
    """The index of the current CUDA device (what ``"cuda"`` means; 0 unless :func:`set_device` changed it)."""
    _cuda_name(None)
    return default_index("cuda")


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """The compute capability ``(major, minor)`` of the device, e.g. ``(9, 0)`` for an H100."""
    import cupy

    index = int(_cuda_name(device).partition(":")[2])
    text = str(cupy.cuda.Device(index).compute_capability)  # e.g. "90"
    return int(text[:-1]), int(text[-1])


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether bfloat16 works on the current CUDA device, as ``torch.cuda.is_bf16_supported``: ``False`` without
    CUDA. flowgraph's CUDA kernels compute bfloat16 on every device (converting through float32), so with
    ``including_emulation`` (the default) the answer is ``True`` wherever CUDA is available; with
    ``including_emulation=False`` it is whether the device has native bfloat16 math (compute capability 8.0 or
    later: Ampere, Hopper, ...)."""
    if not is_available():
        return False
    if including_emulation:
        return True
    return get_device_capability() >= (8, 0)


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
    "current_device", "device_count", "empty_cache", "get_device_capability", "get_device_name", "is_available",
    "is_bf16_supported", "max_memory_allocated", "memory_allocated", "memory_reserved", "reset_peak_memory_stats",
    "set_device", "synchronize",
]
