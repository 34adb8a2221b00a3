"""Where a CUDA training step spends its time: host (cProfile) and device (CUPTI kernels), next to torch.

    python -m benchmarks.gpu_profile --models mlp,convnet

For each model, one eager flowgraph step is profiled with cProfile (host: which Python functions cost the
most), and eager and captured steps of flowgraph and of PyTorch run under ``torch.profiler`` with CUDA
activity: CUPTI records every kernel in the process, CuPy's as well as torch's, so the tables list the device
time per kernel name for both frameworks on the same GPU. Needs torch with CUDA (a profiling tool, not
part of flowgraph).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from .__main__ import FlowgraphRunner, TorchRunner


def _kernel_table(fn, steps: int, top: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "device_time_total", 0)]
    total = sum(e.device_time_total for e in events) / steps
    lines = [f"   device time per step {total / 1e3:.3f} ms over {sum(e.count for e in events) // steps} kernels"]
    for e in sorted(events, key=lambda e: -e.device_time_total)[:top]:
        lines.append(f"   {e.device_time_total / steps / 1e3:8.3f} ms {e.count // steps:5d}x  {e.key[:100]}")
    return "\n".join(lines)


def _kernel_breakdown(backend, step, top: int) -> str:
    """Device time of each distinct fused reduction and fused elementwise launch of one eager step.

    Every ``_fused_sum`` call and every ``_launch_fused`` whose output no input reads is repeated 5 times
    after the step's own call, between CUDA events (pure functions of their inputs, so the repeats change
    nothing); a kernel shorter than the host's launch cost shows that cost instead, an upper bound.
    """
    import collections

    import cupy

    stats: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])

    def timed(fn, describe, repeatable):
        def wrapper(*args, **kw):
            out = fn(*args, **kw)
            if not repeatable(*args, **kw):
                return out
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(5):
                fn(*args, **kw)
            end.record()
            end.synchronize()
            entry = stats[describe(*args)]
            entry[0] += cupy.cuda.get_elapsed_time(start, end) / 5
            entry[1] += 1
            return out
        return wrapper

    def describe_sum(a, axes, keepdims):
        from flowgraph.backends.fusion import split_reduction
        from flowgraph.backends.lazy import flatten

        key, leaves, _ = flatten(a)
        layout = [("C" if leaf.value.flags.c_contiguous else str(leaf.value.strides)) for leaf in leaves]
        return (f"sum {a.shape} axes={tuple(axes)} split={split_reduction(a.shape, tuple(axes))} "
                f"ops={len(key[0])} leaves={layout}")

    def describe_run(flat, root, out):
        key, leaves, _ = flat
        layout = [("C" if leaf.value.flags.c_contiguous else str(leaf.value.strides)) for leaf in leaves]
        return f"elementwise {out.shape} ops={len(key[0])} leaves={layout}"

    backend._fused_sum = timed(backend._fused_sum, describe_sum, lambda *a, **k: True)
    # only outputs no input reads (timing an in-place write 5 times would change what it reads)
    backend._launch_fused = timed(backend._launch_fused, describe_run, lambda flat, root, out: all(
        leaf.value.data.mem is not out.value.data.mem for leaf in flat[1]))
    try:
        step()
        backend.synchronize()
    finally:
        del backend._fused_sum, backend._launch_fused
    total = sum(v[0] for v in stats.values())
    lines = [f"   fused kernels of one step: {total:.3f} ms device"]
    for desc, (ms, count) in sorted(stats.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"   {ms:8.3f} ms {count:3d}x  {desc[:150]}")
    return "\n".join(lines)


def profile_model(name: str, steps: int, top: int) -> None:
    import torch

    print(f"==== {name}", flush=True)
    fg_eager = FlowgraphRunner(name, 1.0, "cuda", 1)
    tr = TorchRunner(name, 1.0, "cuda", 1)
    x, y = fg_eager.batches[0]
    for _ in range(3):
        fg_eager._step(x, y).item()
    fg_eager.backend.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fg_eager._step(x, y).item()
    fg_eager.backend.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(f"-- flowgraph eager host profile ({steps} steps)")
    print("\n".join(out.getvalue().splitlines()[:top + 12]))
    print("-- flowgraph fused kernels by shape (one eager step)")
    print(_kernel_breakdown(fg_eager.backend, lambda: fg_eager._step(x, y).item(), top))
    print("-- flowgraph eager kernels")
    print(_kernel_table(lambda: fg_eager._step(x, y).item(), steps, top))
    cap = FlowgraphRunner(name, 1.0, "cuda", 1, capture=True)
    xc, yc = cap.batches[0]
    for _ in range(2):
        cap.step_fn(xc, yc).item()
    print("-- flowgraph captured kernels")
    print(_kernel_table(lambda: cap.step_fn(xc, yc).item(), steps, top))
    tx, ty = tr.batches[0]
    for _ in range(3):
        tr._step(tx, ty)
    torch.cuda.synchronize()
    print("-- torch eager kernels")
    print(_kernel_table(lambda: tr._step(tx, ty), steps, top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()
    for name in args.models.split(","):
        profile_model(name.strip(), args.steps, args.top)


if __name__ == "__main__":
    main()
