"""nn.utils gradient clipping and parameter/vector conversion, against torch.nn.utils."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,), (2, 2, 2)]


def _pair(device, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]
    fps, tps = [], []
    for v, g in zip(values, grads):
        f = fg.tensor(v, device=device, requires_grad=True)
        f.grad = fg.tensor(g, device=device)
        t = torch.tensor(v, requires_grad=True)
        t.grad = torch.tensor(g)
        fps.append(f)
        tps.append(t)
    return fps, tps


def _same_grads(fps, tps, rtol=1e-6):
    for f, t in zip(fps, tps):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(device, norm_type, max_norm):
    fps, tps = _pair(device)
    ftotal = nn.utils.clip_grad_norm_(fps, max_norm, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type=norm_type)
    np.testing.assert_allclose(ftotal.item(), ttotal.item(), rtol=1e-6)
    _same_grads(fps, tps)
    if max_norm == 1e3:  # no clipping: gradients unchanged
        _, originals = _pair(device)
        _same_grads(fps, originals)


def test_clip_grad_norm_single_tensor_and_skips_missing_grads(device):
    fps, tps = _pair(device)
    fps[1].grad = None
    tps[1].grad = None
    np.testing.assert_allclose(nn.utils.clip_grad_norm_(fps, 0.1).item(),
                               torch.nn.utils.clip_grad_norm_(tps, 0.1).item(), rtol=1e-6)
    _same_grads([fps[0], fps[2]], [tps[0], tps[2]])
    f, t = _pair(device, seed=3)
    nn.utils.clip_grad_norm_(f[0], 0.2)
    torch.nn.utils.clip_grad_norm_(t[0], 0.2)
    _same_grads(f[:1], t[:1])


def test_clip_grad_norm_nonfinite(device):
    fps, tps = _pair(device)
    fps[0].grad = fg.tensor(np.full((3, 4), np.inf, np.float32), device=device)
    with pytest.raises(fg.FlowError, match="error_if_nonfinite"):
        nn.utils.clip_grad_norm_(fps, 1.0, error_if_nonfinite=True)
    assert math.isinf(nn.utils.clip_grad_norm_(fps, 1.0).item())


def test_clip_grad_norm_no_grads():
    p = fg.zeros(2, requires_grad=True)
    assert nn.utils.clip_grad_norm_([p], 1.0).item() == 0.0


@pytest.mark.parametrize("clip_value", [0.1, 0.7, 5.0])
def test_clip_grad_value_matches_torch(device, clip_value):
    fps, tps = _pair(device)
    nn.utils.clip_grad_value_(fps, clip_value)
    torch.nn.utils.clip_grad_value_(tps, clip_value)
    _same_grads(fps, tps)
    assert max(float(np.abs(f.grad.numpy()).max()) for f in fps) <= np.float32(clip_value)


def test_parameters_to_vector_round_trip(device):
    fps, tps = _pair(device)
    fvec = nn.utils.parameters_to_vector(fps)
    tvec = torch.nn.utils.parameters_to_vector(tps)
    np.testing.assert_array_equal(fvec.detach().numpy(), tvec.detach().numpy())
    new = np.arange(fvec.shape[0], dtype=np.float32)
    nn.utils.vector_to_parameters(fg.tensor(new, device=device), fps)
    torch.nn.utils.vector_to_parameters(torch.tensor(new), tps)
    for f, t in zip(fps, tps):
        np.testing.assert_array_equal(f.detach().numpy(), t.detach().numpy())
    with pytest.raises(fg.ShapeError, match="1-d tensor of 25 elements"):
        nn.utils.vector_to_parameters(fg.zeros(20, device=device), fps)
