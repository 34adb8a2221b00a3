"""``fg.accelerator``: PyTorch's ``torch.accelerator`` queries, for scripts that pick their device with it.

    device = fg.accelerator.current_accelerator() if fg.accelerator.is_available() else "cpu"

The accelerator is CUDA when a CUDA device is usable; otherwise there is none (``None``). OpenCL devices are
not reported here, because OpenCL also covers CPUs (PoCL) where it would be slower than ``"cpu"``: pick one
explicitly from ``fg.available_devices()``. Devices are strings in flowgraph, so ``current_accelerator()``
returns ``"cuda:N"`` where PyTorch returns ``torch.device("cuda")``.
"""

from __future__ import annotations

from . import cuda


def is_available() -> bool:
    """Whether an accelerator (a CUDA device) is usable."""
    return cuda.is_available()


def current_accelerator(check_available: bool = False) -> str | None:
    """The current accelerator device, ``"cuda:N"`` (the device ``fg.cuda.set_device`` chose), or ``None``.

    ``check_available`` is PyTorch's argument; the answer is ``None`` whenever no CUDA device is usable."""
    del check_available  # a device is reported only when it is usable
    return f"cuda:{cuda.current_device()}" if cuda.is_available() else None


def device_count() -> int:
    """The number of accelerator devices (CUDA devices; 0 without one)."""
    return cuda.device_count()


def current_device_index() -> int:
    """The index of the current accelerator device (``fg.cuda.current_device()``); BackendError without one."""
    return cuda.current_device()


def set_device_index(device: int | str) -> None:
    """Make ``device`` the current accelerator device (``fg.cuda.set_device``)."""
    cuda.set_device(device)


__all__ = ["current_accelerator", "current_device_index", "device_count", "is_available", "set_device_index"]
