"""CPU time per training step, flowgraph against torch, and the bytes each keeps for backward.

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.cpu_steps --models convnet,mnist_net,dcgan_g,dcgan_d [--jit]

On a shared, loaded machine wall-clock epochs move by 2-4x between runs (``python -m benchmarks`` reports the
spread); the process's CPU time with one BLAS thread (torch with one thread) moves by a few percent, so it is
what decides whether a change helped. It counts work, not parallel speed-up: torch's elementwise kernels use
both cores of a 2-thread run, NumPy's do not, so the wall-clock ratio at 2 threads on a quiet machine is higher.

"Saved for backward" is the distinct storage held by the graph after one forward: flowgraph's nodes' saved
tensors, torch's through ``saved_tensors_hooks`` (parameters included on both sides).

``--jit`` also times the same flowgraph step wrapped in ``fg.jit`` (on cpu: the step's backend calls recorded on
its second call and replayed from then on, without Tensor, autograd or module code) and its ratio to torch's
eager step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from .models import build_flowgraph, build_torch, spec


def _flowgraph_step(name: str, scale: float, jit: bool = False):
    import flowgraph as fg
    from flowgraph import nn, optim

    fg.manual_seed(0)
    model = build_flowgraph(name, scale)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    sp = spec(name, scale)
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32))
    y = fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32))
    loss_fn = nn.MSELoss()

    def train(x, y):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = fg.jit(train) if jit else train

    def step():
        run(x, y).item()  # the host read after the (jitted) step, as a training loop's logging does

    return step


def _torch_step(name: str, scale: float):
    import torch

    torch.manual_seed(0)
    model = build_torch(name, scale)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sp = spec(name, scale)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32))
    y = torch.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32))
    loss_fn = torch.nn.MSELoss()

    def step():
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    return step


def cpu_ms(step, repeats: int) -> float:
    """Median process CPU time of ``step`` in ms, after two warm-up calls."""
    step()
    step()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def saved_bytes(name: str, scale: float) -> tuple[int, int]:
    """Distinct bytes saved for backward after one forward: (flowgraph, torch)."""
    import torch

    import flowgraph as fg

    x = np.random.default_rng(0).standard_normal(spec(name, scale).input_shape, dtype=np.float32)
    out = build_flowgraph(name, scale)(fg.tensor(x))
    seen, stack, fg_bufs = set(), [out.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for t in getattr(node, "saved", ()) or ():
            a = None if t is None else t._data
            while getattr(a, "base", None) is not None:
                a = a.base
            if isinstance(a, np.ndarray):
                fg_bufs[id(a)] = a.nbytes
        stack += [e for e in getattr(node, "edges", ()) if e is not None and hasattr(e, "edges")]
    torch_bufs: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        torch_bufs[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        build_torch(name, scale)(torch.tensor(x))
    return sum(fg_bufs.values()), sum(torch_bufs.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="convnet,mnist_net,dcgan_g,dcgan_d")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--jit", action="store_true", help="also time the flowgraph step wrapped in fg.jit")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    jit_head = f"{'fg jit ms':>11}{'jit ratio':>11}" if args.jit else ""
    print(f"{'model':<12}{'fg cpu ms':>11}{'torch cpu ms':>14}{'ratio':>7}{jit_head}{'fg saved MiB':>14}"
          f"{'torch saved MiB':>17}")
    for name in args.models.split(","):
        name = name.strip()
        f = cpu_ms(_flowgraph_step(name, args.scale), args.repeats)
        t = cpu_ms(_torch_step(name, args.scale), args.repeats)
        jit_cols = ""
        if args.jit:
            j = cpu_ms(_flowgraph_step(name, args.scale, jit=True), args.repeats)
            jit_cols = f"{j:>11.1f}{j / t:>11.2f}"
        fs, ts = saved_bytes(name, args.scale)
        print(f"{name:<12}{f:>11.1f}{t:>14.1f}{f / t:>7.2f}{jit_cols}{fs / 2**20:>14.1f}{ts / 2**20:>17.1f}",
              flush=True)


if __name__ == "__main__":
    main()
