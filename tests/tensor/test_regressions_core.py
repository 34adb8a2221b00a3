"""Regression tests for the bugs found while rebuilding the op layer (issue: core v2)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn


def test_int_scalar_out_of_range_wraps_like_torch_on_every_backend(device):
    # CUDA's scalar conversion recursed forever here; NumPy raised a raw OverflowError; OpenCL wrapped
    a = fg.tensor([1, 2], dtype=fg.int8, device=device)
    assert (a + 1000).tolist() == (torch.tensor([1, 2], dtype=torch.int8) + 1000).tolist()
    b = fg.tensor([1, 2], dtype=fg.uint8, device=device)
    assert (b * 300).tolist() == (torch.tensor([1, 2], dtype=torch.uint8) * 300).tolist()


def test_set_grad_enabled_as_call_context_and_decorator():
    assert fg.is_grad_enabled()

    @fg.set_grad_enabled(False)
    def inner(x):
        return (x * 2).requires_grad

    assert fg.is_grad_enabled()  # decorating does not switch the mode
    x = fg.ones(2, requires_grad=True)
    assert inner(x) is False and fg.is_grad_enabled()
    with fg.set_grad_enabled(False):
        assert not fg.is_grad_enabled()
    assert fg.is_grad_enabled()
    fg.set_grad_enabled(False)
    assert not fg.is_grad_enabled()
    fg.set_grad_enabled(True)
    assert fg.is_grad_enabled()


def test_randint_positional_forms():
    assert fg.randint(10, (4,)).shape == (4,)
    assert fg.randint(2, 5, (2, 3)).shape == (2, 3)
    v = fg.randint(3, 7, (200,))
    assert 3 <= int(v.min()) and int(v.max()) < 7
    assert fg.randint(0, high=3, size=(2,)).shape == (2,)


def test_iteration_and_unpacking_stop(device):
    t = fg.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=device)
    rows = list(t)
    assert len(rows) == 3 and rows[2].tolist() == [5.0, 6.0]
    a, b, c = t
    assert b.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError):
        a, b = t
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(fg.IndexOutOfRangeError):
        t[-4]
    with pytest.raises(TypeError):
        iter(fg.tensor(1.0, device=device)).__next__()


def test_format_of_a_scalar_tensor(device):
    t = fg.tensor(3.14159, device=device)
    assert f"{t:.2f}" == "3.14"
    assert f"{t}" == repr(t)


def test_new_factories_take_varargs_and_tuples(device):
    x = fg.zeros(1, dtype=fg.float64, device=device)
    for size in [(2, 5), ((2, 5),)]:
        assert x.new_zeros(*size).shape == (2, 5)
        assert x.new_ones(*size).shape == (2, 5)
        assert x.new_empty(*size).shape == (2, 5)
    assert x.new_zeros(3).dtype is fg.float64
    assert x.new_full((2,), 7.0).tolist() == [7.0, 7.0]


def test_module_to_a_torch_device():
    m = nn.Linear(2, 2)
    assert m.to(torch.device("cpu")) is m
    assert fg.ones(2).to(torch.device("cpu")).device == "cpu"


def test_a_torch_tensor_input_gets_a_clear_error():
    with pytest.raises(fg.FlowError, match=r"torch\.Tensor.*from_dlpack"):
        nn.Linear(3, 2)(torch.randn(2, 3))
    with pytest.raises(fg.FlowError, match=r"torch\.Tensor"):
        nn.Conv2d(1, 1, 3)(torch.randn(1, 1, 3, 3))


def test_deepcopy_of_tensors_modules_and_state_dicts(device):
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to(device)
    snap = copy.deepcopy(m)
    assert isinstance(snap[0].weight, nn.Parameter) and snap[0].weight is not m[0].weight
    with fg.no_grad():
        m[0].weight.mul_(0.0)
    assert float(snap[0].weight.abs().sum()) > 0  # the snapshot has its own storage
    sd = copy.deepcopy(m.state_dict())
    assert set(sd) == set(m.state_dict())
    t = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    t.grad = fg.tensor([0.5, 0.5], device=device)
    t2 = copy.deepcopy(t)
    assert t2.requires_grad and t2.is_leaf and t2.grad.tolist() == [0.5, 0.5] and t2.device == t.device
    with pytest.raises(fg.FlowError, match="leaves"):
        copy.deepcopy(t * 2)
    back = pickle.loads(pickle.dumps(t.detach()))  # pickling for IPC works; files stay safetensors
    np.testing.assert_array_equal(back.numpy(), [1.0, 2.0])
