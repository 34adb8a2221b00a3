"""multinomial (statistics with a fixed seed, PyTorch's errors), addcmul/addcdiv (values and gradients against torch,
gradcheck), view_as/reshape_as, is_cpu/is_cuda."""

import itertools

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph.errors import FlowError, ShapeError

#: chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails about 1 run in 1,000,
#: and the seed is fixed, so the test is deterministic.
CHI2_999 = {3: 16.27, 5: 20.52, 11: 31.26}


def _chi2(counts, probs, n):
    expected = np.asarray(probs) * n
    return float(((np.asarray(counts) - expected) ** 2 / expected).sum())


def test_multinomial_with_replacement_follows_the_weights(device):
    fg.manual_seed(0)
    weights = [1.0, 2.0, 3.0, 4.0]  # unnormalised
    n = 20000
    draws = fg.multinomial(fg.tensor(weights, device=device), n, replacement=True)
    assert draws.shape == (n,) and draws.dtype == fg.int64 and draws.device == fg.device(device)
    counts = np.bincount(draws.numpy(), minlength=4)
    assert _chi2(counts, np.array(weights) / 10, n) < CHI2_999[3]


def test_multinomial_2d_rows_are_independent_distributions_and_zero_weights_never_drawn(device):
    fg.manual_seed(1)
    w = fg.tensor([[0.0, 5.0, 0.0, 5.0], [3.0, 0.0, 1.0, 0.0]], device=device)
    draws = w.multinomial(8000, replacement=True).numpy()
    assert draws.shape == (2, 8000)
    assert set(np.unique(draws[0])) == {1, 3} and set(np.unique(draws[1])) == {0, 2}
    assert _chi2(np.bincount(draws[1], minlength=4)[[0, 2]], [0.75, 0.25], 8000) < 10.83  # 1 dof, p = 0.001
    assert fg.multinomial(fg.tensor([[1e-30, 0.0, 0.0]], device=device), 50, replacement=True).numpy().max() == 0


def test_multinomial_without_replacement_has_the_sequential_law(device):
    fg.manual_seed(2)
    weights = np.array([1.0, 2.0, 3.0])
    p = weights / weights.sum()
    rows = 12000
    draws = fg.multinomial(fg.tensor(np.tile(weights, (rows, 1)).astype(np.float32), device=device), 2).numpy()
    assert draws.shape == (rows, 2) and (draws[:, 0] != draws[:, 1]).all()
    pairs = list(itertools.permutations(range(3), 2))
    exact = [p[i] * p[j] / (1 - p[i]) for i, j in pairs]  # draw i, then j from what is left
    counts = [int(((draws[:, 0] == i) & (draws[:, 1] == j)).sum()) for i, j in pairs]
    assert _chi2(counts, exact, rows) < CHI2_999[5]
    full = fg.multinomial(fg.tensor([5.0, 1.0, 0.0, 2.0], device=device), 4).numpy()
    assert sorted(full.tolist()) == [0, 1, 2, 3] and full[-1] == 2  # the zero weight comes last, as in torch


def test_multinomial_nanogpt_sampling_step(device):
    fg.manual_seed(3)
    logits = fg.randn(4, 50, device=device)
    probs = logits.softmax(-1)
    nxt = fg.multinomial(probs, num_samples=1)
    assert nxt.shape == (4, 1) and nxt.dtype == fg.int64
    assert ((nxt.numpy() >= 0) & (nxt.numpy() < 50)).all()
    if fg.get_backend(device).supports_float16:
        assert fg.multinomial(probs.to(fg.float16), 3).shape == (4, 3)


def test_multinomial_errors_match_torch():
    cases = [
        (([1.0, -1.0], 1), {}, FlowError, "contains either inf, nan or element < 0"),
        (([1.0, float("inf")], 1), {}, FlowError, "contains either inf, nan or element < 0"),
        (([1.0, float("nan")], 1), {}, FlowError, "contains either inf, nan or element < 0"),
        (([0.0, 0.0], 1), {}, FlowError, r"sum of probabilities <= 0"),
        (([1.0, 1.0], 3), {}, FlowError, r"cannot sample num_samples=3 > 2 categories without replacement"),
        (([1.0, 1.0], 0), {}, FlowError, "num_samples must be a positive int"),
        (([[[1.0]]], 1), {}, ShapeError, "prob_dist must be 1 or 2 dim"),
    ]
    for (data, n), kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            fg.multinomial(fg.tensor(data), n, **kwargs)
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor(data), n, **kwargs)
    with pytest.raises(FlowError, match="floating tensor of weights"):
        fg.multinomial(fg.tensor([1, 2]), 1)
    with pytest.raises(FlowError, match="generator= is not supported"):
        fg.multinomial(fg.tensor([1.0, 2.0]), 1, generator=object())
    assert fg.multinomial(fg.tensor([1.0, 1.0]), 3, replacement=True).shape == (3,)


@pytest.mark.parametrize("value", [1, 0.5, -2.0])
def test_addcmul_addcdiv_match_torch_with_gradients(device, value):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((1, 4)).astype(np.float32)  # broadcast
    c = (rng.random((3, 1)) + 0.5).astype(np.float32)
    for name in ("addcmul", "addcdiv"):
        fa, fb, fc = (fg.tensor(x, device=device, requires_grad=True) for x in (a, b, c))
        ta, tb, tc = (torch.tensor(x, requires_grad=True) for x in (a, b, c))
        out = getattr(fg, name)(fa, fb, fc, value=value)
        ref = getattr(torch, name)(ta, tb, tc, value=value)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)
        (out * out).sum().backward()
        (ref * ref).sum().backward()
        for f, t in ((fa, ta), (fb, tb), (fc, tc)):
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
        method = getattr(fg.tensor(a, device=device), name)(fg.tensor(b, device=device), fg.tensor(c, device=device),
                                                            value=value)
        np.testing.assert_allclose(method.numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_addcmul_addcdiv_gradcheck():
    rng = np.random.default_rng(5)
    a, b = (fg.tensor(rng.standard_normal((2, 3)), dtype=fg.float64, requires_grad=True) for _ in range(2))
    c = fg.tensor(rng.random((2, 3)) + 0.5, dtype=fg.float64, requires_grad=True)
    fg.gradcheck(lambda x, y, z: fg.addcmul(x, y, z, value=0.3), (a, b, c))
    fg.gradcheck(lambda x, y, z: fg.addcdiv(x, y, z, value=-1.5), (a, b, c))


def test_inplace_addcmul_addcdiv_like_torch_adam_update(device):
    rng = np.random.default_rng(6)
    p, g, v = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    v = np.abs(v) + 0.1
    fp, fgr, fv = (fg.tensor(x, device=device) for x in (p, g, v))
    tp, tgr, tv = (torch.tensor(x) for x in (p, g, v))
    assert fp.addcmul_(fgr, fgr, value=0.1) is fp
    tp.addcmul_(tgr, tgr, value=0.1)
    fp.addcdiv_(fgr, fv.sqrt(), value=-0.01)
    tp.addcdiv_(tgr, tv.sqrt(), value=-0.01)
    np.testing.assert_allclose(fp.numpy(), tp.numpy(), rtol=1e-6, atol=1e-6)
    leaf = fg.ones(3, requires_grad=True)
    base = leaf * 1
    base.addcmul_(leaf, leaf, value=2.0)  # a non-leaf in place: the gradient flows through both uses
    base.sum().backward()
    assert leaf.grad.tolist() == [5.0, 5.0, 5.0]
    with pytest.raises(FlowError, match="integer division"):
        fg.addcdiv(fg.ones(2), fg.tensor([1, 2]), fg.tensor([1, 2]))


def test_view_as_reshape_as_and_device_flags(device):
    x = fg.arange(6.0, device=device)
    other = fg.zeros(2, 3)
    v = x.view_as(other)
    assert v.shape == (2, 3)
    v[0, 0] = 7.0
    assert x[0].item() == 7.0  # a view
    t = fg.arange(6.0, device=device).reshape(2, 3).t()
    r = t.reshape_as(fg.zeros(6))
    assert r.tolist() == torch.arange(6.0).reshape(2, 3).t().reshape(6).tolist()
    assert x.is_cpu == (device == "cpu") and x.is_cuda == device.startswith("cuda")
    assert x.new_zeros(2, 3).shape == (2, 3) and x.new_zeros((4,)).device == x.device
