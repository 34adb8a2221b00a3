"""Device strings, the backend registry and ``available_devices``.

A device string is ``"<type>"`` or ``"<type>:<index>"``: ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``, or the device
``fg.cuda.set_device`` chose), ``"opencl:1"``. Each device type maps to a backend class registered here by
import path, so the array libraries (CuPy, PyOpenCL) are imported only when a device of that type is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import BackendError
from .base import Backend

# type -> "module:Class"; imported lazily so `import flowgraph` never imports cupy or pyopencl.
_BACKEND_CLASSES: dict[str, str] = {
    "cpu": "flowgraph.backends.array_backend:NumpyBackend",
    "cuda": "flowgraph.backends.cuda.backend:CupyBackend",
    "opencl": "flowgraph.backends.opencl:OpenCLBackend",
}
_INSTANCES: dict[str, Backend] = {}
_SEED: list[int] = [0]
#: The index a bare device type means (``"cuda"`` -> ``"cuda:<index>"``), as ``torch.cuda.set_device`` sets it.
_DEFAULT_INDEX: dict[str, int] = {}


def set_default_index(device_type: str, index: int) -> None:
    """Make the bare ``device_type`` (``"cuda"``) mean ``"<device_type>:<index>"`` from now on."""
    _DEFAULT_INDEX[device_type] = int(index)
    for key in [k for k in _INSTANCES if k.split(":")[0].strip().lower() == device_type and ":" not in k]:
        del _INSTANCES[key]  # cached aliases of the old default


def default_index(device_type: str) -> int:
    """The index a bare ``device_type`` means (0 unless :func:`set_default_index` changed it)."""
    return _DEFAULT_INDEX.get(device_type, 0)


def register_backend(device_type: str, target: str) -> None:
    """Register (or replace) the backend class for ``device_type`` as ``"module:Class"``."""
    _BACKEND_CLASSES[device_type] = target
    for key in [k for k in _INSTANCES if k.split(":")[0] == device_type]:
        del _INSTANCES[key]


def parse_device(device: Any) -> str:
    """Normalise a device spec (``"cuda"``, ``"cuda:1"``, a Backend, a Device) to ``"type[:index]"``."""
    if isinstance(device, Backend):
        return device.device
    text = str(device).strip().lower()
    kind, _, index = text.partition(":")
    if kind not in _BACKEND_CLASSES:
        raise BackendError(
            f"unknown device {device!r}: expected one of {sorted(_BACKEND_CLASSES)} optionally with ':<index>', "
            "e.g. 'cpu', 'cuda:0', 'opencl:1'"
        )
    if kind == "cpu":
        if index not in ("", "0"):
            raise BackendError(f"device {device!r}: the cpu device has no index other than 0; use 'cpu'")
        return "cpu"
    if index == "":
        index = str(_DEFAULT_INDEX.get(kind, 0))
    if not index.isdigit():
        raise BackendError(f"device {device!r}: the index after ':' must be a non-negative integer")
    return f"{kind}:{int(index)}"


def _backend_class(kind: str) -> type:
    module_name, _, cls_name = _BACKEND_CLASSES[kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = {"cuda": "cuda", "opencl": "opencl"}.get(kind, kind)
        raise BackendError(
            f"device type {kind!r} needs a package that is not installed ({exc}); "
            f"install it with: pip install 'flowgraph[{extra}]'"
        ) from exc
    return getattr(module, cls_name)


def get_backend(device: Any = "cpu") -> Backend:
    """The (cached) backend instance for a device spec; raises BackendError when it is unusable."""
    if isinstance(device, Backend):
        return device
    key = device if device in _INSTANCES else parse_device(device)
    backend = _INSTANCES.get(key)
    if backend is None:
        cls = _backend_class(key.split(":")[0])
        backend = cls(key)
        backend.seed(_SEED[0])
        _INSTANCES[key] = backend
        _INSTANCES.setdefault(str(device), backend)
    return backend


def seed_all(seed: int) -> None:
    """Seed every backend created so far and every one created later."""
    _SEED[0] = int(seed)
    for backend in set(_INSTANCES.values()):
        backend.seed(int(seed))


def available_devices() -> list[str]:
    """Every device usable now, e.g. ``["cpu", "opencl:0", "cuda:0"]``; never raises."""
    devices = ["cpu"]
    for kind in _BACKEND_CLASSES:
        if kind == "cpu":
            continue
        try:
            cls = _backend_class(kind)
            devices.extend(cls.list_devices())
        except Exception:  # noqa: BLE001 - a missing or broken driver simply means no such device
            continue
    return devices
