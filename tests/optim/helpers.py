"""Shared helpers for the optim tests: identical parameters, data and loss in flowgraph and torch."""

from __future__ import annotations

import numpy as np

import flowgraph as fg

SHAPES = [(4, 3), (4,), (2, 4)]


def initial_values(seed: int = 0) -> list[np.ndarray]:
    """A few float32 parameter values, the same in both frameworks."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)


def fg_params(device: str, seed: int = 0) -> list[fg.Tensor]:
    return [fg.tensor(v, device=device, requires_grad=True) for v in initial_values(seed)]


def torch_params(seed: int = 0):
    import torch

    return [torch.tensor(v, requires_grad=True) for v in initial_values(seed)]


def loss_fn(params, x, y):
    """A small MLP loss with an L2 term; written once, it runs on flowgraph and torch tensors alike."""
    w1, b1, w2 = params
    h = (x @ w1.transpose(0, 1) + b1).tanh()
    out = h @ w2.transpose(0, 1)
    return ((out - y) ** 2).mean() + (w1 * w1).sum() * 0.01


class Pair:
    """The same model in both frameworks, stepped together."""

    def __init__(self, device: str, seed: int = 0, sign: float = 1.0):
        import torch

        self.sign = sign  # -1 with maximize=True: maximising -loss keeps the run bounded

        self.device = device
        self.fp = fg_params(device, seed)
        self.tp = torch_params(seed)
        x, y = data()
        self.fx, self.fy = fg.tensor(x, device=device), fg.tensor(y, device=device)
        self.tx, self.ty = torch.tensor(x), torch.tensor(y)

    def fg_backward(self, params=None):
        """Gradients of flowgraph's parameters, computed by torch from their current values.

        The optimizer tests compare update rules, so both sides take their gradients from the same code;
        flowgraph's own autograd is checked against torch in tests/autograd (and by test_fg_autograd_training_*).
        """
        import torch

        params = params or self.fp
        mirror = [torch.tensor(p.detach().numpy(), requires_grad=True) for p in params]
        loss = loss_fn(mirror, self.tx, self.ty) * self.sign
        loss.backward()
        for p, m in zip(params, mirror):
            if p.requires_grad:
                p.grad = fg.tensor(m.grad.numpy(), device=p.device)
        return loss

    def fg_autograd_backward(self):
        loss = loss_fn(self.fp, self.fx, self.fy) * self.sign
        loss.backward()
        return loss

    def torch_backward(self, params=None):
        if params is not None and params[0].dtype != self.tx.dtype:  # the float64 reference run
            loss = loss_fn(params, self.tx.to(params[0].dtype), self.ty.to(params[0].dtype)) * self.sign
            loss.backward()
            return loss
        loss = loss_fn(params or self.tp, self.tx, self.ty) * self.sign
        loss.backward()
        return loss


def assert_close_params(fp, tp, rtol: float, atol: float, where: str = "") -> None:
    for i, (a, b) in enumerate(zip(fp, tp)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"parameter {i} {where}")
