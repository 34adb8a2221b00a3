"""Scaled dot-product attention, forward + backward, flowgraph against torch in the same run.

    python -m benchmarks.attention --device cuda --shape 8,16,2048,64 --dtype float16 --causal

Times ``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` followed by ``backward``: ``--rounds`` rounds
alternating the two frameworks, each round ``--repeats`` steps back to back and one device synchronisation
(the median of the rounds, and their spread), after warm-up; and the peak device memory of one step above what
the inputs hold. Rounds alternate because one process's GPU clocks and host drift over a run: a single
batch of steps per framework read 1.18-1.35 on an H200 where seven alternating rounds read 1.01. On CUDA
flowgraph runs cuDNN's fused attention (``fg.backends.cudnn.enabled``; ``--no-cudnn`` times the composed
matmul/softmax path), elsewhere the backend's own fused attention where it has one; torch picks its own kernel
(flash on an H100). Prints the ratio fg / torch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _fg(shape, dtype, causal, device, repeats):
    import flowgraph as fg
    from flowgraph.nn import functional as F

    rng = np.random.default_rng(0)
    dt = getattr(fg, dtype)
    qkv = [fg.tensor(rng.standard_normal(shape).astype(np.float32), device=device).to(dt).requires_grad_(True)
           for _ in range(3)]
    g = fg.tensor(rng.standard_normal(shape).astype(np.float32), device=device).to(getattr(fg, dtype))
    bk = qkv[0]._backend

    def step():
        for t in qkv:
            t.grad = None
        y = F.scaled_dot_product_attention(*qkv, is_causal=causal)
        y.backward(g)

    return step, bk.synchronize, bk


def _torch(shape, dtype, causal, device, repeats):
    import torch

    dev = "cuda" if device.startswith("cuda") else "cpu"
    rng = np.random.default_rng(0)
    qkv = [torch.tensor(rng.standard_normal(shape).astype(np.float32), device=dev).to(getattr(torch, dtype))
           .requires_grad_(True) for _ in range(3)]
    g = torch.tensor(rng.standard_normal(shape).astype(np.float32), device=dev).to(getattr(torch, dtype))

    def step():
        for t in qkv:
            t.grad = None
        y = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal)
        y.backward(g)

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    return step, sync


def _round(step, sync, repeats):
    """ms per step over ``repeats`` steps run back to back."""
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e3 / repeats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="8,16,2048,64", help="B,H,L,D")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, alternating flowgraph and torch")
    parser.add_argument("--no-cudnn", action="store_true", help="flowgraph without cuDNN (the composed path)")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split(","))
    import flowgraph as fg

    fg.backends.cudnn.enabled = not args.no_cudnn
    step, sync, bk = _fg(shape, args.dtype, args.causal, args.device, args.repeats)
    fg_peak = None
    if hasattr(bk, "reset_peak_memory_stats"):
        step()
        sync()
        base = bk.memory_stats().get("allocated", 0)
        bk.reset_peak_memory_stats()
        step()
        sync()
        fg_peak = bk.memory_stats().get("peak", 0) - base
    tstep, tsync = _torch(shape, args.dtype, args.causal, args.device, args.repeats)
    t_peak = None
    if args.device.startswith("cuda"):
        import torch

        tstep()
        tsync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        tstep()
        tsync()
        t_peak = torch.cuda.max_memory_allocated() - base
    for f, sy in ((step, sync), (tstep, tsync)):  # warm-up
        for _ in range(3):
            f()
        sy()
    fg_rounds, t_rounds = [], []
    for _ in range(args.rounds):
        fg_rounds.append(_round(step, sync, args.repeats))
        t_rounds.append(_round(tstep, tsync, args.repeats))
    fg_ms, t_ms = statistics.median(fg_rounds), statistics.median(t_rounds)
    fused = "cuDNN" if args.device.startswith("cuda") else "fused"
    path = "composed" if args.no_cudnn else (fused if bk.native_sdpa(np.dtype(args.dtype), shape[-1]) else
                                             "composed")
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
    print(f"sdpa fwd+bwd {shape} {args.dtype} causal={args.causal} on {args.device} (flowgraph: {path})")
    print(f"  flowgraph {fg_ms:8.3f} ms  ({min(fg_rounds):.3f}-{max(fg_rounds):.3f})  peak {mib(fg_peak)}")
    print(f"  torch     {t_ms:8.3f} ms  ({min(t_rounds):.3f}-{max(t_rounds):.3f})  peak {mib(t_peak)}")
    print(f"  ratio fg/torch {fg_ms / t_ms:.2f} (median of {args.rounds} alternating rounds of {args.repeats} steps; "
          f"per-round ratios {min(f / t for f, t in zip(fg_rounds, t_rounds)):.2f}-"
          f"{max(f / t for f, t in zip(fg_rounds, t_rounds)):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
