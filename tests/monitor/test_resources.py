"""Resource sampling: real psutil figures, NVML and the backend pool when present, nothing when absent."""

from __future__ import annotations

import sys
import types

import flowgraph.backends as backends
from flowgraph.monitor.resources import ResourceSampler


def fake_nvml(calls: list) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: calls.append("init")
    module.nvmlShutdown = lambda: calls.append("shutdown")

    def handle(index):
        calls.append(("handle", index))
        return index

    module.nvmlDeviceGetHandleByIndex = handle
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=3 << 30, total=16 << 30, free=13 << 30
    )
    return module


def test_host_sample_has_cpu_and_ram_only():
    sample = ResourceSampler().sample("cpu")
    assert set(sample) == {"cpu", "ram_used", "ram_total"}


def test_nvml_figures_for_the_graphs_gpu(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    sampler = ResourceSampler()
    sample = sampler.sample("cuda:1")
    assert sample["gpu"] == 87.0
    assert sample["vram_used"] == 3 << 30 and sample["vram_total"] == 16 << 30
    assert ("handle", 1) in calls
    sampler.close()
    assert calls[-1] == "shutdown"


def test_backend_pool_figures_on_cuda(monkeypatch):
    class Pool:
        def memory_stats(self):
            return {"allocated": 1024, "peak": 4096}

    seen = []
    monkeypatch.setattr(backends, "get_backend", lambda device: seen.append(device) or Pool())
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML not installed
    sample = ResourceSampler().sample("cuda:0")
    assert seen == ["cuda:0"]
    assert sample["pool_allocated"] == 1024 and sample["pool_peak"] == 4096
    assert "pool_total" not in sample and "gpu" not in sample


def test_failing_sources_are_left_out(monkeypatch):
    def broken(device):
        raise RuntimeError("no CUDA here")

    monkeypatch.setattr(backends, "get_backend", broken)
    nvml = fake_nvml([])
    nvml.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("driver not loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sample = ResourceSampler().sample("cuda")
    assert set(sample) == {"cpu", "ram_used", "ram_total"}


def test_monitor_samples_the_graph_device(make_monitor, monkeypatch):
    from .conftest import FakeGraph

    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    graph = FakeGraph(device="cuda:0")
    graph.metrics = {"loss": 1.0}
    record = make_monitor(3).log(0, 0.1, graph)
    assert record["resources"]["gpu"] == 87.0
