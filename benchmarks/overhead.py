"""Host overhead per op: a chain of tiny ops, forward + backward, flowgraph vs raw NumPy vs torch.

A chain of ``--ops`` elementwise ops on ``--size``-element float32 tensors, alternating add/mul/sub/mul with a
parameter that requires grad, then ``sum().backward()``. Raw NumPy runs the same chain forward only, without
autograd: the floor no framework can beat. torch runs forward + backward on the same kind of device (CUDA for
``--device cuda``, the CPU otherwise, with ``torch.set_num_threads`` set to the same thread count; on CUDA
torch's CPU figure is printed too, for reference). Prints microseconds per op (median of ``--repeats``) and the
flowgraph/torch ratio.

    python benchmarks/overhead.py                # cpu (eager and fg.jit columns)
    python benchmarks/overhead.py --device opencl:0 --ops 1000 --repeats 7
    python benchmarks/overhead.py --profile      # cProfile of the flowgraph chain, top 25 by own time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout


def _chain(h, w, n_ops: int):
    """The chain itself, for any array type with + - * (NumPy, flowgraph, torch): add/mul/sub/mul by 0.5."""
    for i in range(n_ops):
        k = i % 4
        if k == 0:
            h = h + w
        elif k == 1:
            h = h * w
        elif k == 2:
            h = h - w
        else:
            h = h * 0.5
    return h


def _chain_numpy(n_ops: int, size: int):
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    w = np.full(size, 0.999, dtype=np.float32)

    def run() -> None:
        float(_chain(x, w, n_ops).sum())

    return run


def _chain_flowgraph(n_ops: int, size: int, device: str):
    import flowgraph as fg

    x = fg.tensor(np.random.default_rng(0).standard_normal(size).astype(np.float32), device=device)
    w = fg.full((size,), 0.999, dtype=fg.float32, device=device, requires_grad=True)

    def run() -> None:
        w.grad = None
        _chain(x, w, n_ops).sum().backward()
        w.grad.sum().item()

    return run


def _chain_flowgraph_jit(n_ops: int, size: int, device: str):
    """The same chain as a ``fg.jit`` step: after two calls (eager, recorded) it replays recorded backend calls."""
    import flowgraph as fg

    x = fg.tensor(np.random.default_rng(0).standard_normal(size).astype(np.float32), device=device)
    w = fg.full((size,), 0.999, dtype=fg.float32, device=device, requires_grad=True)

    @fg.jit
    def step(x):
        w.grad = None
        _chain(x, w, n_ops).sum().backward()
        return w.grad.sum()

    step(x)  # eager
    step(x)  # recorded

    def run() -> None:
        step(x).item()

    return run


def _torch_device(device: str) -> str:
    """The device torch runs the chain on: CUDA for a flowgraph CUDA device (the goal compares the two
    frameworks on one GPU), the CPU otherwise (torch has no OpenCL)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("overhead.py: --device cuda compares against torch on CUDA, and this torch has no "
                             "CUDA; pass --torch-device cpu for the CPU figure")
        return "cuda"
    return "cpu"


def _chain_torch(n_ops: int, size: int, threads: int, device: str = "cpu"):
    import torch

    torch.set_num_threads(threads)
    x = torch.tensor(np.random.default_rng(0).standard_normal(size).astype(np.float32), device=device)
    w = torch.full((size,), 0.999, dtype=torch.float32, device=device, requires_grad=True)

    def run() -> None:
        w.grad = None
        _chain(x, w, n_ops).sum().backward()
        w.grad.sum().item()

    return run


_CLOCK = [time.perf_counter]


def _interleaved_us_per_op(runs: dict, n_ops: int, repeats: int) -> tuple[dict, list]:
    """Time each run once per round, rounds interleaved so load changes hit all runs alike.

    Returns the median microseconds per op of each run and the per-round flowgraph/torch ratios.
    """
    clock = _CLOCK[0]
    for run in runs.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = clock()
            run()
            times[name].append((clock() - t0) / n_ops * 1e6)
    ratios = [f / t for f, t in zip(times["flowgraph"], times["torch"])] if "torch" in times else []
    best = {name + "_best": min(v) for name, v in times.items()}
    return {**{name: statistics.median(v) for name, v in times.items()}, **best}, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="flowgraph device (cpu, opencl:0, cuda:0)")
    parser.add_argument("--ops", type=int, default=1000, help="ops in the chain")
    parser.add_argument("--size", type=int, default=64, help="elements per tensor")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: CPU count)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    parser.add_argument("--torch-device", default=None,
                        help="where torch runs the chain (default: cuda for --device cuda, else cpu); with "
                             "--device cuda the CPU figure is also printed, for reference")
    parser.add_argument("--profile", action="store_true", help="cProfile the flowgraph chain instead")
    parser.add_argument("--clock", choices=["wall", "process"], default="wall",
                        help="wall time, or this process's CPU time (steadier on a busy machine)")
    args = parser.parse_args()
    if args.clock == "process":
        _CLOCK[0] = time.process_time

    threads = args.threads or os.cpu_count() or 1
    fg_run = _chain_flowgraph(args.ops, args.size, args.device)
    if args.profile:
        import cProfile
        import pstats

        fg_run()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeats):
            fg_run()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return

    runs = {"numpy": _chain_numpy(args.ops, args.size), "flowgraph": fg_run,
            "flowgraph_jit": _chain_flowgraph_jit(args.ops, args.size, args.device)}
    torch_device = args.torch_device or _torch_device(args.device)
    if not args.no_torch:
        runs["torch"] = _chain_torch(args.ops, args.size, threads, torch_device)
        if torch_device != "cpu":
            runs["torch_cpu"] = _chain_torch(args.ops, args.size, threads, "cpu")
    med, ratios = _interleaved_us_per_op(runs, args.ops, args.repeats)
    print(f"chain of {args.ops} ops on {args.size} float32 elements, median of {args.repeats} interleaved rounds, "
          f"{threads} torch threads, {args.clock} clock")
    print(f"  numpy forward only (floor) : {med['numpy']:7.2f} us/op")
    print(f"  flowgraph {args.device:<8} fwd+bwd : {med['flowgraph']:7.2f} us/op")
    print(f"  flowgraph {args.device:<8} fg.jit  : {med['flowgraph_jit']:7.2f} us/op")
    if ratios:
        if "torch_cpu" in med:
            print(f"  torch cpu fwd+bwd (reference): {med['torch_cpu']:7.2f} us/op")
        print(f"  torch {torch_device:<4} fwd+bwd         : {med['torch']:7.2f} us/op")
        print(f"  ratio fg.jit/torch         : {med['flowgraph_jit'] / med['torch']:7.2f}  (goal <= 0.6)")
        print(f"  ratio flowgraph/torch      : {statistics.median(ratios):7.2f}  (median of per-round ratios; "
              f"goal <= 1.0)")
        print(f"  ratio of best rounds       : {med['flowgraph_best'] / med['torch_best']:7.2f}  "
              f"({med['flowgraph_best']:.2f} vs {med['torch_best']:.2f} us/op; steadier on a busy machine)")


if __name__ == "__main__":
    main()
