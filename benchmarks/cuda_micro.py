"""Micro-benchmarks of the CUDA backend: ``python -m benchmarks.cuda_micro`` (needs a GPU).

Prints, per measurement, microseconds per call (median of 5 repeats): host cost of one add, a chain of
ten elementwise ops fused and unfused, and one training step of a small MLP eager and as a CUDA graph.
The numbers in docs/cuda.md come from this script.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def _time(fn: Callable[[], object], sync: Callable[[], None], n: int) -> float:
    runs = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    """Run every measurement and print one line each."""
    import cupy

    import flowgraph as fg
    from flowgraph import nn, optim
    from flowgraph.backends import fusion, get_backend

    be = get_backend("cuda:0")
    sync = be.synchronize
    x = be.from_host(np.ones(64, np.float32))
    y = be.from_host(np.ones(64, np.float32))
    xc = cupy.ones(64, np.float32)

    def chain(a: object, b: object) -> object:
        t = be.mul(a, 0.5)
        t = be.add(t, be.tanh(be.mul(be.add(a, be.mul(be.mul(be.mul(a, a), a), 0.044715)), 0.79788456)))
        t = be.mul(t, b)
        return be.where(be.gt(t, 0.0), t, be.mul(t, 0.01))

    results: dict[str, float] = {}
    results["cupy add (64 floats)"] = _time(lambda: cupy.add(xc, xc), sync, 2000)
    results["backend add + realize (fused path, 1 op)"] = _time(lambda: be.contiguous(be.add(x, y)), sync, 2000)
    tx = fg.ones(64, device="cuda")
    results["tensor add, fusion on, realized"] = _time(lambda: be.contiguous((tx + tx)._data), sync, 2000)
    results["10-op chain fused (one kernel)"] = _time(lambda: be.contiguous(chain(x, y)), sync, 1000)
    fusion.set_enabled(False)
    try:
        results["backend add, fusion off (cupy ufunc)"] = _time(lambda: be.add(x, y), sync, 2000)
        results["10-op chain unfused (10 kernels)"] = _time(lambda: chain(x, y), sync, 1000)
    finally:
        fusion.set_enabled(True)
    big = be.from_host(np.ones(1 << 24, np.float32))
    results["10-op chain fused, 16M floats"] = _time(lambda: be.contiguous(chain(big, big)), sync, 20)
    fusion.set_enabled(False)
    try:
        results["10-op chain unfused, 16M floats"] = _time(lambda: chain(big, big), sync, 20)
    finally:
        fusion.set_enabled(True)

    # BatchNorm2d's per-channel sums: few outputs over long reductions (split into two stages).
    bn = nn.BatchNorm2d(64).to("cuda")
    xb = fg.randn(128, 64, 64, 64, device="cuda")
    results["BatchNorm2d(64) forward, 128x64x64x64, fused"] = _time(lambda: be.contiguous(bn(xb)._data), sync, 20)
    fusion.set_enabled(False)
    try:
        results["BatchNorm2d(64) forward, 128x64x64x64, unfused"] = _time(lambda: bn(xb), sync, 20)
    finally:
        fusion.set_enabled(True)
    results["sum over (0, 2, 3) of x * 2 (fused), 128x64x64x64"] = _time(
        lambda: be.sum(be.mul(xb._data, 2.0), (0, 2, 3), False), sync, 20)

    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10)).to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(inp: fg.Tensor, target: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = ((model(inp) - target) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    big_p = nn.Parameter(fg.randn(2048, 2048, device="cuda"))
    big_p.grad = fg.randn(2048, 2048, device="cuda")
    adam = optim.Adam([big_p], lr=1e-3)
    results["Adam step, one 2048x2048 parameter (fused kernel)"] = _time(adam.step, sync, 50)
    adam_step = type(be).adam_step
    del type(be).adam_step
    try:
        results["Adam step, one 2048x2048 parameter (tensor ops)"] = _time(adam.step, sync, 50)
    finally:
        type(be).adam_step = adam_step

    inp, target = fg.randn(128, 64, device="cuda"), fg.randn(128, 10, device="cuda")
    results["MLP step eager (3 Linear, GELU, SGD momentum)"] = _time(lambda: step(inp, target), sync, 50)
    graphed = fg.capture(step, inp, target)
    results["MLP step as CUDA graph (input copy + replay)"] = _time(lambda: graphed(inp, target), sync, 200)
    try:
        import torch

        if torch.cuda.is_available():
            tt = torch.ones(64, device="cuda")
            results["torch add (64 floats)"] = _time(lambda: tt + tt, torch.cuda.synchronize, 2000)
            tm = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                     torch.nn.GELU(), torch.nn.Linear(256, 10)).cuda()
            topt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
            ti, tt2 = torch.randn(128, 64, device="cuda"), torch.randn(128, 10, device="cuda")

            def tstep() -> None:
                topt.zero_grad()
                loss = ((tm(ti) - tt2) ** 2).mean()
                loss.backward()
                topt.step()

            results["torch MLP step eager"] = _time(tstep, torch.cuda.synchronize, 50)
            tbn = torch.nn.BatchNorm2d(64).cuda()
            txb = torch.randn(128, 64, 64, 64, device="cuda")
            results["torch BatchNorm2d(64) forward, 128x64x64x64"] = _time(lambda: tbn(txb), torch.cuda.synchronize,
                                                                           20)
    except ImportError:
        pass
    for name, us in results.items():
        print(f"{name:55s} {us:10.1f} us")


if __name__ == "__main__":
    main()
