"""Fit a sine wave, watch it with the training monitor, and round-trip a checkpoint.

1. Train a small MLP (a labelled graph) to fit ``sin(x)`` on ``[-pi, pi]``; the Monitor logs each epoch
   (train and validation loss, learning rate) and, with ``--serve``, shows the live dashboard.
2. Save a safetensors checkpoint (weights and optimizer state).
3. Build a fresh model, load the checkpoint into it, and check that its predictions match exactly.

    python examples/sine_wave/train.py --device cpu --epochs 60
    python examples/sine_wave/train.py --epochs 200 --serve        # open http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse
import math
import os
import time

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder
from flowgraph.monitor import Monitor


def make_model() -> fg.Graph:
    """1 -> 32 -> 32 -> 1 tanh MLP; tags give its checkpoint keys readable names (``hidden1.weight`` ...)."""
    return (FlowBuilder.from_(nn.Linear(1, 32)).tag("hidden1").through(nn.Tanh())
            .through(nn.Linear(32, 32)).tag("hidden2").through(nn.Tanh())
            .through(nn.Linear(32, 1)).tag("out")
            .label("sine").build())


def train(epochs: int = 60, device: str = "cpu", serve: bool = False, port: int = 3000, hold: bool = False,
          workdir: str | None = None, verbose: bool = True) -> dict:
    """Train, checkpoint, reload; returns losses, the checkpoint path and the reload's largest difference.

    ``serve`` starts the dashboard on ``port`` (0: a free one); ``hold`` then keeps it up after training
    until Ctrl-C.
    """
    workdir = workdir or os.path.join("runs", "sine_wave")  # outputs go to a run folder, never the sources
    os.makedirs(workdir, exist_ok=True)
    fg.manual_seed(0)
    x = (fg.rand(512, 1, device=device) * 2 - 1) * math.pi
    y = x.sin()
    x_val = fg.linspace(-math.pi, math.pi, 101, device=device).reshape(-1, 1)
    y_val = x_val.sin()

    model = make_model().to(device)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    sched = optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=5)
    with Monitor(total_epochs=epochs, quiet=not verbose, progress_bar=False,
                 report_path=os.path.join(workdir, "report.html")) as mon:
        url = mon.serve(port=port) if serve else None
        for epoch in range(epochs):
            start = time.perf_counter()
            model.train()
            perm = fg.randperm(512, device=device)
            for i in range(0, 512, 64):
                idx = perm[i:i + 64]
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                model.record("loss", loss)
            model.eval()
            with fg.no_grad():
                val_loss = nn.functional.mse_loss(model(x_val), y_val)
            model.record("val_loss", val_loss)
            model.flush()
            sched.step(model.latest_metrics()["val_loss"])
            mon.log(epoch, time.perf_counter() - start, model, extra={"lr": opt.param_groups[0]["lr"]})
        if serve and hold:
            mon.finish(keep_serving=True)                 # the dashboard shows the finished run
            print(f"dashboard still at {mon.url}; press Ctrl-C to stop")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass

    checkpoint = os.path.join(workdir, "sine.safetensors")
    model.save_checkpoint(checkpoint, optimizer=opt)

    fresh = make_model().to(device)
    fresh_opt = optim.Adam(fresh.parameters(), lr=1e-2)
    report = fresh.load_checkpoint(checkpoint, optimizer=fresh_opt)
    fresh.eval()
    with fg.no_grad():
        expected, got = model(x_val), fresh(x_val)
    max_diff = (expected - got).abs().max().item()
    if verbose:
        print(f"checkpoint {checkpoint}: {report}; largest prediction difference after reload {max_diff}")
        for v in (-math.pi / 2, 0.0, math.pi / 2):
            with fg.no_grad():
                pred = fresh(fg.tensor([[v]], device=device)).item()
            print(f"  sin({v:+.3f}) = {math.sin(v):+.4f}, model {pred:+.4f}")
    history = model.history("val_loss")
    return {"first_loss": history[0], "final_loss": history[-1], "train_loss": model.latest_metrics()["loss"],
            "checkpoint": checkpoint, "max_diff": max_diff, "loaded": len(report.loaded),
            "epochs_logged": len(mon.history), "report": os.path.join(workdir, "report.html"),
            "optimizer_steps": fresh_opt.state_dict()["state"][0]["step"], "url": url}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda[:N] or opencl[:N] (default: cpu)")
    parser.add_argument("--epochs", type=int, default=60, help="training epochs (default: 60)")
    parser.add_argument("--serve", action="store_true", help="serve the live dashboard (and keep it up at the end)")
    parser.add_argument("--port", type=int, default=3000, help="dashboard port with --serve (default: 3000)")
    parser.add_argument("--workdir", default=None,
                        help="where to write the checkpoint and report (default: runs/sine_wave)")
    args = parser.parse_args()
    train(epochs=args.epochs, device=args.device, serve=args.serve, port=args.port, hold=args.serve,
          workdir=args.workdir)


if __name__ == "__main__":
    main()
