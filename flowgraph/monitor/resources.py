"""System resources sampled at each ``Monitor.log``: CPU, RAM, GPU utilisation, VRAM, backend memory pool.

Every source is optional. psutil gives CPU and RAM, NVIDIA's NVML (the ``pynvml`` module of nvidia-ml-py)
gives GPU utilisation and VRAM (of the graph's CUDA device, else of GPU 0), and a CUDA backend's
``memory_stats()`` gives its own pool figures. A source
that is not installed or fails is left out of the sample; nothing is ever estimated or faked.
"""

from __future__ import annotations

import importlib
from typing import Any


def _cuda_index(device: str | None) -> int | None:
    """The GPU index of a ``cuda`` / ``cuda:N`` device string; None for other devices."""
    if not device or not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


class ResourceSampler:
    """Takes one resource sample per call of :meth:`sample`.

    Keys of a sample (each only when its source is available): ``cpu`` (system CPU %, averaged since the
    previous sample), ``ram_used`` / ``ram_total`` (bytes), ``gpu`` (GPU utilisation %), ``vram_used`` /
    ``vram_total`` (bytes, from NVML), ``pool_allocated`` / ``pool_peak`` / ``pool_total`` (bytes, from the
    backend's memory pool).
    """

    def __init__(self) -> None:
        self._psutil: Any = None
        try:
            self._psutil = importlib.import_module("psutil")
            self._psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        except Exception:
            self._psutil = None
        self._nvml: Any = None
        self._nvml_tried = False

    def _nvml_module(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                nvml = importlib.import_module("pynvml")
                nvml.nvmlInit()
                self._nvml = nvml
            except Exception:
                self._nvml = None
        return self._nvml

    def sample(self, device: str | None = None) -> dict[str, float]:
        """One sample; ``device`` is the graph's device string (selects the GPU and the backend pool)."""
        resources: dict[str, float] = {}
        self._sample_host(resources)
        self._sample_nvml(resources, device)
        self._sample_pool(resources, device)
        return resources

    def _sample_host(self, resources: dict[str, float]) -> None:
        if self._psutil is None:
            return
        try:
            resources["cpu"] = round(float(self._psutil.cpu_percent(interval=None)), 1)
            memory = self._psutil.virtual_memory()
            resources["ram_used"] = int(memory.total - memory.available)
            resources["ram_total"] = int(memory.total)
        except Exception:
            resources.pop("cpu", None)

    def _sample_nvml(self, resources: dict[str, float], device: str | None) -> None:
        index = _cuda_index(device) or 0  # the graph's GPU, else the first one
        nvml = self._nvml_module()
        if nvml is None:
            return
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            utilisation = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            return
        resources["gpu"] = float(utilisation.gpu)
        resources["vram_used"] = int(memory.used)
        resources["vram_total"] = int(memory.total)

    def _sample_pool(self, resources: dict[str, float], device: str | None) -> None:
        if _cuda_index(device) is None:
            return
        try:
            from flowgraph.backends import get_backend

            stats = get_backend(device).memory_stats()
        except Exception:
            return
        for key in ("allocated", "peak", "total"):
            value = stats.get(key) if isinstance(stats, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                resources[f"pool_{key}"] = int(value)

    def close(self) -> None:
        """Release NVML if it was initialised."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
