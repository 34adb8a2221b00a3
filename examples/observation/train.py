"""Early stopping and learning-rate decay driven by trends.

Train and validation losses are recorded per batch, flushed to epoch values, and the trends decide:
when the validation loss stops improving the learning rate is halved; when it has not improved for
longer, training stops. The curves are written as a self-contained HTML page.

    python examples/observation/train.py --device cpu --epochs 60
"""

from __future__ import annotations

import argparse
import os

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder


def make_model() -> fg.Graph:
    """The regressor: two GELU layers, the hidden one tagged for observation."""
    return (FlowBuilder.from_(nn.Linear(8, 64)).through(nn.GELU()).through(nn.Linear(64, 64)).tag("hidden")
            .through(nn.GELU()).through(nn.Linear(64, 1)).label("regressor").build())


def train(epochs: int = 60, device: str = "cpu", out_dir: str | None = None, verbose: bool = True) -> dict:
    """Train with trend-driven lr decay and early stopping; returns what happened."""
    fg.manual_seed(0)
    x = fg.randn(512, 8, device=device)
    y = (x[:, :1] * x[:, 1:2]).tanh() + 0.05 * fg.randn(512, 1, device=device)
    x_train, y_train, x_val, y_val = x[:384], y[:384], x[384:], y[384:]
    model = make_model().to(device)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    decays, stopped_at = [], None
    for epoch in range(epochs):
        model.train()
        for i in range(0, 384, 64):
            loss = nn.functional.mse_loss(model(x_train[i:i + 64]), y_train[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.record("train_loss", loss)
        model.eval()
        with fg.no_grad():
            model.record("val_loss", nn.functional.mse_loss(model(x_val), y_val))
            model.collect("hidden", reduce="norm")
        model.flush()
        val = model.trend("val_loss")
        since_decay = epoch - (decays[-1] if decays else 0)
        if epoch >= 10 and since_decay >= 8 and not val.improving(8):
            if len(decays) == 3:
                stopped_at = epoch
                if verbose:
                    print(f"epoch {epoch}: val_loss still not improving after 3 lr decays -> early stop")
                break
            for group in opt.param_groups:
                group["lr"] *= 0.5
            decays.append(epoch)
            if verbose:
                print(f"epoch {epoch}: val_loss not improving over 8 epochs -> lr {opt.param_groups[0]['lr']:.2e}")
    out_dir = out_dir or os.path.join("runs", "observation")  # a run folder, never the sources
    os.makedirs(out_dir, exist_ok=True)
    page = model.plot_html(os.path.join(out_dir, "curves.html"), ["train_loss", "val_loss", "hidden"])
    metrics = model.latest_metrics()
    if verbose:
        print(f"final {metrics}; curves: {page}")
    return {"metrics": metrics, "decays": decays, "stopped_at": stopped_at, "page": page,
            "first_val": model.history("val_loss")[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()
    train(args.epochs, args.device)


if __name__ == "__main__":
    main()
