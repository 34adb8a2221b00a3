"""Hessian-vector products against torch (float64): losses (the root's gradient is the constant 1) and layers under
a linear head (the gradient reaching them is a constant), with respect to the input and every parameter. A
backward that picked its non-differentiable path from ``g.requires_grad`` instead of the grad mode gave wrong
second derivatives exactly here (Linear, the RNN cells, split)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import functional as F

TF = torch.nn.functional
RNG = np.random.default_rng(0)
T_CLS, T_PROB, T_REAL = RNG.integers(0, 5, 4), RNG.random((4, 5)), RNG.standard_normal((4, 5))

# name -> (flowgraph loss of x, torch loss of x), x of shape (4, 5)
LOSSES = {
    "mse": (lambda x, d: F.mse_loss(x, _f(T_REAL, d)), lambda x: TF.mse_loss(x, torch.tensor(T_REAL))),
    "cross_entropy": (lambda x, d: F.cross_entropy(x, fg.tensor(T_CLS, device=d), label_smoothing=0.1),
                      lambda x: TF.cross_entropy(x, torch.tensor(T_CLS), label_smoothing=0.1)),
    "nll": (lambda x, d: F.nll_loss(F.log_softmax(x, -1), fg.tensor(T_CLS, device=d)),
            lambda x: TF.nll_loss(TF.log_softmax(x, -1), torch.tensor(T_CLS))),
    "bce_with_logits": (lambda x, d: F.binary_cross_entropy_with_logits(x, _f(T_PROB, d)),
                        lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(T_PROB))),
    "huber": (lambda x, d: F.huber_loss(x * x, _f(T_REAL, d)), lambda x: TF.huber_loss(x * x, torch.tensor(T_REAL))),
    "kl_div": (lambda x, d: F.kl_div(F.log_softmax(x, -1), _f(T_PROB, d), reduction="batchmean"),
               lambda x: TF.kl_div(TF.log_softmax(x, -1), torch.tensor(T_PROB), reduction="batchmean")),
    "sort_gather": (lambda x, d: (x.sort(1)[0] * _f(T_REAL, d)).sum()
                    + (x.gather(1, fg.tensor(T_CLS[:, None], device=d)) ** 3).sum(),
                    lambda x: (x.sort(1)[0] * torch.tensor(T_REAL)).sum()
                    + (x.gather(1, torch.tensor(T_CLS[:, None])) ** 3).sum()),
}  # fmt: skip

# name -> (flowgraph module, torch module, input shape, call)
LAYERS = {
    "linear_3d": (lambda: nn.Linear(4, 3), lambda: torch.nn.Linear(4, 3), (2, 3, 4), lambda m, x: m(x)),
    "multihead_attention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                            lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True), (2, 3, 8),
                            lambda m, x: m(x, x, x)[0]),
    "bilinear": (lambda: nn.Bilinear(4, 4, 3), lambda: torch.nn.Bilinear(4, 4, 3), (5, 4), lambda m, x: m(x, x)),
    "conv1d": (lambda: nn.Conv1d(2, 3, 3, padding=1), lambda: torch.nn.Conv1d(2, 3, 3, padding=1), (2, 2, 5),
               lambda m, x: m(x)),
    "lstm": (lambda: nn.LSTM(3, 4, batch_first=True), lambda: torch.nn.LSTM(3, 4, batch_first=True), (2, 3, 3),
             lambda m, x: m(x)[0]),
    "gru_cell": (lambda: nn.GRUCell(3, 4), lambda: torch.nn.GRUCell(3, 4), (2, 3), lambda m, x: m(x)),
    "layer_norm": (lambda: nn.LayerNorm(4), lambda: torch.nn.LayerNorm(4), (3, 4), lambda m, x: m(x)),
    "batch_norm": (lambda: nn.BatchNorm1d(4), lambda: torch.nn.BatchNorm1d(4), (5, 4), lambda m, x: m(x)),
}  # fmt: skip


def _f(a, device):
    return fg.tensor(a, dtype=fg.float64, device=device)


def _skip_without_float64(device):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")


def _hvp(mod, loss, params, vs, make):
    grads = mod.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    total = sum((g * make(v)).sum() for g, v in zip(grads, vs) if g is not None)
    if not getattr(total, "requires_grad", False):
        return [np.zeros(tuple(p.shape)) for p in params]
    hv = mod.autograd.grad(total, params, allow_unused=True)
    return [np.zeros(tuple(p.shape)) if h is None else h.detach().cpu().numpy() if mod is torch else h.numpy()
            for h, p in zip(hv, params)]


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_hessian_vector_matches_torch(device, name):
    _skip_without_float64(device)
    f, tf = LOSSES[name]
    x0, v0 = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    x = fg.tensor(x0, dtype=fg.float64, device=device, requires_grad=True)
    tx = torch.tensor(x0, requires_grad=True)
    (mine,) = _hvp(fg, f(x, device), [x], [v0], lambda v: _f(v, device))
    (theirs,) = _hvp(torch, tf(tx), [tx], [v0], torch.tensor)
    np.testing.assert_allclose(mine, theirs, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_hessian_vector_under_a_linear_head_matches_torch(device, name):
    _skip_without_float64(device)
    make_fg, make_torch, shape, call = LAYERS[name]
    tm = make_torch().double()
    fm = make_fg().double()
    fm.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    fm.to(device)
    rng = np.random.default_rng(len(name))
    x0 = rng.standard_normal(shape)
    x = fg.tensor(x0, dtype=fg.float64, device=device, requires_grad=True)
    tx = torch.tensor(x0, requires_grad=True)
    fy, ty = call(fm, x), call(tm, tx)
    c0 = rng.standard_normal(tuple(ty.shape))
    params, t_params = [x, *fm.parameters()], [tx, *tm.parameters()]
    vs = [rng.standard_normal(tuple(p.shape)) for p in t_params]
    mine = _hvp(fg, (fy * _f(c0, device)).sum(), params, vs, lambda v: _f(v, device))
    theirs = _hvp(torch, (ty * torch.tensor(c0)).sum(), t_params, vs, torch.tensor)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
