"""Scaled dot-product attention, forward + backward, flowgraph against torch in the same run.

    python -m benchmarks.attention --device cuda --shape 8,16,2048,64 --dtype float16 --causal

Times ``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` followed by ``backward`` (median of
``--repeats`` after warm-up, device synchronised), and the peak device memory of one step above what the inputs
hold. On CUDA flowgraph runs cuDNN's fused attention (``fg.backends.cudnn.enabled``; ``--no-cudnn`` times the
composed matmul/softmax path); torch picks its own kernel (flash on an H100). Prints the ratio fg / torch.
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


def _time(step, sync, repeats):
    step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="8,16,2048,64", help="B,H,L,D")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
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
    fg_ms = _time(step, sync, args.repeats)
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
    t_ms = _time(tstep, tsync, args.repeats)
    path = "composed" if args.no_cudnn else ("cuDNN" if bk.native_sdpa(np.dtype(args.dtype), shape[-1]) else
                                             "composed")
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
    print(f"sdpa fwd+bwd {shape} {args.dtype} causal={args.causal} on {args.device} (flowgraph: {path})")
    print(f"  flowgraph {fg_ms:8.3f} ms  peak {mib(fg_peak)}")
    print(f"  torch     {t_ms:8.3f} ms  peak {mib(t_peak)}")
    print(f"  ratio fg/torch {fg_ms / t_ms:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
