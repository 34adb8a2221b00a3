"""Optimizer-state memory per rank with and without ``ZeroRedundancyOptimizer`` (ZeRO stage 1).

    python -m flowgraph.distributed.run --nproc-per-node 1 -m benchmarks.zero_memory [--model mlp] [--device cpu]
    python -m flowgraph.distributed.run --nproc-per-node 2 -m benchmarks.zero_memory [--model mlp] [--device cpu]

Each rank builds the benchmark model (``benchmarks/models.py``, full size), wraps it in ``DataParallel``, takes
one Adam step with plain Adam and one with ``ZeroRedundancyOptimizer(optimizer_class=Adam)``, and rank 0 prints,
per rank, the bytes of the optimizer state's tensors (``exp_avg`` and ``exp_avg_sq``; Adam's ``step`` is a
Python float) and the parameter bytes. ``--device cuda`` puts rank ``r`` on ``cuda:r`` with NCCL.
"""

from __future__ import annotations

import argparse

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import optim

from .models import build_flowgraph, spec


def state_bytes(state) -> int:
    """Bytes of every tensor in an optimizer's ``state`` (parameter -> dict of buffers)."""
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if isinstance(v, fg.Tensor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    dist.init(backend="nccl" if args.device == "cuda" else "local")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{dist.get_local_rank()}" if args.device == "cuda" else "cpu"
    sp = spec(args.model)
    fg.manual_seed(0)
    model = build_flowgraph(args.model).to(device)
    dp = dist.DataParallel(model)
    x = fg.randn(*(sp.batch // world, *sp.input_shape[1:]), device=device)
    y = fg.randn(*(sp.batch // world, *sp.target_shape[1:]), device=device)
    n_params = sum(p.numel() for p in model.parameters())
    row = [rank, n_params]
    for zero in (False, True):
        if zero:
            opt = dist.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam, lr=1e-3)
        else:
            opt = optim.Adam(model.parameters(), lr=1e-3)
        ((dp(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        row.append(state_bytes(opt.state))
    rows = dist.all_gather(fg.tensor(row, dtype="int64", device=device))
    if rank == 0:
        print(f"{args.model}: {n_params:,} parameters ({4 * n_params / 2**20:.1f} MiB float32), {world} rank(s)")
        print("| rank | Adam state bytes | ZeRO Adam state bytes | ratio |")
        print("| ---: | ---: | ---: | ---: |")
        for r in rows:
            _, _, plain, sharded = (int(v) for v in r.tolist())
            print(f"| {int(r[0].item())} | {plain:,} | {sharded:,} | {sharded / plain:.3f} |")
    dist.destroy()


if __name__ == "__main__":
    main()
