"""Run by the launcher in test_data_parallel.py: 2-rank DataParallel training vs single-process training.

``python _dp_worker.py OUT [local|nccl]``: the store transport on CPU tensors (default), or NCCL with rank ``r``
on ``cuda:r``.
"""

import sys

import numpy as np
from _util import sgd  # the launcher runs this file as a script, next to _util.py

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn


def make_model() -> nn.Module:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    model[0].requires_grad_(False)  # frozen subtree: never bucketed, never reduced
    return model


def main(out_path: str, backend: str = "local") -> None:
    dist.init(backend=backend, timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    rng = np.random.default_rng(1)
    x_all = rng.standard_normal((20, 8, 6)).astype(np.float32)
    y_all = rng.standard_normal((20, 8, 3)).astype(np.float32)
    model = make_model().to(device)
    if rank == 1:  # different start on rank 1: the construction-time broadcast must fix it
        with fg.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
    model.register_buffer("stat", fg.full((4,), float(rank + 1), device=device))
    dp = dist.DataParallel(model, bucket_cap_mb=0.0005)
    assert model.stat.tolist() == [1.0] * 4, "buffers not broadcast from rank 0"
    frozen = {id(p) for p in model[0].parameters()}
    bucketed = {id(dp._params[i]) for b in dp.buckets for i in b}
    assert len(dp.buckets) > 1, dp.buckets
    assert not frozen & bucketed, "frozen parameter in a bucket"
    shard_idx = dist.shard(8, rank, world, shuffle=False)
    for step in range(20):
        x = fg.tensor(x_all[step][shard_idx], device=device)
        y = fg.tensor(y_all[step][shard_idx], device=device)
        loss = ((dp(x) - y) ** 2).mean()
        assert model.stat.tolist() == [1.0] * 4, f"rank {rank} step {step}: buffer not re-broadcast"
        loss.backward()
        for p in model[0].parameters():
            assert p.grad is None
        sgd(model)
        if rank == 1:
            with fg.no_grad():
                model.stat.add_(1.0)  # rank 1 drifts; broadcast_buffers resets it at the next forward
    # reference: one process, full batch
    ref = make_model().to(device)
    for step in range(20):
        loss = ((ref(fg.tensor(x_all[step], device=device)) - fg.tensor(y_all[step], device=device)) ** 2).mean()
        loss.backward()
        sgd(ref)
    worst = max(float(np.abs(a.detach().numpy() - b.detach().numpy()).max())
                for a, b in zip(model.parameters(), ref.parameters()))
    gathered = dist.all_gather(fg.tensor([float(rank)], device=device))
    with open(out_path + f".{rank}", "w") as f:
        f.write(f"{worst} {[g.item() for g in gathered]}\n")
    with open(out_path + f".{rank}.info", "w") as f:  # which launcher and transport ran (test_launch_env.py)
        f.write(f"{dist.detect_environment().source} {type(dist.get_communicator()).__name__} "
                f"{dist.get_local_rank()}\n")
    dist.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:])
