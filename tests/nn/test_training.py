"""A small real training run: a conv net learns whether a bright square sits in the left or right half of an
8x8 image, with a plain SGD loop written here (``p -= lr * p.grad`` under ``fg.no_grad()``).

Threshold: the mean cross-entropy over the last 5 steps must fall below 0.1 (chance is ln 2 = 0.69) within
``STEPS`` (80) steps, and held-out accuracy must reach 95%. The run takes about 1.5 s on the CPU backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import functional as F

from ..conftest import DEVICE_PARAMS

LOSS_THRESHOLD = 0.1
ACCURACY_THRESHOLD = 0.95
STEPS = 80


def make_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` noisy 8x8 images with a bright 2x2 or 3x3 square; label 1 when it lies in the right half."""
    images = rng.normal(0.0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 2, n)
    for i, label in enumerate(labels):
        size = int(rng.integers(2, 4))
        row = int(rng.integers(0, 8 - size + 1))
        col = int(rng.integers(0, 4 - size + 1)) + 4 * int(label)
        images[i, 0, row : row + size, col : col + size] += 2.0
    return images, labels.astype(np.int64)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d((1, 2)),  # keeps left/right apart
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(16, 2),
    )


def cross_entropy(logits: fg.Tensor, labels: fg.Tensor) -> fg.Tensor:
    """Mean negative log-likelihood (written here: the loss family is tested elsewhere)."""
    return -F.log_softmax(logits, 1).gather(1, labels.unsqueeze(1)).mean()


# The CPU run takes ~1.5 s; on OpenCL (PoCL) 6-25 s (kernel compilation on a cold cache), so those runs are
# marked slow.
TRAINING_DEVICES = [
    pytest.param(*p.values, id=p.id, marks=[*p.marks, *([] if p.values[0] == "cpu" else [pytest.mark.slow])])
    for p in DEVICE_PARAMS
]


@pytest.mark.parametrize("device", TRAINING_DEVICES)
def test_conv_net_learns_left_or_right(device: str):
    fg.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_model().to(device)
    images, labels = make_images(512, rng)
    lr, batch = 0.1, 64
    losses = []
    for _ in range(STEPS):
        pick = rng.integers(0, len(images), batch)
        x = fg.tensor(images[pick], device=device)
        y = fg.tensor(labels[pick], device=device)
        loss = cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        with fg.no_grad():
            for p in model.parameters():
                p.sub_(lr * p.grad)
        losses.append(float(loss.item()))
    final = float(np.mean(losses[-5:]))
    assert losses[0] > 0.5, f"the task should start near chance, first loss {losses[0]:.3f}"
    assert final < LOSS_THRESHOLD, f"loss only fell to {final:.3f} (first {losses[0]:.3f})"

    model.eval()
    test_images, test_labels = make_images(256, np.random.default_rng(1))
    with fg.no_grad():
        predicted = model(fg.tensor(test_images, device=device)).argmax(1)
    accuracy = float((predicted.to("cpu").numpy() == test_labels).mean())
    assert accuracy >= ACCURACY_THRESHOLD, f"held-out accuracy {accuracy:.3f}"
