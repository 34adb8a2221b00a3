"""An eager step's graph holds no closure made per call for its common ops: the backward of a Linear,
LayerNorm, BatchNorm, convolution, block max pooling, GRU cell, add, sub, mul or reshape is one function
shared by every call with the same flags and layout. A closure per call is a function, a tuple and cells that
Python's cyclic collector tracks while the graph lives, and a graph alive at a collection of the middle
generation moves to the oldest, whose full collections take 80-110 ms once torch and CuPy are loaded
(docs/cuda.md). The gradients themselves are checked against torch elsewhere; here, that sharing keeps them
right when flags differ between calls."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn


def _node(t):
    assert t.grad_fn is not None
    return t.grad_fn


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(4, 3),
    lambda: nn.LayerNorm(4),
    lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.MaxPool2d(2)),
    lambda: nn.GRUCell(4, 4),
], ids=["linear", "layer_norm", "conv_bn_pool", "gru_cell"])
def test_backward_function_is_shared_between_calls(device, make):
    fg.manual_seed(0)
    m = make().to(device)
    shape = (2, 2, 4, 4) if isinstance(m, nn.Sequential) else (2, 4)
    x1 = fg.randn(*shape, device=device, requires_grad=True)
    x2 = fg.randn(*shape, device=device, requires_grad=True)
    y1, y2 = m(x1), m(x2)
    assert _node(y1).backward is _node(y2).backward
    if isinstance(m, nn.Sequential):  # every node on the way down
        a, b = _node(y1), _node(y2)
        while a.edges and a.edges[0] is not None and not isinstance(a.edges[0], tuple) and a.edges[0].backward:
            a, b = a.edges[0], b.edges[0]
            assert a.backward is b.backward, a.name


@pytest.mark.parametrize("op", ["add", "sub", "mul", "mul_scalar", "reshape", "permute"])
def test_elementwise_and_shape_backwards_are_shared(device, op):
    a1, b1, a2, b2 = (fg.randn(3, 1, device=device, requires_grad=True) for _ in range(4))
    f = {"add": lambda a, b: a + b.reshape(1, 3), "sub": lambda a, b: a - b.reshape(1, 3),
         "mul": lambda a, b: a * b.reshape(1, 3), "mul_scalar": lambda a, b: a * 0.5,
         "reshape": lambda a, b: a.reshape(1, 3), "permute": lambda a, b: a.permute(1, 0)}[op]
    assert _node(f(a1, b1)).backward is _node(f(a2, b2)).backward


def test_scalar_products_keep_the_scalars_type(device):
    """``x * 2`` and ``x * 2.0`` (equal keys for a plain cache) get their own backwards."""
    x = fg.randn(3, device=device, requires_grad=True)
    assert _node(x * 2).backward is not _node(x * 2.0).backward
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), np.full(3, 2.0, np.float32))


def test_shared_backward_keeps_each_calls_flags(device):
    """Two linear calls in one graph, one with a frozen weight and one without an input gradient: the
    shared backwards are picked by flags, so each call's gradients are the ones torch gives."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w1, w2, x = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 3), (2, 4)))
    l1, l2 = nn.Linear(4, 3).to(device), nn.Linear(3, 4, bias=False).to(device)
    l1.weight.data = fg.tensor(w1, device=device)
    l2.weight.data = fg.tensor(w2, device=device)
    l1.weight.requires_grad_(False)
    xf = fg.tensor(x, device=device, requires_grad=True)
    l2(l1(xf)).sum().backward()
    tw1, tw2 = torch.tensor(w1), torch.tensor(w2, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tb1 = torch.tensor(l1.bias.detach().cpu().numpy(), requires_grad=True)
    (torch.nn.functional.linear(torch.nn.functional.linear(tx, tw1, tb1), tw2)).sum().backward()
    assert l1.weight.grad is None
    np.testing.assert_allclose(l1.bias.grad.cpu().numpy(), tb1.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l2.weight.grad.cpu().numpy(), tw2.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xf.grad.cpu().numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
