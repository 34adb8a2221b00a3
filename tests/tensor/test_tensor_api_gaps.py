"""type_as, is_contiguous, triu_/tril_, bernoulli_, unique and var_mean against torch (issue #18)."""

import numpy as np
import pytest
import torch

import flowgraph as fg


def _t(a, device, **kwargs):
    return fg.tensor(a, device=device, **kwargs)


def test_type_as_casts_and_moves(device):
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    other = _t(np.zeros(1, dtype=np.int64), device)
    out = fg.tensor(a).type_as(other)
    ref = torch.tensor(a).type_as(torch.zeros(1, dtype=torch.int64))
    assert out.device == other.device and out.dtype == fg.int64
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    same = _t(a, device)
    assert same.type_as(_t(np.zeros(1, dtype=np.float32), device)) is same  # no-op when already that type


def test_type_as_gradient(device):
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    t = _t(a, device).requires_grad_()
    (t.type_as(_t(np.zeros(1), device, dtype=fg.float64)) * 3).sum().backward()
    tt = torch.tensor(a, requires_grad=True)
    (tt.type_as(torch.zeros(1, dtype=torch.float64)) * 3).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy())


def test_type_as_rejects_a_dtype(device):
    with pytest.raises(fg.FlowError, match="other must be a Tensor"):
        _t([1.0], device).type_as(fg.float64)


def test_is_contiguous_matches_torch(device):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t, tt = _t(a, device), torch.tensor(a)
    cases = [
        lambda x: x, lambda x: x.transpose(0, 2), lambda x: x.permute(1, 0, 2), lambda x: x[1:],
        lambda x: x[:, :, 1:3], lambda x: x.transpose(0, 2).contiguous(), lambda x: x[0:1].expand(4, 3, 4),
        lambda x: x * 2, lambda x: x.reshape(6, 4), lambda x: x[0, 0, 0],
    ]
    for i, f in enumerate(cases):
        assert f(t).is_contiguous() == f(tt).is_contiguous(), f"case {i}"


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_triu_tril_in_place(device, k):
    a = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    for name in ("triu_", "tril_"):
        t, tt = _t(a, device), torch.tensor(a)
        assert getattr(t, name)(k) is t
        getattr(tt, name)(k)
        np.testing.assert_array_equal(t.numpy(), tt.numpy())


def test_triu_tril_in_place_gradients(device):
    a = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    x = _t(a, device).requires_grad_()
    y = x * 2.0
    y.triu_(1)
    y.tril_(2)
    (y * _t(w, device)).sum().backward()
    xt = torch.tensor(a, requires_grad=True)
    yt = xt * 2.0
    yt.triu_(1)
    yt.tril_(2)
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy())


def test_bernoulli_fills_with_probability_p(device):
    fg.manual_seed(0)
    t = fg.full((200, 100), 7.0, device=device)
    assert t.bernoulli_(0.3) is t
    v = t.numpy()
    assert set(np.unique(v)) <= {0.0, 1.0}
    assert abs(v.mean() - 0.3) < 0.02  # 20000 draws: standard error 0.0032
    p = np.linspace(0.0, 1.0, 5, dtype=np.float32)
    d = fg.zeros(4000, 5, device=device).bernoulli_(_t(p, device)).numpy()
    np.testing.assert_allclose(d.mean(0), p, atol=0.03)
    assert d[:, 0].sum() == 0 and d[:, -1].sum() == 4000
    ints = fg.zeros(1000, dtype=fg.int64, device=device).bernoulli_()
    assert ints.dtype == fg.int64 and 400 < ints.numpy().sum() < 600


def test_bernoulli_is_seeded(device):
    fg.manual_seed(5)
    a = fg.zeros(64, device=device).bernoulli_(0.5).numpy()
    fg.manual_seed(5)
    b = fg.zeros(64, device=device).bernoulli_(0.5).numpy()
    np.testing.assert_array_equal(a, b)


def test_bernoulli_rejects_bad_p(device):
    with pytest.raises(fg.FlowError, match=r"p must be a probability in \[0, 1\]"):
        fg.zeros(3, device=device).bernoulli_(1.5)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_unique_matches_torch(device, dtype):
    a = np.random.default_rng(4).integers(-3, 4, (5, 6)).astype(dtype)
    t, tt = _t(a, device), torch.tensor(a)
    out = fg.unique(t)
    assert out.device == t.device and out.dtype == t.dtype
    np.testing.assert_array_equal(out.numpy(), torch.unique(tt).numpy())
    v, inv, cnt = t.unique(return_inverse=True, return_counts=True)
    tv, tinv, tcnt = tt.unique(return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(inv.numpy(), tinv.numpy())
    np.testing.assert_array_equal(cnt.numpy(), tcnt.numpy())
    assert inv.dtype == fg.int64 and inv.shape == t.shape and cnt.device == t.device
    _, c2 = fg.unique(t, sorted=False, return_counts=True)
    np.testing.assert_array_equal(c2.numpy(), tcnt.numpy())


def test_unique_rejects_dim(device):
    with pytest.raises(fg.FlowError, match="dim=0"):
        fg.unique(_t([1, 2, 2], device), dim=0)


@pytest.mark.parametrize(("dim", "correction", "keepdim"), [(None, 1, False), (1, 0, True), ((0, 2), 1, False)])
def test_var_mean_matches_torch(device, dim, correction, keepdim):
    a = np.random.default_rng(5).standard_normal((3, 4, 5)).astype(np.float32)
    t = _t(a, device).requires_grad_()
    v, m = fg.var_mean(t, dim, correction=correction, keepdim=keepdim)
    tt = torch.tensor(a, requires_grad=True)
    tv, tm = torch.var_mean(tt, dim, correction=correction, keepdim=keepdim)
    assert v.shape == tuple(tv.shape) and m.shape == tuple(tm.shape)
    np.testing.assert_allclose(v.detach().numpy(), tv.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.detach().numpy(), tm.detach().numpy(), rtol=1e-5, atol=1e-6)
    (v.sum() * 2 + (m * m).sum()).backward()
    (tv.sum() * 2 + (tm * tm).sum()).backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_is_contiguous_inside_jit(device):
    @fg.jit
    def step(x):
        y = x.t()
        return y * 2 if y.is_contiguous() else y + 1

    x = _t(np.arange(6, dtype=np.float32).reshape(2, 3), device)
    for _ in range(3):  # recorded, then replayed
        np.testing.assert_array_equal(step(x).numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T + 1)
