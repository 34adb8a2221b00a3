"""Run by the launcher in test_data_parallel.py: gradient accumulation over 2 micro-batches with ``no_sync`` (and
with nanoGPT's ``require_backward_grad_sync`` toggle) on 2 ranks vs one process stepping on the full batch.

``python _no_sync_worker.py OUT [local|nccl]``; writes ``OUT.<rank>``: the worst parameter difference of each way,
and whether the gradients were still rank-local right after the ``no_sync`` backward.
"""

import sys

import numpy as np
from _util import sgd  # the launcher runs this file as a script, next to _util.py

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn


def make_model() -> nn.Module:
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def main(out_path: str, backend: str = "local") -> None:
    dist.init(backend=backend, timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    rng = np.random.default_rng(2)
    x_all = rng.standard_normal((6, 8, 6)).astype(np.float32)
    y_all = rng.standard_normal((6, 8, 3)).astype(np.float32)
    shard = dist.shard(8, rank, world, shuffle=False)  # 4 rows each, 2 micro-batches of 2
    results = []
    local_after_no_sync = True
    for way in ("no_sync", "toggle"):
        model = make_model().to(device)
        dp = dist.DataParallel(model, bucket_cap_mb=0.0005)
        for step in range(6):
            x = fg.tensor(x_all[step][shard], device=device)
            y = fg.tensor(y_all[step][shard], device=device)
            for micro in range(2):
                rows = slice(2 * micro, 2 * micro + 2)
                last = micro == 1
                if way == "no_sync" and not last:
                    with dp.no_sync():
                        (((dp(x[rows]) - y[rows]) ** 2).mean() / 2).backward()
                    grads = dist.all_gather(model[2].bias.grad.detach().clone())
                    local_after_no_sync &= float(abs(grads[0] - grads[1]).max()) > 0
                else:
                    dp.require_backward_grad_sync = last if way == "toggle" else True
                    (((dp(x[rows]) - y[rows]) ** 2).mean() / 2).backward()
            sgd(model)
        results.append(model)
    ref = make_model().to(device)
    for step in range(6):
        loss = ((ref(fg.tensor(x_all[step], device=device)) - fg.tensor(y_all[step], device=device)) ** 2).mean()
        loss.backward()
        sgd(ref)
    worst = [max(float(np.abs(a.detach().numpy() - b.detach().numpy()).max())
                 for a, b in zip(m.parameters(), ref.parameters())) for m in results]
    with open(out_path + f".{rank}", "w") as f:
        f.write(f"{worst[0]} {worst[1]} {int(local_after_no_sync)}\n")
    dist.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:])
