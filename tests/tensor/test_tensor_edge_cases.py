"""Edge cases against torch: 0-d tensors, empty dims, misuse errors, and gradients at kinks and ties."""

from __future__ import annotations

import pytest
import torch

import flowgraph as fg

from .strategies import close, skip_unless_dtypes


@pytest.mark.parametrize("op", ["[None]", "[...]", "[()]", "flip", "squeeze", "unsqueeze", "softmax", "cumsum",
                                "norm", "transpose", "repeat", "roll", "expand", "max0", "argmax0"])
def test_zero_dim_ops(device, op):
    fns = {
        "[None]": lambda x: x[None], "[...]": lambda x: x[...], "[()]": lambda x: x[()], "flip": lambda x: x.flip(0),
        "squeeze": lambda x: x.squeeze(0), "unsqueeze": lambda x: x.unsqueeze(0), "softmax": lambda x: x.softmax(0),
        "cumsum": lambda x: x.cumsum(0), "norm": lambda x: x.norm(), "transpose": lambda x: x.transpose(0, -1),
        "repeat": lambda x: x.repeat(2), "roll": lambda x: x.roll(1), "expand": lambda x: x.expand(2, 2),
        "max0": lambda x: x.max(0).values, "argmax0": lambda x: x.argmax(0),
    }
    close(fns[op](fg.tensor(3.0, device=device)), fns[op](torch.tensor(3.0)))


def test_zero_dim_setitem(device):
    x = fg.tensor(3.0, device=device)
    x[()] = 5.0
    assert x.item() == 5.0 and x.shape == ()


def test_empty_dim_tuple_reduces_everything(device):
    x = fg.ones(2, 3, device=device)
    close(x.sum(()), torch.ones(2, 3).sum(()))
    close(x.mean(()), torch.ones(2, 3).mean(()))
    close(x.amax(()), torch.ones(2, 3).amax(()))


def test_misuse_errors(device):
    with pytest.raises(fg.FlowError, match="negative integer powers"):
        fg.tensor([2], device=device) ** -1
    if device == "cpu":  # a tensor exponent is only checked where the values are at hand
        with pytest.raises(fg.FlowError, match="negative integer powers"):
            fg.tensor([2], device=device) ** fg.tensor([-1], device=device)
    with pytest.raises(fg.FlowError, match="bool"):
        -fg.tensor([True], device=device)
    with pytest.raises(fg.FlowError, match="bool"):
        fg.tensor([True], device=device) - fg.tensor([False], device=device)
    with pytest.raises(fg.FlowError, match="float"):
        fg.tensor([True], device=device).mean()
    with pytest.raises(fg.FlowError, match="expected at least one Tensor"):
        fg.add(1, 2)


def test_leaf_grad_takes_the_leaf_dtype(device):
    skip_unless_dtypes(device, "float16")
    a = fg.ones(2, dtype=fg.float16, requires_grad=True, device=device)
    b = fg.ones(2, requires_grad=True, device=device)
    (a * b).sum().backward()
    assert a.grad.dtype is fg.float16 and b.grad.dtype is fg.float32


def _grad(fn, values, device, lib):
    if lib == "fg":
        x = fg.tensor(values, requires_grad=True, device=device)
    else:
        x = torch.tensor(values, requires_grad=True)
    fn(x).sum().backward()
    return x.grad


@pytest.mark.parametrize("name,fn,values", [
    ("pow0", lambda x: x**0, [0.0, 1.0]),
    ("sqrt_at_0", lambda x: x.sqrt(), [0.0, 4.0]),
    ("norm_at_0", lambda x: x.norm(), [0.0, 0.0, 0.0]),
    ("abs_at_0", lambda x: x.abs(), [0.0, -1.0, 2.0]),
    ("relu_at_0", lambda x: x.relu(), [0.0, -1.0, 2.0]),
    ("clamp_edges", lambda x: x.clamp(0.0, 1.0), [0.0, 1.0, 0.5, 2.0]),
    ("max_ties", lambda x: x.max(), [1.0, 3.0, 3.0]),
    ("amax_ties", lambda x: x.reshape(1, 3).amax(1), [1.0, 3.0, 3.0]),
    ("max_dim_ties", lambda x: x.reshape(1, 3).max(1).values, [1.0, 3.0, 3.0]),
    ("maximum_ties", lambda x: x.maximum(x.flip(0)), [1.0, 2.0, 1.0]),
    ("sign", lambda x: x.sign(), [0.0, -2.0, 2.0]),
    ("where_nan_branch", lambda x: (x > 0).float() * 0 + x.where(x > 0, x * 0), [1.0, -1.0]),
])
def test_gradients_at_kinks_and_ties_match_torch(device, name, fn, values):
    close(_grad(fn, values, device, "fg"), _grad(fn, values, device, "torch"))
