"""Measure the OpenCL backend: kernel compile time, tiled matmul vs NumPy, fused vs unfused chains, the
implicit-GEMM convolution kernels.

Run ``python -m flowgraph.backends.opencl.bench [--device opencl:0] [--size 1024]``; it prints one line per
figure. The numbers in ``docs/opencl.md`` come from this script. Nothing here is imported by the backend.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from .. import fusion
from .backend import OpenCLBackend


def _best(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def compile_time(be: OpenCLBackend) -> float:
    """Seconds per freshly compiled elementwise kernel (ops with a nonce scalar count, so never cached)."""
    x = be.from_host(np.ones(16, np.float32))
    before = be.compile_stats()
    nonce = int(time.time() * 1000) % 997 + 2
    for i in range(4):
        y = x
        for _ in range(nonce + i):  # a chain length no earlier run used: a new source text
            y = be.add(y, 1.0)
            if y.lazy is not None and y.lazy.nodes >= fusion.MAX_NODES:
                break
        be.to_host(be.sqrt(be.mul(y, float(i))))
    after = be.compile_stats()
    built = after["compiled"] - before["compiled"]
    return (after["compile_seconds"] - before["compile_seconds"]) / max(built, 1)


def matmul_gflops(be: OpenCLBackend, n: int, repeat: int) -> tuple[float, float]:
    """GFLOP/s of the backend's matmul and of NumPy's at ``n``^3 float32."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    da, db = be.from_host(a), be.from_host(b)
    np.testing.assert_allclose(be.to_host(be.matmul(da, db)), a @ b, rtol=1e-3)

    def run() -> None:
        be.matmul(da, db)
        be.synchronize()

    flops = 2.0 * n**3
    return flops / _best(run, repeat) / 1e9, flops / _best(lambda: a @ b, repeat) / 1e9


def chain_times(be: OpenCLBackend, n: int, repeat: int) -> tuple[float, float, float]:
    """Milliseconds of a 10-op GELU-style chain on ``n`` floats: fused, unfused, NumPy."""
    host = np.random.default_rng(1).random(n, dtype=np.float32)
    x = be.from_host(host)

    def chain(be_: OpenCLBackend) -> object:
        inner = be_.mul(be_.add(x, be_.mul(be_.mul(be_.mul(x, x), x), 0.044715)), 0.7978845608)
        return be_.mul(be_.mul(x, 0.5), be_.add(be_.tanh(inner), 1.0))

    def run() -> None:
        be.realize(chain(be))
        be.synchronize()

    run()
    fused = _best(run, repeat)
    fusion.set_enabled(False)
    try:
        run()
        unfused = _best(run, repeat)
    finally:
        fusion.set_enabled(True)
    numpy = _best(lambda: host * 0.5 * (np.tanh((host + host * host * host * 0.044715) * 0.7978845608) + 1), repeat)
    return fused * 1e3, unfused * 1e3, numpy * 1e3


def conv_gflops(be: OpenCLBackend, batch: int, channels: int, side: int, repeat: int) -> dict[str, float]:
    """GFLOP/s of the three native convolution kernels on a 3x3, padding-1 float32 layer of ``channels`` in and
    out over ``batch`` images of ``side`` x ``side`` (the convnet benchmark's middle layers)."""
    rng = np.random.default_rng(2)
    x = be.from_host(rng.standard_normal((batch, channels, side, side), dtype=np.float32))
    w = be.from_host(rng.standard_normal((channels, channels, 3, 3), dtype=np.float32))
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    ops = {
        "forward": lambda: be.conv_forward(x, w, *geometry),
        "input_grad": lambda: be.conv_input_grad(x, w, tuple(x.shape), *geometry),
        "weight_grad": lambda: be.conv_weight_grad(x, x, tuple(w.shape), *geometry),
    }
    flops = 2.0 * batch * side * side * channels * channels * 9
    out = {}
    for name, op in ops.items():
        def run(op=op) -> None:
            be.realize(op())
            be.synchronize()

        run()
        out[name] = flops / _best(run, repeat) / 1e9
    return out


def main() -> None:
    """Print the measurements for one device."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--size", type=int, default=1024, help="matmul edge")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--conv", type=int, nargs=3, default=(8, 64, 32), metavar=("BATCH", "CHANNELS", "SIDE"),
                        help="convolution layer measured (3x3, padding 1)")
    args = parser.parse_args()
    be = OpenCLBackend(args.device)
    print(f"device: {be.device} {be.device_name} fp64={be.supports_float64} fp16={be.supports_float16}")
    print(f"compile: {compile_time(be) * 1e3:.0f} ms per new elementwise kernel")
    mine, numpy = matmul_gflops(be, args.size, args.repeat)
    print(f"matmul {args.size}^3 float32: tiled kernel {mine:.1f} GFLOP/s, NumPy {numpy:.1f} GFLOP/s")
    for n in (1 << 10, 1 << 20):
        fused, unfused, ref = chain_times(be, n, args.repeat * 3)
        print(f"GELU chain n={n}: fused {fused:.3f} ms, unfused {unfused:.3f} ms, NumPy {ref:.3f} ms")
    if be.native_conv(np.dtype(np.float32), 2):
        batch, channels, side = args.conv
        rates = conv_gflops(be, batch, channels, side, args.repeat)
        print(f"conv 3x3 {channels}->{channels} ch, {batch}x{side}x{side} float32: "
              + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items()) + " GFLOP/s")


if __name__ == "__main__":
    main()
