"""DataLoader throughput: flowgraph.utils.data vs torch.utils.data in the same run, and against a training step.

The data is the mlp benchmark's (``benchmarks/models.py``): ``--batches`` batches of ``spec("mlp", scale)``
inputs and targets (float32), held in memory as a ``TensorDataset`` ("tensors") or as a map-style data set of
NumPy rows read sample by sample ("rows"). Each configuration iterates whole shuffled
epochs (``shuffle=True``, the worker start included when the workers are not persistent); the table gives
batches per second (median epoch over ``--rounds``, frameworks alternating which goes first) and the ratio
flowgraph / torch in time per batch (below 1.0: flowgraph is faster). The last lines compare the loader's time per
batch with one training step of the mlp model on the CPU (forward, MSE, zero_grad, backward, Adam step): the
share of a step the loader would cost if nothing overlapped.

    python benchmarks/dataloader.py                  # scale 0.25: the CPU configuration of the model benchmark
    python benchmarks/dataloader.py --scale 1 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from benchmarks.models import build_flowgraph, spec  # noqa: E402

CONFIGS = [("tensors, 0 workers", "tensors", dict(num_workers=0)),
           ("tensors, 2 workers", "tensors", dict(num_workers=2)),
           ("tensors, 2 persistent", "tensors", dict(num_workers=2, persistent_workers=True)),
           ("rows, 0 workers", "rows", dict(num_workers=0)),
           ("rows, 2 persistent", "rows", dict(num_workers=2, persistent_workers=True))]


class Rows:
    """A map-style data set of NumPy rows (``(x[i], y[i])``): every framework reads it sample by sample and
    stacks the rows with its ``default_collate``."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.x)


def _data(scale: float, batches: int) -> tuple[np.ndarray, np.ndarray, int]:
    sp = spec("mlp", scale)
    rng = np.random.default_rng(0)
    n = sp.batch * batches
    x = rng.standard_normal((n, *sp.input_shape[1:]), dtype=np.float32)
    y = rng.standard_normal((n, *sp.target_shape[1:]), dtype=np.float32)
    return x, y, sp.batch


def _epoch_seconds(loader) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    for _xb, _yb in loader:
        count += 1
    return time.perf_counter() - start, count


def _loaders(x: np.ndarray, y: np.ndarray, batch: int, kind: str, kwargs: dict):
    """The flowgraph and the torch loader of one configuration over the same arrays."""
    import torch
    import torch.utils.data as td

    import flowgraph as fg
    from flowgraph.utils import data as fd

    if kind == "tensors":
        ours = fd.TensorDataset(fg.from_numpy(x), fg.from_numpy(y))
        theirs = td.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    else:
        ours = theirs = Rows(x, y)
    return (fd.DataLoader(ours, batch_size=batch, shuffle=True, generator=0, **kwargs),
            td.DataLoader(theirs, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0),
                          **kwargs))


def _train_step_seconds(scale: float, steps: int = 20) -> float:
    import flowgraph as fg
    from flowgraph import nn, optim

    sp = spec("mlp", scale)
    fg.manual_seed(0)
    model = build_flowgraph("mlp", scale)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    rng = np.random.default_rng(1)
    x = fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32))
    y = fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32))
    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.25, help="model/data scale of benchmarks/models.py")
    parser.add_argument("--batches", type=int, default=50, help="batches per epoch (the model benchmark's 50)")
    parser.add_argument("--rounds", type=int, default=5, help="epochs timed per configuration and framework")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    step = _train_step_seconds(args.scale)  # first, while no worker process exists
    x, y, batch = _data(args.scale, args.batches)
    print(f"data: {x.shape[0]} samples, inputs {x.shape[1:]}, targets {y.shape[1:]}, float32, batch {batch}, "
          f"{args.batches} batches per epoch, shuffle=True; median of {args.rounds} epochs")
    print(f"{'configuration':<22} {'flowgraph batch/s':>18} {'torch batch/s':>14} {'ratio (time)':>13}")
    per_batch = {}
    for name, kind, kwargs in CONFIGS:
        ours, theirs = _loaders(x, y, batch, kind, kwargs)
        _epoch_seconds(ours), _epoch_seconds(theirs)  # warm-up (and the persistent workers' start)
        times: dict[str, list[float]] = {"fg": [], "torch": []}
        for r in range(args.rounds):
            order = [("fg", ours), ("torch", theirs)] if r % 2 == 0 else [("torch", theirs), ("fg", ours)]
            for key, loader in order:
                seconds, count = _epoch_seconds(loader)
                times[key].append(seconds / count)
        f, t = statistics.median(times["fg"]), statistics.median(times["torch"])
        per_batch[name] = f
        print(f"{name:<22} {1 / f:>18.0f} {1 / t:>14.0f} {f / t:>13.2f}")
        del ours, theirs
    print(f"mlp training step on cpu (scale {args.scale}): {step * 1e3:.2f} ms")
    for name, seconds in per_batch.items():
        print(f"  loader ({name}) per batch: {seconds * 1e3:.3f} ms = {100 * seconds / step:.1f}% of a step")


if __name__ == "__main__":
    main()
