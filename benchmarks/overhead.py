"""Host overhead per op: a chain of tiny ops, forward + backward, flowgraph vs raw NumPy vs torch CPU.

A chain of ``--ops`` elementwise ops on ``--size``-element float32 tensors, alternating add/mul/sub/mul with a
parameter that requires grad, then ``sum().backward()``. Raw NumPy runs the same chain forward only, without
autograd: the floor no framework can beat. torch runs forward + backward with ``torch.set_num_threads`` set to
the same thread count. Prints microseconds per op (median of ``--repeats``) and the flowgraph/torch ratio.

    python benchmarks/overhead.py                # cpu
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


def _chain_numpy(n_ops: int, size: int):
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    w = np.full(size, 0.999, dtype=np.float32)

    def run() -> None:
        h = x
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
        float(h.sum())

    return run


def _chain_flowgraph(n_ops: int, size: int, device: str):
    import flowgraph as fg

    x = fg.tensor(np.random.default_rng(0).standard_normal(size).astype(np.float32), device=device)
    w = fg.full((size,), 0.999, dtype=fg.float32, device=device, requires_grad=True)

    def run() -> None:
        w.grad = None
        h = x
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
        h.sum().backward()
        w.grad.sum().item()

    return run


def _chain_torch(n_ops: int, size: int, threads: int):
    import torch

    torch.set_num_threads(threads)
    x = torch.tensor(np.random.default_rng(0).standard_normal(size).astype(np.float32))
    w = torch.full((size,), 0.999, dtype=torch.float32, requires_grad=True)

    def run() -> None:
        w.grad = None
        h = x
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
        h.sum().backward()
        w.grad.sum().item()

    return run


def _median_us_per_op(run, n_ops: int, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / n_ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="flowgraph device (cpu, opencl:0, cuda:0)")
    parser.add_argument("--ops", type=int, default=1000, help="ops in the chain")
    parser.add_argument("--size", type=int, default=64, help="elements per tensor")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: CPU count)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    parser.add_argument("--profile", action="store_true", help="cProfile the flowgraph chain instead")
    args = parser.parse_args()

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

    np_us = _median_us_per_op(_chain_numpy(args.ops, args.size), args.ops, args.repeats)
    fg_us = _median_us_per_op(fg_run, args.ops, args.repeats)
    print(f"chain of {args.ops} ops on {args.size} float32 elements, median of {args.repeats}, {threads} threads")
    print(f"  numpy forward only (floor) : {np_us:7.2f} us/op")
    print(f"  flowgraph {args.device:<8} fwd+bwd : {fg_us:7.2f} us/op")
    if not args.no_torch:
        torch_us = _median_us_per_op(_chain_torch(args.ops, args.size, threads), args.ops, args.repeats)
        print(f"  torch cpu fwd+bwd          : {torch_us:7.2f} us/op")
        print(f"  ratio flowgraph/torch      : {fg_us / torch_us:7.2f}  (goal <= 1.0)")


if __name__ == "__main__":
    main()
