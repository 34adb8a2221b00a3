"""Where a replayed ``fg.jit`` step's time goes on CUDA, next to torch's CUDA graph.

    python -m benchmarks.jit_replay --models gated_routing,mlp

For each model, with the benchmark protocol (``benchmarks.__main__``, full size, 50 batches):

* ``full``: ms per step of the benchmark's epoch (input copies, launch, output copy, ``loss.item()``);
* ``graph-only``: the recorded CUDA graph launched 50 times back to back, then one synchronize (the
  kernels alone);
* ``no-item``: the jitted steps without reading the loss (the host work overlaps the GPU);
* ``host/call``: host time of one jitted call with the GPU queue kept full;

then the same ``full`` and ``graph-only`` figures for torch's CUDA graph, and a cProfile of 200 jitted steps (top
25 by own time). ``full - graph-only`` is what each step waits for on the host. Needs CUDA and torch.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from .__main__ import FlowgraphRunner, TorchRunner


def _per_step(fn, steps: int, repeats: int = 3) -> float:
    """Best of ``repeats`` of ``fn()`` (which runs ``steps`` steps), in ms per step."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3 / steps


def measure(name: str, profile_top: int) -> None:
    """Print the figures of one model (see the module docstring)."""
    import cupy
    import torch

    steps = 50
    r = FlowgraphRunner(name, 1.0, "cuda", steps, capture=True)
    for _ in range(2):
        r.epoch()  # the eager call, the recording, then replays
    full = _per_step(r.epoch, steps)
    session = next(iter(r.step_fn._cache.values())).session
    stream = cupy.cuda.get_current_stream()

    def graph_only() -> None:
        for _ in range(steps):
            session.replay()
        stream.synchronize()

    def no_item() -> None:
        for x, y in r.batches:
            r.step_fn(x, y)
        stream.synchronize()

    graph = _per_step(graph_only, steps)
    loose = _per_step(no_item, steps)
    start = time.perf_counter()
    for _ in range(4):
        for x, y in r.batches:
            r.step_fn(x, y)
    host = (time.perf_counter() - start) * 1e6 / (4 * steps)
    stream.synchronize()
    t = TorchRunner(name, 1.0, "cuda", steps, capture=True)
    for _ in range(2):
        t.epoch()
    t_full = _per_step(t.epoch, steps)

    def t_graph_only() -> None:
        for _ in range(steps):
            t.graph.replay()
        torch.cuda.synchronize()

    t_graph = _per_step(t_graph_only, steps)
    print(f"{name}: fg full {full:.3f} ms/step, graph-only {graph:.3f}, no-item {loose:.3f}, host/call {host:.0f} us | "
          f"torch full {t_full:.3f}, graph-only {t_graph:.3f}", flush=True)
    if profile_top:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(4):
            r.epoch()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(profile_top)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gated_routing,mlp", help="comma-separated benchmark models")
    parser.add_argument("--profile-top", type=int, default=25, help="cProfile lines per model (0: none)")
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        measure(name, args.profile_top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
