"""tril/triu/diagonal/diag/trace, sort/argsort/topk, isclose/allclose/equal, nan_to_num, .T/.mT against torch."""

import numpy as np
import pytest
import torch

import flowgraph as fg


def _t(a, device):
    return fg.tensor(a, device=device)


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
def test_triangles_and_diagonals(device, k):
    a = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(np.float32)
    t, tt = _t(a, device), torch.tensor(a)
    np.testing.assert_array_equal(t.tril(k).numpy(), tt.tril(k).numpy())
    np.testing.assert_array_equal(t.triu(k).numpy(), tt.triu(k).numpy())
    np.testing.assert_array_equal(t.diagonal(k, 1, 2).numpy(), tt.diagonal(k, 1, 2).numpy())
    v = a[0, 0]
    np.testing.assert_array_equal(fg.diag(_t(v, device), k).numpy(), torch.diag(torch.tensor(v), k).numpy())
    np.testing.assert_array_equal(fg.diag(_t(a[0], device), k).numpy(), torch.diag(tt[0], k).numpy())


def test_trace_and_triangle_gradients(device):
    a = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    t = _t(a, device).requires_grad_()
    (t.tril(-1).sum() + t.trace()).backward()
    tt = torch.tensor(a, requires_grad=True)
    (tt.tril(-1).sum() + tt.trace()).backward()
    np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())


@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort_topk(device, descending):
    a = np.random.default_rng(2).integers(0, 5, (3, 7)).astype(np.float32)  # ties: stable order matters
    t, tt = _t(a, device), torch.tensor(a)
    v, i = t.sort(dim=1, descending=descending)
    tv, ti = tt.sort(dim=1, descending=descending, stable=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_array_equal(t.argsort(0, descending=descending).numpy(),
                                  tt.argsort(dim=0, descending=descending, stable=True).numpy())
    v, i = t.topk(3, dim=1, largest=not descending)
    tv, _ = tt.topk(3, dim=1, largest=not descending)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())


def test_sort_values_carry_gradients(device):
    a = np.array([3.0, 1.0, 2.0], np.float32)
    t = _t(a, device).requires_grad_()
    v, _ = t.sort()
    (v * fg.tensor([1.0, 10.0, 100.0], device=device)).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [100.0, 1.0, 10.0])


def test_closeness_and_nan_to_num(device):
    a = _t(np.array([1.0, 2.0, np.nan], np.float32), device)
    b = _t(np.array([1.0 + 1e-7, 2.1, np.nan], np.float32), device)
    assert a.isclose(b).tolist() == [True, False, False]
    assert a.isclose(b, equal_nan=True).tolist() == [True, False, True]
    assert not a.allclose(b) and fg.equal(a[:2], a[:2])
    x = _t(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32), device)
    np.testing.assert_array_equal(x.nan_to_num().numpy(), torch.tensor(x.numpy()).nan_to_num().numpy())


def test_transpose_properties_and_inference_mode(device):
    t = fg.randn(2, 3, 4, device=device)
    assert t.T.shape == (4, 3, 2) and t.mT.shape == (2, 4, 3)
    w = fg.randn(3, requires_grad=True, device=device)
    with fg.inference_mode():
        assert not (w * 2).requires_grad
    assert (w * 2).requires_grad
