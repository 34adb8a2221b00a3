"""Bad input gets a flowgraph error (or PyTorch's exception type) naming what was wrong, on every backend."""

from __future__ import annotations

import pytest
import torch

import flowgraph as fg
from flowgraph import nn

CASES = [
    # (id, callable(device), expected exception, message pattern)
    ("int64 overflow", lambda d: fg.tensor([2**63], device=d), fg.FlowError, "does not fit"),
    ("int32 overflow", lambda d: fg.tensor([2**31], dtype=fg.int32, device=d), fg.FlowError, "does not fit"),
    ("int8 negative overflow", lambda d: fg.tensor([-129], dtype=fg.int8, device=d), fg.FlowError, "does not fit"),
    ("integer // 0", lambda d: (fg.tensor([5], device=d) // 0).tolist(), ZeroDivisionError, "division by zero"),
    ("integer % 0", lambda d: (fg.tensor([5], device=d) % 0).tolist(), ZeroDivisionError, "division by zero"),
    ("integer % zero tensor", lambda d: (fg.tensor([5, 3], device=d) % fg.tensor([2, 0], device=d)).tolist(),
     ZeroDivisionError, "division by zero"),
    ("embedding -1", lambda d: nn.Embedding(4, 2).to(d)(fg.tensor([-1], device=d)).sum().item(), IndexError,
     "out of range"),
    ("embedding past the end", lambda d: nn.Embedding(4, 2).to(d)(fg.tensor([4], device=d)).sum().item(),
     IndexError, "out of range"),
    ("gather past the end", lambda d: fg.zeros(3, device=d).gather(0, fg.tensor([3], device=d)).tolist(),
     IndexError, "out of range"),
    ("advanced index past the end", lambda d: fg.zeros(3, device=d)[fg.tensor([0, 3], device=d)].tolist(),
     IndexError, "out of range"),
    ("int index past the end", lambda d: fg.zeros(3, device=d)[3], IndexError, "out of bounds"),
    ("in-place on a view of a leaf", lambda d: fg.ones(4, requires_grad=True, device=d)[0:2].mul_(2),
     fg.FlowError, "view of a leaf"),
    ("in-place on a leaf", lambda d: fg.ones(4, requires_grad=True, device=d).add_(1), fg.FlowError, "leaf"),
    ("in-place on an expanded tensor", lambda d: (fg.ones(1, 2, device=d) * 1.0).expand(3, 2).add_(1),
     fg.FlowError, "expanded"),
    ("iterate a 0-d tensor", lambda d: list(fg.tensor(1.0, device=d)), TypeError, "0-d"),
    ("torch tensor into a module", lambda d: nn.Linear(3, 2).to(d)(torch.randn(2, 3)), fg.FlowError,
     "torch.Tensor"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises(device, case):
    _, fn, error, pattern = case
    with pytest.raises(error, match=pattern):
        fn(device)


def test_opencl_refuses_an_array_larger_than_the_device_allows():
    if "opencl:0" not in fg.available_devices():
        pytest.skip("no OpenCL device")
    with pytest.raises(fg.BackendError, match="MAX_MEM_ALLOC_SIZE"):
        fg.zeros(10**12, device="opencl")


@pytest.mark.parametrize("make", [
    lambda d: fg.zeros(0, 3, requires_grad=True, device=d),
    lambda d: fg.zeros(2, 0, 3, requires_grad=True, device=d),
])
def test_empty_prod_backward(device, make):
    x = make(device)
    x.prod(1).sum().backward()
    assert x.grad.shape == x.shape


def test_empty_matmul_and_linear(device):
    out = fg.zeros(2, 3, 0, device=device) @ fg.zeros(0, 4, device=device)
    assert out.shape == (2, 3, 4) and float(out.abs().sum()) == 0.0
    assert nn.Linear(0, 4).to(device)(fg.zeros(2, 0, device=device)).shape == (2, 4)
