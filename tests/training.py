"""A seeded MSE training loop shared by the tests that compare a step under ``fg.jit`` with the eager step."""

from __future__ import annotations

import numpy as np

import flowgraph as fg
import flowgraph.nn.functional as F


def train(device: str, make_model, make_opt, shapes: tuple, jitted: bool, steps: int = 5, seed: int = 0):
    """Train ``make_model()`` (moved to ``device``) with ``make_opt(parameters)`` for ``steps`` MSE steps on
    standard-normal batches of ``shapes = (input shape, target shape)``, eagerly or through ``fg.jit``.

    Returns ``(losses, parameters as host arrays, the step function)``; the same ``seed`` gives the same weights
    and batches, so an eager and a jitted run can be compared value for value."""
    fg.manual_seed(0)
    model = make_model().to(device)
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = fg.jit(step) if jitted else step
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        x, y = (fg.tensor(rng.standard_normal(s).astype(np.float32), device=device) for s in shapes)
        losses.append(run(x, y).item())
    return np.array(losses), [p.detach().numpy() for p in model.parameters()], run
