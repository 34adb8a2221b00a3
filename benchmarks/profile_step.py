"""Where one training step of a benchmark model spends its time, node by node.

    python -m benchmarks.profile_step --device cuda --models convnet,mlp

For each model: the graph's own per-node profile of the forward (``Graph.enable_profiling``, which
synchronises the device around every node so the times are the device's), then the backward and the
optimizer step timed as wholes, and the number of backend calls per step where the backend counts them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from .models import flowgraph_training


def profile(name: str, device: str, scale: float, repeats: int, cprofile: int = 0) -> None:
    import flowgraph as fg

    model, opt, x, y, loss_fn = flowgraph_training(name, scale, device)
    bk = fg.get_backend(device)
    for _ in range(2):  # warm-up: kernels compile, optimizer state appears
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    bk.synchronize()
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        bk.synchronize()
        t1 = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        bk.synchronize()
        t2 = time.perf_counter()
        opt.step()
        bk.synchronize()
        t3 = time.perf_counter()
        phases["forward"].append(t1 - t0)
        phases["backward"].append(t2 - t1)
        phases["optimizer"].append(t3 - t2)
    print(f"== {name} on {device} (scale {scale}): median ms per step phase")
    for phase, vals in phases.items():
        print(f"   {phase:<10}{statistics.median(vals) * 1e3:10.2f}")
    if cprofile:
        _host_profile(lambda: (opt.zero_grad(), loss_fn(model(x), y).backward(), opt.step()), bk, cprofile)
    model.enable_profiling()
    with fg.no_grad():
        model(x)
        model(x)
    prof = model.profile()
    total = sum(prof.values()) or 1.0
    print("   forward by node (synchronised), top 8:")
    for node, secs in sorted(prof.items(), key=lambda kv: -kv[1])[:8]:
        print(f"     {node:<28}{secs * 1e3:9.2f} ms  {100 * secs / total:5.1f}%")


def _host_profile(step, backend, steps: int, top: int = 30) -> None:
    """The host's time per eager step by function (cProfile over ``steps`` steps): where the Python goes."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    backend.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt / steps * 1e3
    print(f"   host profile over {steps} eager steps: {total:.2f} ms of Python per step; top {top} by own time:")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, func), (_, calls, own, cum, _) in rows:
        where = f"{file.rsplit('/', 2)[-2:][-1]}:{line}({func})"
        print(f"     {own / steps * 1e3:8.3f} ms own {cum / steps * 1e3:8.3f} ms cum {calls // steps:6d}x  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cprofile", type=int, default=0, metavar="STEPS",
                        help="also profile the host over this many eager steps (cProfile, by function)")
    args = parser.parse_args()
    scale = args.scale if args.scale is not None else (0.25 if args.device == "cpu" else 1.0)
    for name in args.models.split(","):
        profile(name.strip(), args.device, scale, args.repeats, args.cprofile)


if __name__ == "__main__":
    main()
