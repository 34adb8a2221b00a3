"""In-place ops on graph tensors: right gradients where the op does not need the overwritten value,
a clear error where it does (never a silently wrong gradient)."""

import numpy as np
import pytest

import flowgraph as fg


def test_inplace_ops_that_do_not_need_the_old_value(device):
    a = fg.tensor([2.0, 4.0], requires_grad=True, device=device)
    h = a * 1
    h.mul_(3)          # needs only the scalar
    h.exp_()           # needs only its output
    h.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 3 * np.exp(3 * np.array([2.0, 4.0])), rtol=1e-6)


def test_inplace_op_that_needs_the_overwritten_value_keeps_it(device):
    a = fg.tensor([2.0, 4.0], requires_grad=True, device=device)
    h = a * 1
    h.log_()           # log's backward needs its input, which log_ overwrote: kept, as PyTorch's original_self
    h.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [0.5, 0.25], rtol=1e-6)


def test_a_saved_input_modified_later_raises(device):
    a = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = a * 1
    y = h * h          # saves h
    h.add_(1)
    with pytest.raises(fg.FlowError, match="modified in place"):
        y.sum().backward()
