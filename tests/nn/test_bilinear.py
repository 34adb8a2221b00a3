"""nn.Bilinear / F.bilinear against torch, and its float64 gradcheck."""

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_bilinear_matches_torch(device, bias, lead):
    """forward, input and parameter gradients at rtol 1e-5 / atol 1e-5."""
    tm = torch.nn.Bilinear(4, 3, 6, bias=bias)
    fm = nn.Bilinear(4, 3, 6, bias=bias)
    assert repr(fm) == repr(tm)
    fm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    fm.to(device)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(lead + (4,)).astype(np.float32)
    b = rng.standard_normal(lead + (3,)).astype(np.float32)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    fa = fg.tensor(a, device=device, requires_grad=True)
    fb = fg.tensor(b, device=device, requires_grad=True)
    ty, fy = tm(ta, tb), fm(fa, fb)
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    ty.pow(2).sum().backward()
    fy.pow(2).sum().backward()
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fb.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fm.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    if bias:
        np.testing.assert_allclose(fm.bias.grad.numpy(), tm.bias.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_bilinear_gradcheck(device):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    m = nn.Bilinear(3, 2, 4).double().to(device)
    x1 = fg.randn(5, 3, dtype=fg.float64, device=device, requires_grad=True)
    x2 = fg.randn(5, 2, dtype=fg.float64, device=device, requires_grad=True)
    assert fg.gradcheck(lambda a, b, w, c: nn.functional.bilinear(a, b, w, c), (x1, x2, m.weight, m.bias))
