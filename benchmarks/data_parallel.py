"""Data-parallel training on several GPUs: equality with one GPU, and throughput scaling.

Run under the launcher, one process per GPU (NCCL); ``--nproc-per-node 1`` gives the 1-GPU baseline, which
trains the plain model (no ``DataParallel`` wrapper, no collectives)::

    python -m flowgraph.distributed.run --nproc-per-node 2 -m benchmarks.data_parallel --check --model mlp
    python -m flowgraph.distributed.run --nproc-per-node 1 -m benchmarks.data_parallel --bench --model mlp
    python -m flowgraph.distributed.run --nproc-per-node 2 -m benchmarks.data_parallel --bench --model mlp

``--check``: every rank trains ``DataParallel(model)`` for ``--steps`` Adam steps on its half of a global
batch of ``world x batch`` samples; then rank 0 trains the same initial model on one GPU with the whole global
batch and prints the largest parameter difference, absolute and relative to how far the parameters moved.

``--bench``: the benchmark protocol (``python -m benchmarks``) per rank: epochs of ``--steps`` steps on
pre-generated batches of the model's benchmark batch size per rank, median epoch; rank 0 prints samples per
second over all ranks. Scaling is the 2-rank figure over the 1-rank one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def _batches(sp, world: int, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` global batches (``world`` x the model's batch), identical on every rank."""
    rng = np.random.default_rng(seed)
    shape_x = (sp.input_shape[0] * world, *sp.input_shape[1:])
    shape_y = (sp.target_shape[0] * world, *sp.target_shape[1:])
    return [(rng.standard_normal(shape_x, dtype=np.float32), rng.standard_normal(shape_y, dtype=np.float32))
            for _ in range(count)]


def _train(model, opt, batches, device: str, rank: int, world: int) -> list[float]:
    import flowgraph as fg
    from flowgraph import nn

    loss_fn = nn.MSELoss()
    losses = []
    for x, y in batches:
        n = x.shape[0] // world
        xs = fg.tensor(x[rank * n:(rank + 1) * n], device=device)
        ys = fg.tensor(y[rank * n:(rank + 1) * n], device=device)
        loss = loss_fn(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check(args, rank: int, world: int, device: str) -> dict | None:
    """Train ``--steps`` steps data-parallel; rank 0 compares with one GPU on the doubled batch."""
    import flowgraph as fg
    import flowgraph.distributed as dist
    from flowgraph import optim

    from .models import build_flowgraph, spec

    sp = spec(args.model, args.scale)
    batches = _batches(sp, world, args.steps, seed=1)

    def fresh():
        fg.manual_seed(0)
        return build_flowgraph(args.model, args.scale).to(device)

    model = fresh()
    initial = [p.detach().numpy().copy() for p in model.parameters()]
    dp = dist.DataParallel(model) if world > 1 else model
    make_opt = (lambda ps: optim.SGD(ps, lr=args.lr * 10)) if args.optimizer == "sgd" else (
        lambda ps: optim.Adam(ps, lr=args.lr))
    _train(dp, make_opt(dp.parameters()), batches, device, rank, world)
    result = None
    if rank == 0:
        ref = fresh()
        _train(ref, make_opt(ref.parameters()), batches, device, 0, 1)
        diff = moved = 0.0
        for a, b, p0 in zip(model.parameters(), ref.parameters(), initial):
            a, b = a.detach().numpy(), b.detach().numpy()
            diff = max(diff, float(np.abs(a - b).max()))
            moved = max(moved, float(np.abs(b - p0).max()))
        result = {"mode": "check", "model": args.model, "world": world, "steps": args.steps,
                  "optimizer": args.optimizer,
                  "max_abs_diff": diff, "max_param_change": moved, "relative": diff / moved if moved else 0.0}
        print(f"check {args.model}: {world} GPUs x batch {sp.batch} vs 1 GPU x batch {sp.batch * world}, "
              f"{args.steps} {args.optimizer} steps: max |param diff| {diff:.3e} (params moved up to {moved:.3e}; "
              f"relative {result['relative']:.2e})", flush=True)
    return result


def training_step(args, rank: int, world: int, device: str, jit: bool) -> tuple:
    """``(spec, model, step, backend, rng)``: the benchmark model (``DataParallel`` on several ranks, with
    ``args.bucket_cap_mb``), Adam at ``args.lr``, and ``step(x, y)`` (forward, MSE, zero_grad, backward, step;
    returns the loss), under ``fg.jit`` when ``jit`` (one CUDA graph per rank, NCCL all-reduces included);
    ``rng`` this rank's generator for its batches."""
    import flowgraph as fg
    import flowgraph.distributed as dist
    from flowgraph import nn, optim

    from .models import build_flowgraph, spec

    sp = spec(args.model, args.scale)
    fg.manual_seed(0)
    model = build_flowgraph(args.model, args.scale).to(device)
    dp = dist.DataParallel(model, bucket_cap_mb=args.bucket_cap_mb) if world > 1 else model
    opt = optim.Adam(dp.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    def step(x, y):
        loss = loss_fn(dp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return sp, dp, fg.jit(step) if jit else step, fg.get_backend(device), np.random.default_rng(100 + rank)


def _median_epoch(args, barrier, synchronize, run_step, data) -> tuple[float, list[float]]:
    """``(median, times)`` in seconds of ``args.epochs`` timed epochs after ``args.warmup``: each epoch starts
    after ``barrier()`` (None in a world of one) and ``synchronize()``, calls ``run_step(x, y)`` (which reads
    the loss back) on every batch of ``data``, and ends with ``synchronize()``."""
    times = []
    for epoch in range(args.warmup + args.epochs):
        if barrier is not None:
            barrier()
        synchronize()
        t0 = time.perf_counter()
        for x, y in data:
            run_step(x, y)
        synchronize()
        if epoch >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def _report(args, world: int, batch: int, med: float, times: list[float], label: str, **extra) -> dict:
    """Rank 0's line (``bench <label>: ...``) and JSON result: global samples per second."""
    samples = world * batch * args.steps / med
    print(f"bench {label}: {world} GPU(s), batch {batch} per GPU, {args.steps} steps/epoch: "
          f"median epoch {med * 1e3:.1f} ms, {samples:.0f} samples/s", flush=True)
    return {"mode": "bench", **extra, "model": args.model, "world": world, "bucket_cap_mb": args.bucket_cap_mb,
            "epoch_ms": med * 1e3, "epoch_ms_all": [t * 1e3 for t in times], "samples_per_s": samples,
            "batch_per_rank": batch}


def bench(args, rank: int, world: int, device: str) -> dict | None:
    """Median epoch time per rank; rank 0 reports global samples per second."""
    import flowgraph as fg
    import flowgraph.distributed as dist

    sp, _, step, backend, rng = training_step(args, rank, world, device, args.capture)
    data = [(fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=device),
             fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=device))
            for _ in range(args.steps)]
    med, times = _median_epoch(args, dist.barrier if world > 1 else None, backend.synchronize,
                               lambda x, y: step(x, y).item(), data)
    if rank != 0:
        return None
    return _report(args, world, sp.batch, med, times, f"{args.model} jit" if args.capture else args.model,
                   capture=args.capture)


def bench_torch(args, rank: int, world: int) -> dict | None:
    """The same protocol with PyTorch's ``DistributedDataParallel`` (eager, NCCL through ``torch.distributed``;
    one rank trains the plain model), for reference: the scaling the usual tool reaches on these GPUs."""
    import torch
    import torch.distributed as tdist

    from .models import build_torch, spec

    sp = spec(args.model, args.scale)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = f"cuda:{local}"
    if world > 1:
        tdist.init_process_group("nccl", device_id=torch.device(device))
    torch.manual_seed(0)
    model = build_torch(args.model, args.scale).to(device)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local],
                                                    bucket_cap_mb=args.bucket_cap_mb) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, fused=True)
    gen = np.random.default_rng(100 + rank)
    data = [(torch.tensor(gen.standard_normal(sp.input_shape, dtype=np.float32), device=device),
             torch.tensor(gen.standard_normal(sp.target_shape, dtype=np.float32), device=device))
            for _ in range(args.steps)]
    loss_fn = torch.nn.MSELoss()

    def step(x, y):
        loss = loss_fn(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    med, times = _median_epoch(args, tdist.barrier if world > 1 else None, torch.cuda.synchronize, step, data)
    if world > 1:
        tdist.destroy_process_group()
    if rank != 0:
        return None
    return _report(args, world, sp.batch, med, times, f"torch DDP {args.model}", framework="torch", capture=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--check", action="store_true", help="compare with one GPU on the doubled batch")
    parser.add_argument("--bench", action="store_true", help="time epochs (throughput)")
    parser.add_argument("--steps", type=int, default=None, help="steps (20 for --check, 50 per epoch for --bench)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                        help="--check: Adam (lr) or SGD (10 x lr)")
    parser.add_argument("--jit", "--capture", dest="capture", action="store_true",
                        help="--bench: run each step under fg.jit (a CUDA graph per rank)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DataParallel's bucket size (MiB)")
    parser.add_argument("--backend", default="nccl", help="nccl, or local (CPU processes through the store)")
    parser.add_argument("--torch", action="store_true",
                        help="--bench with PyTorch's DistributedDataParallel instead (eager; reference)")
    parser.add_argument("--json", default=None, help="append rank 0's result as one JSON line to this file")
    args = parser.parse_args()
    import flowgraph.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.torch:
        args.steps = args.steps or 50
        result = bench_torch(args, int(os.environ.get("RANK", "0")), world)
        if result is not None and args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
        return
    if world > 1:
        dist.init(backend=args.backend)
    rank = dist.get_rank() if world > 1 else 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if args.backend == "nccl" else "cpu"
    results = []
    if args.check:
        args.steps = args.steps or 20
        results.append(check(args, rank, world, device))
    if args.bench:
        args.steps = args.steps or 50
        results.append(bench(args, rank, world, device))
    if rank == 0 and args.json:
        with open(args.json, "a") as f:
            for r in results:
                if r is not None:
                    f.write(json.dumps(r) + "\n")
    if world > 1:
        dist.destroy()


if __name__ == "__main__":
    main()
