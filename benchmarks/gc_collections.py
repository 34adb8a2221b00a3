"""How often Python's cyclic garbage collector runs during eager training steps, and how long it takes.

    python -m benchmarks.gc_collections --device cuda --models all --steps 200

An eager step builds Python objects (tensors, graph nodes, pending expressions); those still alive at a
young collection are promoted, and once enough have reached the oldest generation Python walks every tracked
object of the process (80-110 ms with torch and CuPy imported, docs/cuda.md). For each model this prints the
collections per generation over ``--steps`` eager steps, counted with ``gc.callbacks``, and the time spent
in them per step. torch is imported first when installed, as in ``python -m benchmarks``, so the process has
the same long-lived heap.
"""

from __future__ import annotations

import argparse
import gc
import time

from .models import MODELS, flowgraph_training


def measure(name: str, device: str, scale: float, steps: int) -> tuple[list[int], float, float]:
    """``(collections per generation, ms a step in the collector, ms a step)`` over ``steps`` eager steps."""
    model, opt, x, y, loss_fn = flowgraph_training(name, scale, device)

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()

    for _ in range(5):
        step()
    counts, spent, started = [0, 0, 0], [0.0], [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counts[info["generation"]] += 1
            spent[0] += time.perf_counter() - started[0]

    gc.collect()
    gc.callbacks.append(callback)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - t0
    finally:
        gc.callbacks.remove(callback)
    return counts, spent[0] / steps * 1e3, elapsed / steps * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="all", help="comma-separated, or all")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--scale", type=float, default=None, help="default 1.0 on GPUs, 0.25 elsewhere")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401  (the benchmark's long-lived heap)
    except ImportError:
        pass
    scale = args.scale if args.scale is not None else (1.0 if args.device.startswith("cuda") else 0.25)
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    print(f"{'model':18} {'young':>6} {'middle':>6} {'full':>5} {'gc ms/step':>11} {'ms/step':>8}")
    for name in names:
        counts, in_gc, per_step = measure(name, args.device, scale, args.steps)
        print(f"{name:18} {counts[0]:6d} {counts[1]:6d} {counts[2]:5d} {in_gc:11.3f} {per_step:8.2f}", flush=True)


if __name__ == "__main__":
    main()
