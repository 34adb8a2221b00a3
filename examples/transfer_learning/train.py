"""Transfer learning with the graph tree.

1. Train an encoder (a labelled graph) on task A and checkpoint it alone.
2. Build a bigger model around a fresh encoder, load the encoder checkpoint into it by path,
   freeze the encoder and fine-tune the new head on task B.
3. When the head's loss trend stalls, thaw the encoder by path and keep training with a smaller lr for it.

    python examples/transfer_learning/train.py --device cpu --epochs 40
"""

from __future__ import annotations

import argparse
import os

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder


def make_encoder() -> fg.Graph:
    """A two-layer encoder labelled "encoder", its hidden layer tagged "scan"."""
    return (FlowBuilder.from_(nn.Linear(16, 32)).tag("scan").through(nn.GELU())
            .through(nn.Linear(32, 32)).through(nn.GELU()).label("encoder").build())


def make_model() -> fg.Graph:
    """Phase B's model: a fresh encoder (loaded from phase A's checkpoint by path), an adapter, a classifier."""
    return (FlowBuilder.from_(make_encoder()).through(nn.Linear(32, 32)).tag("adapter").through(nn.GELU())
            .through(nn.Linear(32, 4)).tag("classifier").label("transfer").build())


def make_data(n: int, device: str, seed: int):
    """Inputs and two related targets: task A (sum of a projection) and task B (its sign pattern)."""
    fg.manual_seed(seed)
    x = fg.randn(n, 16, device=device)
    w = fg.randn(16, 4, device=device)
    z = (x @ w).tanh()
    return x, z, (z > 0).float() * 2 - 1 + 0.1 * z


def train(epochs: int = 40, device: str = "cpu", workdir: str | None = None, verbose: bool = True) -> dict:
    """Run both phases; returns the final losses and when the encoder was thawed."""
    workdir = workdir or os.path.join("runs", "transfer_learning")  # a run folder, never the sources
    os.makedirs(workdir, exist_ok=True)
    x, y_a, y_b = make_data(256, device, seed=0)

    # Phase A: the encoder with a temporary head learns task A.
    fg.manual_seed(1)
    encoder = make_encoder()
    pretrain = FlowBuilder.from_(encoder).through(nn.Linear(32, 4)).tag("head_a").build().to(device)
    opt = optim.Adam(pretrain.parameters(), lr=3e-3)
    for _ in range(epochs):
        loss = nn.functional.mse_loss(pretrain(x), y_a)
        opt.zero_grad()
        loss.backward()
        opt.step()
    pretrain_loss = loss.item()
    ckpt = os.path.join(workdir, "encoder_v1.safetensors")
    encoder.save_checkpoint(ckpt)
    if verbose:
        print(f"phase A: loss {loss.item():.4f}; encoder saved to {ckpt}")

    # Phase B: a bigger model around a fresh encoder; load the checkpoint by path; freeze; fine-tune.
    fg.manual_seed(2)
    model = make_model().to(device)
    report = model.load_subgraph_checkpoint("encoder", ckpt)
    model.freeze("encoder")
    opt = optim.Adam([{"params": model.parameters_at("adapter"), "lr": 3e-3},
                      {"params": model.parameters_at("classifier"), "lr": 3e-3}])
    thawed_at = None
    for epoch in range(epochs * 2):
        loss = nn.functional.mse_loss(model(x), y_b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.record("loss", loss)
        model.flush()
        if thawed_at is None and model.trend("loss").stalled(5, tol=0.01, relative=True):
            model.thaw("encoder")
            opt.add_param_group({"params": model.parameters_at("encoder"), "lr": 3e-4})
            thawed_at = epoch
            if verbose:
                print(f"epoch {epoch}: loss trend stalled -> thawed 'encoder' (lr 3e-4)")
    if verbose:
        print(f"phase B: loaded {len(report.loaded)} encoder tensors; final loss {loss.item():.4f}")
    return {"pretrain_loss": pretrain_loss, "final_loss": loss.item(), "thawed_at": thawed_at,
            "first_loss": model.history("loss")[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    train(args.epochs, args.device)


if __name__ == "__main__":
    main()
