"""Small modules and helpers shared by the builder tests."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn


class Scale(nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


class AddConst(nn.Module):
    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x):
        return x + self.c


class Tanh(nn.Module):
    def forward(self, x):
        return x.tanh()


class Dense(nn.Module):
    """tanh(Linear(x))."""

    def __init__(self, d_in: int, d_out: int, device="cpu", dtype=None):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out, device=device, dtype=dtype)

    def forward(self, x):
        return self.lin(x).tanh()


class WithRef(nn.Module):
    """``x + w * <ref>`` for a ref passed by keyword (name chosen at construction)."""

    def __init__(self, w: float = 1.0):
        super().__init__()
        self.w = w

    def forward(self, x, h):
        return x + self.w * h


class Mix(nn.Module):
    """``lin(x) + ctx`` taking the ref named ``ctx``."""

    def __init__(self, d: int, device="cpu", dtype=None):
        super().__init__()
        self.lin = nn.Linear(d, d, device=device, dtype=dtype)

    def forward(self, x, ctx):
        return self.lin(x) + ctx


class SignSelector(nn.Module):
    """Per row: 1 where the first feature is positive, else 0."""

    def forward(self, x):
        return (x[:, 0] > 0).to(fg.int64)


class ColumnSelector(nn.Module):
    """Per row: the integer in column 0 (rounded), an explicit per-row index."""

    def forward(self, x):
        return x[:, 0].detach().to(fg.int64)


def need_f64(device: str) -> None:
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64 support")


def close(a, b, tol: float = 1e-5) -> None:
    a = a.detach().numpy() if hasattr(a, "numpy") else np.asarray(a)
    b = b.detach().numpy() if hasattr(b, "numpy") else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
