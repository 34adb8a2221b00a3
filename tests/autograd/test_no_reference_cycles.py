"""A training step leaves no reference cycles behind that hold device arrays.

Python frees an object at once when its last reference goes, unless it sits in a reference cycle: then it
waits for the cyclic garbage collector, which runs on allocation counts, not bytes. A cycle holding arrays
kept a whole step's activations alive into the next step (a self-calling closure in the CUDA backend's tree
walk kept ~1 GB of convnet's forward between steps, doubling its training peak). This runs steps with the
collector off and checks that collecting afterwards finds no array in the garbage."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim


def _arrays_in_garbage(fn) -> list[str]:
    """Run ``fn`` with the cyclic collector off; the type names of array-like objects a collection then finds."""
    gc.collect()
    gc.disable()
    try:
        fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(0)
        gc.enable()
    found = [type(o).__name__ for o in gc.garbage
             if type(o).__name__ in ("ndarray", "LazyArray", "CLArray", "Tensor", "Parameter", "MemoryPointer")]
    gc.garbage.clear()
    return found


def _model():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 2))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_training_steps_leave_no_array_cycles(device, jit):
    fg.manual_seed(0)
    model = _model().to(device)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), device=device)
    y = fg.tensor(rng.standard_normal((2, 2)).astype(np.float32), device=device)

    def step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = fg.jit(step) if jit else step

    def steps():
        for _ in range(3):
            run(x, y).item()

    steps()  # first calls: kernels compiled, the jit recording made
    assert _arrays_in_garbage(steps) == []
