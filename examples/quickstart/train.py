"""Quickstart: build a small classifier with the graph builder and train it, the PyTorch way.

Two interleaved spirals, a residual MLP built with FlowBuilder, AdamW with a cosine schedule, mini-batches,
evaluation under ``fg.no_grad()``. Runs on the CPU in a few seconds:

    python examples/quickstart/train.py --device cpu --epochs 30
"""

from __future__ import annotations

import argparse
import math

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder


def make_spirals(n: int, device: str) -> tuple[fg.Tensor, fg.Tensor]:
    """``n`` points of two interleaved spirals (inputs (n, 2), labels 0/1 as int64)."""
    labels = fg.arange(n, device=device) % 2
    t = fg.rand(n, device=device) * 3 * math.pi + 0.5
    angle = t + labels.float() * math.pi
    x = fg.stack([t * angle.cos(), t * angle.sin()], dim=1) / 10
    return x + 0.02 * fg.randn(n, 2, device=device), labels


def make_model(hidden: int = 64) -> fg.Graph:
    """Input layer, two residual blocks, a two-class head; tagged so its parameters have readable names."""
    def block() -> nn.Module:
        return nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())

    return (FlowBuilder.from_(nn.Linear(2, hidden)).tag("embed")
            .through(nn.GELU())
            .also(block()).tag("block1")
            .also(block()).tag("block2")
            .through(nn.Linear(hidden, 2)).tag("head")
            .label("spirals").build())


def train(epochs: int = 30, device: str = "cpu", batch_size: int = 64, seed: int = 0, verbose: bool = True
          ) -> dict:
    """Train the classifier; returns the first and final epoch losses and the final accuracy."""
    fg.manual_seed(seed)
    x, y = make_spirals(1024, device)
    model = make_model().to(device)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        model.train()
        perm = fg.randperm(x.shape[0], device=device)
        total, batches = 0.0, 0
        for i in range(0, x.shape[0], batch_size):
            idx = perm[i:i + batch_size]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, batches = total + loss.item(), batches + 1
        sched.step()
        losses.append(total / batches)
        if verbose and (epoch % 5 == 0 or epoch == epochs - 1):
            print(f"epoch {epoch + 1:3d}/{epochs} loss {losses[-1]:.4f} lr {sched.get_last_lr()[0]:.5f}")
    model.eval()
    with fg.no_grad():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    if verbose:
        print(f"accuracy {accuracy:.3f}; parameters: {sum(p.numel() for p in model.parameters())}")
    return {"first_loss": losses[0], "final_loss": losses[-1], "accuracy": accuracy, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or opencl[:N] (default: cpu)")
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (default: 30)")
    args = parser.parse_args()
    train(epochs=args.epochs, device=args.device)


if __name__ == "__main__":
    main()
