"""What activation checkpointing saves and costs on the residual_tower benchmark model.

    python benchmarks/activation_checkpoint.py [--device cpu] [--scale 1.0] [--batch N] [--steps 3]
    python benchmarks/activation_checkpoint.py --device cuda            # on an NVIDIA GPU (adds PyTorch)

The model is residual_tower (``benchmarks/models.py``: Linear, 12 residual blocks Linear-GELU-LayerNorm,
Linear) with the tower built as a labelled subgraph ``tower`` whose blocks are tagged ``b0`` ... ``b11``, so
it can be checkpointed by path. One training step is forward, MSE loss, backward (gradients set to None
before, so they count). Four runs from the same weights:

- ``plain``: nothing checkpointed;
- ``tower``: ``model.checkpoint_activations("tower", keep_tag_values=False)``, the tower as one segment
  (backward recomputes it whole, so the peak hardly moves: shown for the lesson);
- ``blocks+tv``: ``model.checkpoint_activations(f"tower.b{i}")`` for each block: the tower keeps only the
  blocks' inputs and recomputes one block at a time, but the graph's ``tag_values`` (the last forward's
  record) still holds every block's output until the next forward;
- ``blocks``: the same with ``keep_tag_values=False``: each block's input is freed once its backward ran.

Memory, above what was allocated before the step (parameters, batch): the bytes kept after forward (the
saved activations) and the step's peak (activations + gradients), plus the total peak. On cpu NumPy's
allocations as ``tracemalloc`` sees them (NumPy reports its buffers to it); on cuda and opencl the backend's
own ``memory_stats()`` (allocated and peak bytes: on cuda CuPy's pool through flowgraph's peak tracker), and on cuda
PyTorch's ``torch.utils.checkpoint`` per block on the same model for comparison. Time: the median step
(without tracemalloc), wall and process CPU time. Gradients are checked equal to the plain run's.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402

import flowgraph as fg  # noqa: E402
from benchmarks.models import spec  # noqa: E402
from flowgraph import nn  # noqa: E402
from flowgraph.builder import FlowBuilder, Graph  # noqa: E402

BLOCKS = 12


def build(width: int, hidden: int, out: int):
    """residual_tower with the tower as the labelled subgraph ``tower``, its blocks tagged ``b0``..``b11``."""
    tower = FlowBuilder()
    for i in range(BLOCKS):
        tower = tower.also(nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden))).tag(f"b{i}")
    return (FlowBuilder.from_(nn.Linear(width, hidden)).through(tower.label("tower").build())
            .through(nn.Linear(hidden, out)).build())


class Meter:
    """Bytes of one step: kept after forward, and the peak, both above what was allocated before it.

    On cpu tracemalloc sees the step's own allocations (it starts just before it), and the bytes before are
    the parameters' and the batch's; on cuda the pool's counters give both."""

    def __init__(self, device: str):
        self.backend = fg.get_backend(device)
        self.host = device == "cpu"
        self.pool = not self.host and "peak" in self.backend.memory_stats()

    def measure(self, forward, backward, resident: int) -> tuple[int, int, int] | None:
        """``(bytes before, kept after forward, peak)`` of ``backward(forward())``; None without a counter."""
        if self.pool:  # cuda, opencl: the backend's own allocation counters
            bk = self.backend
            gc.collect()  # nothing of earlier steps left for the cyclic collector in "before"
            bk.synchronize()
            bk.reset_peak_memory_stats()
            before = bk.memory_stats()["allocated"]
            loss = forward()
            bk.synchronize()
            kept = bk.memory_stats()["allocated"] - before
            backward(loss)
            del loss
            bk.synchronize()
            return before, kept, bk.memory_stats()["peak"] - before
        if self.host:
            tracemalloc.start()
            try:
                loss = forward()
                kept = tracemalloc.get_traced_memory()[0]
                backward(loss)
                del loss
                return resident, kept, tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        return None


def run_flowgraph(mode: str, args, sp, x, y, meter: Meter) -> dict:
    fg.manual_seed(0)
    model = build(sp.width, sp.hidden, sp.out).to(args.device)
    if mode == "tower":
        model.checkpoint_activations("tower", keep_tag_values=False)
    elif mode in ("blocks", "blocks+tv"):
        for i in range(BLOCKS):
            model.checkpoint_activations(f"tower.b{i}", keep_tag_values=mode == "blocks+tv")
    params = list(model.parameters())
    backend = fg.get_backend(args.device)

    def forward():
        for p in params:
            p.grad = None
        return fg.nn.functional.mse_loss(model(x), y)

    def backward(loss):
        loss.backward()
        return loss.item()

    def step():
        return backward(forward())

    step()  # warm-up (kernels compiled, pools filled)
    times, cpu_times = [], []
    for _ in range(args.steps):
        backend.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        backend.synchronize()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    resident = sum(t.numel() * t.element_size() for t in (*params, x, y))
    for p in params:  # as the torch side does: the last step's gradients are not part of the next step's bytes
        p.grad = None
    for m in model.modules():  # nor the last forward's tag values (the graph keeps them until the next forward)
        if isinstance(m, Graph):
            m.tag_values.clear()
    mem = meter.measure(forward, backward, resident)
    grads = [p.grad.detach().numpy() for p in params]
    return {"mode": mode, "seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu_times),
            "mem": mem, "grads": grads}


def run_torch(mode: str, args, sp, xn, yn) -> dict | None:
    try:
        import torch
        from torch.utils.checkpoint import checkpoint
    except ImportError:
        return None
    torch.manual_seed(0)
    dev = "cuda"
    first = torch.nn.Linear(sp.width, sp.hidden).to(dev)
    blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(sp.hidden, sp.hidden), torch.nn.GELU(),
                                                      torch.nn.LayerNorm(sp.hidden)) for _ in range(BLOCKS)]).to(dev)
    last = torch.nn.Linear(sp.hidden, sp.out).to(dev)
    params = [*first.parameters(), *blocks.parameters(), *last.parameters()]
    x, y = torch.from_numpy(xn).to(dev), torch.from_numpy(yn).to(dev)

    def forward():
        h = first(x)
        for b in blocks:
            h = h + (checkpoint(b, h, use_reentrant=False) if mode == "blocks" else b(h))
        return last(h)

    def step():
        for p in params:
            p.grad = None
        loss = torch.nn.functional.mse_loss(forward(), y)
        loss.backward()
        return loss.item()

    step()
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    for p in params:
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = torch.nn.functional.mse_loss(forward(), y)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    loss.backward()
    del loss
    torch.cuda.synchronize()
    return {"mode": mode, "seconds": statistics.median(times),
            "mem": (before, kept, torch.cuda.max_memory_allocated() - before)}


def _mb(n: int) -> str:
    return f"{n / 2**20:8.1f}"


def report(title: str, rows: list[dict]) -> None:
    base = rows[0]
    print(f"\n{title}")
    cpu = all("cpu_seconds" in r for r in rows)
    print(f"{'mode':9} {'ms/step':>9} {'x time':>7} " + (f"{'cpu ms':>8} {'x cpu':>6} " if cpu else "")
          + f"{'kept MB':>8} {'x kept':>7} {'step MB':>8} {'x step':>7} "
          f"{'total MB':>9} {'x total':>8}")
    for r in rows:
        line = f"{r['mode']:9} {r['seconds'] * 1e3:9.1f} {r['seconds'] / base['seconds']:7.2f}"
        if cpu:
            line += f" {r['cpu_seconds'] * 1e3:8.1f} {r['cpu_seconds'] / base['cpu_seconds']:6.2f}"
        if r["mem"] is not None and base["mem"] is not None:
            (b0, k0, p0), (b1, k1, p1) = base["mem"], r["mem"]
            line += (f" {_mb(k1)} {k1 / k0:7.2f} {_mb(p1)} {p1 / p0:7.2f} {_mb(b1 + p1):>9} "
                     f"{(b1 + p1) / (b0 + p0):8.2f}")
        print(line)
    print("cpu: the process's CPU time per step (all threads; steadier than wall time on a shared machine); "
          "kept: allocated after forward (activations, loss); step: the step's peak above the bytes before it "
          "(activations + gradients); total: step + parameters and batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=None, help="override the model's batch size")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (median reported)")
    args = parser.parse_args()
    sp = spec("residual_tower", args.scale)
    batch = args.batch or sp.batch
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((batch, sp.width)).astype(np.float32)
    yn = rng.standard_normal((batch, sp.out)).astype(np.float32)
    x, y = fg.tensor(xn, device=args.device), fg.tensor(yn, device=args.device)
    meter = Meter(args.device)
    print(f"residual_tower on {args.device}: batch {batch}, width {sp.width}, hidden {sp.hidden}, {BLOCKS} blocks; "
          f"median of {args.steps} steps")
    rows = [run_flowgraph(mode, args, sp, x, y, meter) for mode in ("plain", "tower", "blocks+tv", "blocks")]
    for r in rows[1:]:
        worst = max(float(np.abs(a - b).max()) for a, b in zip(r["grads"], rows[0]["grads"]))
        print(f"{r['mode']}: largest gradient difference from plain {worst:.2e}")
    report("flowgraph", rows)
    if args.device.startswith("cuda"):
        trows = [run_torch(mode, args, sp, xn, yn) for mode in ("plain", "blocks")]
        if trows[0] is not None:
            report("PyTorch (torch.utils.checkpoint per block)", trows)


if __name__ == "__main__":
    main()
