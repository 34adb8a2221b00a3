"""Mixed-precision training with ``fg.autocast`` and ``optim.GradScaler``.

Inside ``with fg.autocast(dtype):`` matrix products (Linear layers here) run in float16 or bfloat16 while
reductions and the loss stay in float32; parameters stay float32. With float16 the loss is scaled by a
``GradScaler`` so small gradients do not flush to zero; a step whose gradients overflowed is skipped and
the scale lowered. bfloat16 has float32's range and needs no scaler (``enabled=False`` turns it into a
pass-through, so one loop serves both).

The same regression is trained in float32 and in mixed precision and the losses compared. On the CPU,
half-precision matmuls are emulated (slow); the speed-up is on GPUs:

    python examples/mixed_precision/train.py --device cpu --epochs 20 --dtype bfloat16
    python examples/mixed_precision/train.py --device cuda --epochs 20 --dtype float16
"""

from __future__ import annotations

import argparse

import flowgraph as fg
from flowgraph import nn, optim


def make_model() -> nn.Module:
    """A 16 -> 64 -> 64 -> 1 MLP."""
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))


def run(epochs: int, device: str, dtype: fg.DType | None, verbose: bool, init_scale: float = 2.0 ** 16,
        batch_size: int = 64) -> dict:
    """Train one model; ``dtype=None`` is plain float32. Returns losses, the scaler's scale and skips."""
    fg.manual_seed(0)
    x = fg.randn(512, 16, device=device)
    w = fg.randn(16, 1, device=device) / 4
    y = (x @ w).tanh() + 0.1 * x[:, :1] * x[:, 1:2]
    model = make_model().to(device)
    opt = optim.Adam(model.parameters(), lr=3e-3)
    # Loss scaling matters for float16 only; for bfloat16 and float32 the scaler is a pass-through.
    scaler = optim.GradScaler(init_scale=init_scale, enabled=dtype is fg.float16)
    losses, skipped, out_dtype = [], 0, None
    for epoch in range(epochs):
        total, batches = 0.0, 0
        for i in range(0, 512, batch_size):
            xb, yb = x[i:i + batch_size], y[i:i + batch_size]
            opt.zero_grad()
            with fg.autocast(dtype or fg.float16, enabled=dtype is not None):
                pred = model(xb)                            # low precision matmuls
                loss = nn.functional.mse_loss(pred, yb)     # float32
            out_dtype = pred.dtype
            scaler.scale(loss).backward()                   # gradients of the scaled loss
            scaler.unscale_(opt)                            # true gradients, so clipping sees real norms
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scale_before = scaler.get_scale()
            scaler.step(opt)                                # skipped if a gradient is inf/NaN
            scaler.update()
            skipped += int(scaler.get_scale() < scale_before)
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
        if verbose and (epoch % 5 == 0 or epoch == epochs - 1):
            name = dtype.name if dtype is not None else "float32"
            scale = f" loss scale {scaler.get_scale():g}" if scaler.is_enabled() else ""
            print(f"[{name:8s}] epoch {epoch + 1:3d}/{epochs} loss {losses[-1]:.5f}{scale}")
    params_dtype = next(model.parameters()).dtype
    return {"first_loss": losses[0], "final_loss": losses[-1], "losses": losses, "scale": scaler.get_scale(),
            "skipped_steps": skipped, "output_dtype": out_dtype, "param_dtype": params_dtype}


def train(epochs: int = 20, device: str = "cpu", dtype: str = "bfloat16", init_scale: float = 2.0 ** 16,
          verbose: bool = True) -> dict:
    """Train in float32 and in mixed precision (``dtype``: float16 or bfloat16); returns both results.

    ``init_scale`` is the GradScaler's first loss scale (float16 only); a too large one makes the first
    steps overflow, which the scaler detects, skips and corrects.
    """
    low = fg.float16 if dtype == "float16" else fg.bfloat16 if dtype == "bfloat16" else None
    if low is None:
        raise fg.FlowError(f"mixed_precision: dtype must be 'float16' or 'bfloat16', got {dtype!r}")
    reference = run(epochs, device, None, verbose)
    mixed = run(epochs, device, low, verbose, init_scale=init_scale)
    if verbose:
        print(f"final loss: float32 {reference['final_loss']:.5f}, {dtype} {mixed['final_loss']:.5f}; "
              f"outputs {mixed['output_dtype'].name}, parameters {mixed['param_dtype'].name}, "
              f"{mixed['skipped_steps']} skipped steps")
    return {"float32": reference, "mixed": mixed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or opencl[:N] (default: cpu)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default: 20)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"],
                        help="the low-precision dtype (default: bfloat16)")
    parser.add_argument("--init-scale", type=float, default=2.0 ** 16,
                        help="GradScaler's initial loss scale for float16 (default: 65536)")
    args = parser.parse_args()
    train(epochs=args.epochs, device=args.device, dtype=args.dtype, init_scale=args.init_scale)


if __name__ == "__main__":
    main()
