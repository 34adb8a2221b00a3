"""In-place ops against torch, version counters, and autograd's refusal to use a mutated saved tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flowgraph as fg

from .strategies import close, data, fgt, tt

# name -> (args as a function of (flowgraph?, device))
INPLACE = {
    "add_": lambda f, d: (fgt(data((3, 4), 9), d) if f else tt(data((3, 4), 9)),),
    "sub_": lambda f, d: (2.0,),
    "mul_": lambda f, d: (fgt(data((4,), 8), d) if f else tt(data((4,), 8)),),
    "div_": lambda f, d: (4.0,),
    "pow_": lambda f, d: (2,),
    "clamp_": lambda f, d: (-0.5, 0.5),
    "clamp_min_": lambda f, d: (0.0,),
    "clamp_max_": lambda f, d: (0.0,),
    "exp_": lambda f, d: (),
    "neg_": lambda f, d: (),
    "abs_": lambda f, d: (),
    "relu_": lambda f, d: (),
    "sigmoid_": lambda f, d: (),
    "tanh_": lambda f, d: (),
    "floor_": lambda f, d: (),
    "sign_": lambda f, d: (),
    "square_": lambda f, d: (),
    "zero_": lambda f, d: (),
    "fill_": lambda f, d: (1.25,),
    "copy_": lambda f, d: (fgt(data((4,), 7), d) if f else tt(data((4,), 7)),),
    "masked_fill_": lambda f, d: ((fgt(data((3, 4), 5) > 0, d) if f else tt(data((3, 4), 5) > 0)), 9.0),
    "lerp_": lambda f, d: ((fgt(data((3, 4), 4), d) if f else tt(data((3, 4), 4))), 0.25),
    "remainder_": lambda f, d: (0.7,),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_matches_torch(device, name):
    x = data((3, 4), 0)
    f, t = fgt(x, device), tt(x)
    storage = f._data
    v0 = f._version
    rf = getattr(f, name)(*INPLACE[name](True, device))
    rt = getattr(t, name)(*INPLACE[name](False, device))
    assert rf is f
    close(f, rt, rtol=1e-6)
    assert f._version > v0
    if device == "cpu":
        assert f._data is storage  # written into the same storage


def test_inplace_operators_and_views(device):
    x = fg.zeros(2, 3, device=device)
    row = x[0]
    x += 1.0
    x *= fg.tensor([1.0, 2.0, 3.0], device=device)
    x -= 0.5
    x /= 2.0
    close(x, (torch.ones(2, 3) * torch.tensor([1.0, 2.0, 3.0]) - 0.5) / 2.0)
    close(row, ((torch.ones(3) * torch.tensor([1.0, 2.0, 3.0]) - 0.5) / 2.0))
    xi = fg.zeros(3, dtype=fg.int64, device=device)
    xi += 2
    xi.mul_(3)
    assert xi.tolist() == [6, 6, 6] and xi.dtype is fg.int64
    xi.add_(fg.tensor([0.7, 0.7, 0.7], device=device))  # result cast back to the tensor's dtype
    assert xi.dtype is fg.int64
    y = fg.arange(6.0, device=device).reshape(2, 3)
    y.t().add_(1.0)
    close(y, torch.arange(6.0).reshape(2, 3) + 1)


def test_random_fills(device):
    fg.manual_seed(0)
    x = fg.zeros(1000, device=device)
    x.uniform_(-2.0, 2.0)
    h = x.numpy()
    assert h.min() >= -2 and h.max() < 2 and np.abs(h.mean()) < 0.2
    x.normal_(3.0, 0.5)
    assert abs(float(x.mean().item()) - 3.0) < 0.1 and abs(float(x.std().item()) - 0.5) < 0.1


def test_inplace_on_leaf_requiring_grad_is_an_error(device):
    w = fg.ones(3, requires_grad=True, device=device)
    with pytest.raises(fg.FlowError, match="leaf"):
        w.add_(1.0)
    with pytest.raises(fg.FlowError, match="leaf"):
        w[0] = 2.0
    with fg.no_grad():
        w.add_(1.0)
        w[0] = 5.0
    assert w.tolist() == [5.0, 2.0, 2.0] and w.requires_grad and w.is_leaf


@pytest.mark.parametrize("op", ["mul", "exp", "sigmoid", "tanh", "matmul", "pow", "div", "sqrt", "relu"])
def test_modified_saved_tensor_is_an_error(device, op):
    a = fg.tensor([[0.5, 1.5], [2.0, 0.25]], requires_grad=True, device=device)
    h = a * 1.0  # non-leaf, so it may be modified in place
    fns = {
        "mul": lambda t: t * t, "exp": lambda t: t.exp(), "sigmoid": lambda t: t.sigmoid(),
        "tanh": lambda t: t.tanh(), "matmul": lambda t: t @ t, "pow": lambda t: t**2, "div": lambda t: 1.0 / t,
        "sqrt": lambda t: t.sqrt(), "relu": lambda t: t.relu(),
    }
    y = fns[op](h)
    if op in ("exp", "sigmoid", "tanh", "sqrt", "relu"):
        y.add_(1.0)  # these save their output
    else:
        h.add_(1.0)  # these save their input
    with pytest.raises(fg.FlowError, match="modified in place"):
        y.sum().backward()


def test_inplace_on_nonleaf_keeps_gradients_right(device):
    a = fg.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    ta = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h, th = a * 2, ta * 2
    h.add_(a)
    th.add_(ta)
    h.mul_(3.0)
    th.mul_(3.0)
    h[1] = 0.0
    th[1] = 0.0
    (h * h).sum().backward()
    (th * th).sum().backward()
    close(a.grad, ta.grad)


def test_setitem_with_grad_value(device):
    a = fg.zeros(4, device=device)
    v = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    ta, tv = torch.zeros(4), torch.tensor([1.0, 2.0], requires_grad=True)
    a[1:3] = v
    ta[1:3] = tv
    (a * fg.tensor([1.0, 2.0, 3.0, 4.0], device=device)).sum().backward()
    (ta * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    close(v.grad, tv.grad)
    assert a.requires_grad and not a.is_leaf


def test_detach_shares_version(device):
    a = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = a * 1.0
    y = h * h
    d = h.detach()
    d.add_(1.0)  # writes through the shared storage: backward must notice
    with pytest.raises(fg.FlowError, match="modified in place"):
        y.sum().backward()


def test_copy_and_fill_overwrite_inf_and_nan(device):
    x = fg.tensor([float("inf"), float("nan"), 1.0], device=device)
    x.copy_(fg.tensor([1.0, 2.0, 3.0], device=device))
    assert x.tolist() == [1.0, 2.0, 3.0]
    w = fg.tensor([float("inf"), float("nan")], device=device, requires_grad=True)
    with fg.no_grad():
        w.copy_(fg.tensor([5.0, 6.0], device=device))
    assert w.tolist() == [5.0, 6.0]
    # recorded: the old values get a zero gradient, the source its gradient, and no NaN leaks into values
    a = fg.tensor([float("nan"), 1.0], device=device, requires_grad=True)
    b = a * 1
    src = fg.tensor([3.0, 4.0], device=device, requires_grad=True)
    b.copy_(src)
    (b * fg.tensor([1.0, 2.0], device=device)).sum().backward()
    assert b.tolist() == [3.0, 4.0] and a.grad.tolist() == [0.0, 0.0] and src.grad.tolist() == [1.0, 2.0]
    v = fg.tensor(7.0, device=device, requires_grad=True)
    c = fg.tensor([float("inf"), 0.0], device=device, requires_grad=True) * 1
    c.fill_(v)
    c.sum().backward()
    assert c.tolist() == [7.0, 7.0] and v.grad.item() == 2.0
