"""Data-parallel training: one process per device, gradients averaged by ``DataParallel``.

The same script runs on CPU processes (collectives through the launcher's TCP store) and on GPUs (NCCL):

    python -m flowgraph.distributed.run --nproc-per-node 2 examples/data_parallel/train.py --device cpu
    python -m flowgraph.distributed.run --nproc-per-node 2 examples/data_parallel/train.py --device cuda

Each rank trains on its shard of the data (``shard``), BatchNorm statistics are synchronised across ranks
(``sync_batchnorm=True``), and only rank 0 prints, writes the report and saves the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import time

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder
from flowgraph.monitor import Monitor


def make_model(hidden: int = 64) -> fg.Graph:
    """A small residual regressor with a BatchNorm (synchronised across ranks when data-parallel)."""
    return (FlowBuilder.from_(nn.Linear(8, hidden)).tag("embed")
            .through(nn.BatchNorm1d(hidden)).through(nn.GELU())
            .also(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())).tag("block")
            .through(nn.Linear(hidden, 1)).tag("head")
            .label("regressor").build())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cpu: CPU processes, collectives through the store; cuda: GPU LOCAL_RANK per rank, NCCL")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--out", default=os.path.join("runs", "data_parallel"),
                        help="where rank 0 writes its files (default: runs/data_parallel)")
    args = parser.parse_args()

    dist.init(backend="nccl" if args.device == "cuda" else "local")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{dist.get_local_rank()}" if args.device == "cuda" else "cpu"

    fg.manual_seed(0)  # the same data on every rank; each takes its own shard
    x_all = fg.randn(2048, 8)
    y_all = (x_all[:, :1] * 2 - x_all[:, 1:2] ** 2 + 0.1 * fg.randn(2048, 1))
    fg.manual_seed(rank)  # different initial weights: DataParallel broadcasts rank 0's
    model = make_model().to(device)
    dp = dist.DataParallel(model, sync_batchnorm=True)
    opt = optim.AdamW(dp.parameters(), lr=3e-3)
    loss_fn = nn.MSELoss()

    losses = []
    with Monitor(args.epochs, report_path=os.path.join(args.out, "report.html")) as mon:
        for epoch in range(args.epochs):
            began = time.perf_counter()
            idx = fg.tensor(dist.shard(len(x_all), rank, world, shuffle=True, seed=0, epoch=epoch))
            total = fg.zeros((), device=device)
            steps = 0
            for start in range(0, len(idx), args.batch):
                batch = idx[start:start + args.batch]
                x, y = x_all[batch].to(device), y_all[batch].to(device)
                loss = loss_fn(dp(x), y)
                opt.zero_grad()
                loss.backward()  # gradients averaged over the ranks when this returns
                opt.step()
                total = total + loss.detach()
                steps += 1
            dist.all_reduce(total, "avg")  # the mean loss over all ranks, for the log
            losses.append(total.item() / steps)
            mon.log(epoch, time.perf_counter() - began, {"loss": losses[-1]})
    model.save_checkpoint(os.path.join(args.out, "regressor.safetensors"))  # rank 0 writes, the others skip
    dist.barrier()
    if rank == 0:
        print(f"trained on {world} rank(s): loss {losses[0]:.4f} -> {losses[-1]:.4f}; checkpoint "
              f"{os.path.join(args.out, 'regressor.safetensors')}")
    dist.destroy()


if __name__ == "__main__":
    main()
