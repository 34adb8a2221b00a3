"""``fg.autograd.Function``: PyTorch's custom-op API on flowgraph's engine, checked against torch.autograd.Function."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flowgraph as fg


def _square(T):
    class Square(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x * x * scale

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x * ctx.scale, None

    return Square


def test_gradcheck_and_double_backward(device):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    x = fg.tensor([0.3, -1.2, 2.0], dtype=fg.float64, requires_grad=True, device=device)
    square = _square(fg)
    assert fg.gradcheck(lambda a: square.apply(a, 1.5), [x])
    (g,) = fg.autograd.grad(square.apply(x, 1.5).sum(), x, create_graph=True)
    g.sum().backward()  # d/dx of 3x is 3
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0, 3.0])


def test_matches_torch_function(device):
    values = [[1.0, -2.0], [0.5, 3.0]]
    x = fg.tensor(values, requires_grad=True, device=device)
    tx = torch.tensor(values, requires_grad=True)
    (_square(fg).apply(x, 2.0) * x).sum().backward()
    (_square(torch).apply(tx, 2.0) * tx).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)


def test_needs_input_grad_and_non_tensor_arguments(device):
    seen = {}

    class Mul(fg.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k):
            seen["needs"] = ctx.needs_input_grad
            ctx.save_for_backward(a, b)
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return (g * b if ctx.needs_input_grad[0] else None, g * a if ctx.needs_input_grad[1] else None, None)

    a = fg.tensor([2.0, 3.0], requires_grad=True, device=device)
    b = fg.tensor([5.0, 7.0], device=device)
    Mul.apply(a, b, 3).sum().backward()
    assert seen["needs"] == (True, False, False)
    assert a.grad.tolist() == [5.0, 7.0] and b.grad is None


def test_non_differentiable_output_and_materialized_grads(device):
    received = []

    class ValueAndIndex(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            idx = x.argmax(0, keepdim=True)
            ctx.mark_non_differentiable(idx)
            return x * 2.0, idx

        @staticmethod
        def backward(ctx, g, g_idx):
            received.append(g_idx)
            return g * 2.0

    x = fg.tensor([1.0, 4.0], requires_grad=True, device=device)
    y, idx = ValueAndIndex.apply(x)
    assert not idx.requires_grad and y.requires_grad
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    assert received[0] is not None and received[0].tolist() == [0]  # zeros, materialized


def test_unmaterialized_grads_are_none(device):
    received = []

    class Two(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 1.0, x * 2.0

        @staticmethod
        def backward(ctx, ga, gb):
            received.append((ga, gb))
            return ga

    x = fg.tensor([1.0], requires_grad=True, device=device)
    a, _ = Two.apply(x)
    a.sum().backward()
    assert received[0][1] is None


def test_saved_tensors_are_version_checked_and_freed(device):
    square = _square(fg)
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = x * 1.0
    y = square.apply(h, 1.0)
    h.add_(1.0)
    with pytest.raises(fg.FlowError, match="modified in place"):
        y.sum().backward()
    y = square.apply(x * 1.0, 1.0)
    y.sum().backward()
    with pytest.raises(fg.FlowError, match="second time|freed"):
        y.sum().backward()


def test_wrong_gradient_count_and_shape_raise(device):
    class Bad(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g, g

    class BadShape(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return g.reshape(1)

    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    with pytest.raises(fg.FlowError, match="returned 2 gradients"):
        Bad.apply(x).sum().backward()
    with pytest.raises(fg.FlowError, match="shape"):
        BadShape.apply(x).backward()


def test_forward_records_nothing_inside(device):
    class Inner(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            assert y.grad_fn is None
            return y

        @staticmethod
        def backward(ctx, g):
            return g

    x = fg.tensor([0.0], requires_grad=True, device=device)
    out = Inner.apply(x)
    assert out.grad_fn is not None and out.grad_fn.name == "Inner"
