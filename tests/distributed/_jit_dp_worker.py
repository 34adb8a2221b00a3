"""Run by the launcher in test_data_parallel.py: a jitted DataParallel step trains like the eager one.

``python _jit_dp_worker.py OUT``: 2 ranks on the store transport (CPU tensors). Each rank trains the same model
twice from the same weights, eagerly and with ``fg.jit`` (the all-reduces and buffer broadcasts run again on every
replay), and writes the largest parameter difference.
"""

import sys

import numpy as np

import flowgraph as fg
import flowgraph.distributed as dist
import flowgraph.nn.functional as F
from flowgraph import nn, optim


def train(jitted: bool, rank: int, world: int) -> list[np.ndarray]:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    model.register_buffer("stat", fg.full((4,), float(rank + 1)))
    dp = dist.DataParallel(model, bucket_cap_mb=0.0005)
    opt = optim.Adam(dp.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(dp(x), y)
        loss.backward()
        opt.step()
        return loss

    run = fg.jit(step) if jitted else step
    rng = np.random.default_rng(1)
    shard_idx = dist.shard(8, rank, world, shuffle=False)
    for _ in range(12):
        x = rng.standard_normal((8, 6)).astype(np.float32)[shard_idx]
        y = rng.standard_normal((8, 3)).astype(np.float32)[shard_idx]
        run(fg.tensor(x), fg.tensor(y))
        if rank == 1:
            with fg.no_grad():
                model.stat.add_(1.0)  # rank 1 drifts; the broadcast at the next forward resets it
    assert model.stat.tolist() == [1.0] * 4 or rank == 1
    if jitted:
        assert run.recordings == 1, (run.recordings, run.last_miss)  # replayed from the third step on
    return [p.detach().numpy().copy() for p in model.parameters()]


def main(out_path: str, backend: str = "local") -> None:
    dist.init(backend=backend, timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    eager = train(False, rank, world)
    jitted = train(True, rank, world)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(eager, jitted))
    with open(out_path + f".{rank}", "w") as f:
        f.write(f"{worst}\n")
    dist.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:])
