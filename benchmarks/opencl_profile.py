"""Where an OpenCL training step spends its device time: every kernel timed through OpenCL event profiling.

    python -m benchmarks.opencl_profile --models convnet
    python -m benchmarks.opencl_profile --models convnet --tiles   # also sweep the convolution tile tables
    python -m benchmarks.opencl_profile --models convnet --launches 30   # and list one step's slowest launches

The backend's command queue is created with ``PROFILING_ENABLE`` (this tool wraps ``pyopencl.CommandQueue``
before flowgraph creates its queue), every kernel launch's event is kept, and after the timed steps the
kernel times are summed per kernel name. OpenCL has no CUPTI: this is the OpenCL counterpart of
``benchmarks.gpu_profile``'s kernel tables. A profiling tool, not part of flowgraph.
"""

from __future__ import annotations

import argparse
import collections
import time

_EVENTS: list = []


def _instrument() -> None:
    """Make every command queue a profiling one and record every kernel launch's event."""
    import pyopencl as cl

    make_queue = cl.CommandQueue
    if getattr(make_queue, "_fg_profiling", False):
        return

    def profiling_queue(ctx, device=None, properties=None):
        return make_queue(ctx, device, properties=cl.command_queue_properties.PROFILING_ENABLE)

    profiling_queue._fg_profiling = True  # type: ignore[attr-defined]
    cl.CommandQueue = profiling_queue
    launch = cl.Kernel.__call__

    def recorded(self, queue, global_size, *args, **kwargs):
        event = launch(self, queue, global_size, *args, **kwargs)
        _EVENTS.append((self.function_name, event, tuple(global_size)))
        return event

    cl.Kernel.__call__ = recorded


def _step_fn(name: str, scale: float):
    import flowgraph as fg
    from flowgraph import nn

    from .models import build_flowgraph, spec

    sp = spec(name, scale)
    model = build_flowgraph(name, scale).to("opencl")
    opt = fg.optim.Adam(model.parameters(), lr=1e-3)
    x, y = fg.randn(*sp.input_shape, device="opencl"), fg.randn(*sp.target_shape, device="opencl")

    def step() -> float:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def kernel_times(step, steps: int) -> tuple[float, dict[str, float], collections.Counter]:
    """``(wall ms per step, kernel ms per step by name, launches per step by name)`` over ``steps`` steps."""
    _EVENTS.clear()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - start) / steps * 1e3
    times: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    for name, event, _ in _EVENTS:
        event.wait()
        times[name] += (event.profile.end - event.profile.start) * 1e-6 / steps
        counts[name] += 1
    return wall, times, counts


def _tile_sweep(step, steps: int) -> None:
    """Each candidate configuration for the large convolution problems (``conv.GPU_TILES`` huge/tall, for every
    op: ``conv.GPU_TF32_TILES``' per-op entries apply to ``current`` only)."""
    import flowgraph as fg
    from flowgraph.backends.opencl import conv as CK

    T = CK.ConvTiles
    base, tf32_base = dict(CK.GPU_TILES), dict(CK.GPU_TF32_TILES)
    candidates = {"current": (base["huge"], base["tall"]),
                  "depth 32": (T(16, 16, 8, 8, 32), T(16, 16, 4, 4, 32)),
                  "64x128": (T(32, 8, 4, 8, 16),) * 2, "128x64": (T(16, 16, 4, 8, 16),) * 2,
                  "64x256": (T(32, 8, 8, 8, 16),) * 2, "all 64x64": (base["tall"], base["tall"]),
                  "128x128, 128 items": (T(16, 8, 8, 16, 16), base["tall"]),
                  "64x64, 128 items": (base["huge"], T(16, 8, 4, 8, 16))}
    backend = fg.get_backend("opencl")
    try:
        for label, (huge, tall) in candidates.items():
            CK.GPU_TILES["huge"], CK.GPU_TILES["tall"] = huge, tall
            CK.GPU_TF32_TILES.clear()  # the candidate is every op's, TF32 kernels' included
            CK.GPU_TF32_TILES.update(tf32_base if label == "current" else {})
            CK.choose_tiles.cache_clear()
            backend.__dict__.pop("_conv_choice", None)
            step()
            _, times, _ = kernel_times(step, steps)
            conv = {k: v for k, v in times.items() if k.startswith("fg_conv")}
            print(f"  {label:18s} kernels {sum(times.values()):7.2f} ms  convolutions {sum(conv.values()):6.2f} ms  "
                  + "  ".join(f"{k[8:]} {v:.2f}" for k, v in sorted(conv.items())))
    finally:
        CK.GPU_TILES.update(base)
        CK.GPU_TF32_TILES.update(tf32_base)
        CK.choose_tiles.cache_clear()
        backend.__dict__.pop("_conv_choice", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnet")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--tiles", action="store_true", help="also sweep the convolution tile configurations")
    parser.add_argument("--launches", type=int, default=0, help="also list this many slowest launches of one step")
    args = parser.parse_args()
    _instrument()
    for name in args.models.split(","):
        step = _step_fn(name, args.scale)
        for _ in range(2):
            step()
        wall, times, counts = kernel_times(step, args.steps)
        print(f"==== {name}: wall {wall:.2f} ms per step, kernels {sum(times.values()):.2f} ms over "
              f"{sum(counts.values()) // args.steps} launches")
        for kname, ms in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {ms:8.3f} ms {counts[kname] // args.steps:5d}x  {kname}")
        if args.launches:
            step_events = _EVENTS[-len(_EVENTS) // args.steps:]
            slowest = sorted(step_events, key=lambda e: e[1].profile.start - e[1].profile.end)[: args.launches]
            for kname, event, size in slowest:
                print(f"  {(event.profile.end - event.profile.start) * 1e-6:8.3f} ms  {kname}  global {size}")
        if args.tiles:
            _tile_sweep(step, args.steps)


if __name__ == "__main__":
    main()
