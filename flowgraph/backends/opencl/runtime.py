"""OpenCL runtime plumbing: device enumeration, one context and queue per device, the program cache.

Devices are numbered over all platforms in platform order, then device order: ``opencl:0`` is the first
device of the first platform. Contexts and built programs are module-level, so every backend instance
for the same device shares them, and a kernel source is compiled once per context per process (PoCL
also keeps its own on-disk cache in ``POCL_CACHE_DIR``).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from ...errors import BackendError

try:  # pyopencl is an optional dependency: without it there are simply no OpenCL devices.
    import pyopencl as cl
except ImportError:  # pragma: no cover - exercised only where pyopencl is absent
    cl = None

_CONTEXTS: dict[int, tuple[Any, Any, Any]] = {}
_PROGRAMS: dict[tuple[int, str], Any] = {}
_STATS = {"compiled": 0, "compile_seconds": 0.0}


def _all_devices() -> list[Any]:
    """Every OpenCL device over every platform, in numbering order (raises if the ICD loader fails)."""
    devices: list[Any] = []
    for platform in cl.get_platforms():
        try:
            devices.extend(platform.get_devices())
        except cl.Error:  # a platform with no devices of any type
            continue
    return devices


def list_devices() -> list[str]:
    """``["opencl:0", ...]`` for every device found; ``[]`` when pyopencl or a platform is missing."""
    if cl is None:
        return []
    try:
        return [f"opencl:{i}" for i in range(len(_all_devices()))]
    except Exception:  # noqa: BLE001 - no ICD, no platform, broken driver: no devices
        return []


def device_context(index: int) -> tuple[Any, Any, Any]:
    """``(device, context, queue)`` for ``opencl:index``, created once per process."""
    found = _CONTEXTS.get(index)
    if found is not None:
        return found
    if cl is None:
        raise BackendError(
            "device 'opencl' needs pyopencl, which is not installed; install it with: pip install 'flowgraph[opencl]'"
        )
    try:
        devices = _all_devices()
    except Exception as exc:  # noqa: BLE001
        raise BackendError(f"OpenCL platforms could not be listed ({exc}); is an ICD (e.g. PoCL) installed?") from exc
    if not 0 <= index < len(devices):
        names = [f"opencl:{i} ({d.name.strip()})" for i, d in enumerate(devices)] or ["none"]
        raise BackendError(f"no OpenCL device opencl:{index}; available: {', '.join(names)}")
    device = devices[index]
    context = cl.Context([device])
    queue = cl.CommandQueue(context, device)
    found = _CONTEXTS[index] = (device, context, queue)
    return found


def build_program(context: Any, source: str) -> Any:
    """The built program for ``source`` in ``context``, compiled at most once per process."""
    key = (context.int_ptr, source)
    program = _PROGRAMS.get(key)
    if program is None:
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # NVIDIA's compiler says "overriding noinline attribute" of every kernel, which pyopencl
                # reports as a bare "non-empty output" unless PYOPENCL_COMPILER_OUTPUT=1 asks for the text
                # (then real diagnostics still show).
                warnings.filterwarnings("ignore", message=r"(?s).*overriding noinline attribute", category=Warning)
                warnings.filterwarnings("ignore", message="Non-empty compiler output encountered", category=Warning)
                program = cl.Program(context, source).build()
        except cl.RuntimeError as exc:
            raise BackendError(
                "OpenCL kernel failed to build (a flowgraph bug; please report it with this source):\n"
                f"{exc}\n"
                f"--- source ---\n{source}"
            ) from exc
        _STATS["compiled"] += 1
        _STATS["compile_seconds"] += time.perf_counter() - start
        _PROGRAMS[key] = program
    return program


def compile_stats() -> dict[str, float]:
    """``{"compiled": programs built so far in this process, "compile_seconds": time spent building}``."""
    return dict(_STATS)
