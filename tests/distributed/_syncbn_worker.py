"""Run by the launcher in test_data_parallel.py: DataParallel with SyncBatchNorm vs one process on the full batch.

``python _syncbn_worker.py OUT [local|nccl]``. Writes ``<max |param/buffer difference| with sync_batchnorm> <the
same with local BatchNorm>`` to ``OUT.<rank>``.
"""

import sys

import numpy as np
from _util import sgd  # the launcher runs this file as a script, next to _util.py

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn


def make_model() -> nn.Module:
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def state(model: nn.Module) -> list[np.ndarray]:
    return [t.detach().numpy().copy() for t in model.state_dict().values() if t.dtype != fg.int64]


def train(model, xs, ys, rank: int, world: int, device: str) -> None:
    for x, y in zip(xs, ys):
        n = x.shape[0] // world
        xr = fg.tensor(x[rank * n:(rank + 1) * n], device=device)
        loss = ((model(xr) - fg.tensor(y[rank * n:(rank + 1) * n], device=device)) ** 2).mean()
        loss.backward()
        sgd(model.module if isinstance(model, dist.DataParallel) else model)


def main(out_path: str, backend: str = "local") -> None:
    dist.init(backend=backend, timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    rng = np.random.default_rng(3)
    shift = np.array([3.0, -2.0, 0.5, 1.0, 0.0], np.float32)  # shards with different means: local stats differ
    xs = [(rng.standard_normal((8, 5)) + shift * np.arange(8)[:, None] / 4).astype(np.float32) for _ in range(10)]
    ys = [rng.standard_normal((8, 2)).astype(np.float32) for _ in range(10)]
    ref = make_model().to(device)
    train(ref, xs, ys, 0, 1, device)
    diffs = []
    for sync in (True, False):
        model = make_model().to(device)
        dp = dist.DataParallel(model, sync_batchnorm=sync, broadcast_buffers=False)
        train(dp, xs, ys, rank, world, device)
        diffs.append(max(float(np.abs(a - b).max()) for a, b in zip(state(model), state(ref))))
    with open(out_path + f".{rank}", "w") as f:
        f.write(f"{diffs[0]} {diffs[1]}\n")
    dist.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:])
