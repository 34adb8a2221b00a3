"""Learning-rate schedulers: the same small regression trained under several schedules.

Each schedule is stepped once per epoch (``ReduceLROnPlateau`` with the validation loss) and its learning
rate curve is printed as a text chart next to the final loss:

* constant (no scheduler), for reference;
* ``StepLR`` (halve every quarter of the run);
* linear warm-up then cosine decay: ``SequentialLR([LinearLR, CosineAnnealingLR])``;
* ``OneCycleLR`` (stepped per batch, as it is meant to be);
* ``ReduceLROnPlateau`` on the validation loss.

    python examples/schedulers/train.py --device cpu --epochs 40
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.optim import lr_scheduler

BASE_LR = 1e-2
STEPS_PER_EPOCH = 4


def warmup_cosine(opt: optim.Optimizer, epochs: int) -> lr_scheduler.LRScheduler:
    """Linear warm-up from 10% over the first 10% of epochs, then cosine decay to 1% of the base lr."""
    warm = max(1, epochs // 10)
    return lr_scheduler.SequentialLR(opt, schedulers=[
        lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=warm),
        lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs - warm), eta_min=BASE_LR * 0.01),
    ], milestones=[warm])


SCHEDULES: dict[str, Callable[[optim.Optimizer, int], object]] = {
    "constant": lambda opt, epochs: None,
    "step": lambda opt, epochs: lr_scheduler.StepLR(opt, step_size=max(1, epochs // 4), gamma=0.5),
    "warmup_cosine": warmup_cosine,
    "one_cycle": lambda opt, epochs: lr_scheduler.OneCycleLR(opt, max_lr=BASE_LR * 3, epochs=epochs,
                                                             steps_per_epoch=STEPS_PER_EPOCH),
    "plateau": lambda opt, epochs: lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=2,
                                                                  threshold=1e-2),
}


def make_model() -> nn.Module:
    """The small regressor every schedule trains."""
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def run(name: str, epochs: int, device: str) -> dict:
    """Train one model under schedule ``name``; returns the lr used in each epoch and the losses."""
    fg.manual_seed(0)
    x = fg.randn(256, 8, device=device)
    y = (x[:, :4].sum(-1, keepdim=True) * 0.5).sin()
    x_val = fg.randn(128, 8, device=device)
    y_val = (x_val[:, :4].sum(-1, keepdim=True) * 0.5).sin()
    model = make_model().to(device)
    opt = optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    sched = SCHEDULES[name](opt, epochs)
    batch = x.shape[0] // STEPS_PER_EPOCH
    lrs, val_losses = [], []
    for _ in range(epochs):
        lrs.append(opt.param_groups[0]["lr"])            # the lr this epoch starts with
        for i in range(0, x.shape[0], batch):
            loss = nn.functional.mse_loss(model(x[i:i + batch]), y[i:i + batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if isinstance(sched, lr_scheduler.OneCycleLR):
                sched.step()                              # per batch
        with fg.no_grad():
            val = nn.functional.mse_loss(model(x_val), y_val).item()
        val_losses.append(val)
        if isinstance(sched, lr_scheduler.ReduceLROnPlateau):
            sched.step(val)                               # with the metric it watches
        elif sched is not None and not isinstance(sched, lr_scheduler.OneCycleLR):
            sched.step()                                  # per epoch
    return {"lrs": lrs, "val_losses": val_losses, "first_loss": val_losses[0], "final_loss": val_losses[-1]}


def chart(values: list[float], width: int = 40, height: int = 6) -> list[str]:
    """A small text bar chart of ``values`` (resampled to ``width`` columns) from 0 to their maximum."""
    n = len(values)
    cols = [values[min(n - 1, int(i * n / width))] for i in range(min(width, n))]
    top = max(cols) or 1.0
    return ["".join("#" if v >= top * (r - 0.5) / height else " " for v in cols) for r in range(height, 0, -1)]


def train(epochs: int = 40, device: str = "cpu", schedules: list[str] | None = None, verbose: bool = True
          ) -> dict:
    """Run every schedule (or those named); returns ``{name: run(...)}``."""
    results = {}
    for name in schedules or list(SCHEDULES):
        if name not in SCHEDULES:
            raise fg.FlowError(f"schedulers example: unknown schedule {name!r}; choose from {list(SCHEDULES)}")
        result = results[name] = run(name, epochs, device)
        if verbose:
            lrs = result["lrs"]
            print(f"{name}: lr {lrs[0]:.2e} -> max {max(lrs):.2e} -> {lrs[-1]:.2e}; "
                  f"val loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}")
            for row in chart(lrs):
                print("  |" + row)
            print("  +" + "-" * min(40, len(lrs)) + f" {epochs} epochs")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or opencl[:N] (default: cpu)")
    parser.add_argument("--epochs", type=int, default=40, help="training epochs per schedule (default: 40)")
    parser.add_argument("--schedule", action="append", choices=list(SCHEDULES),
                        help="run only this schedule (repeatable; default: all)")
    args = parser.parse_args()
    train(epochs=args.epochs, device=args.device, schedules=args.schedule)


if __name__ == "__main__":
    main()
