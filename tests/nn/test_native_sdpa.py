"""The fused-attention contract (``Backend.native_sdpa`` / ``sdpa_forward`` / ``sdpa_backward``) as
``F.scaled_dot_product_attention`` uses it: a backend that says ``native_sdpa`` gets the call (no mask or the
square causal one, no dropout) through the two ops, and results equal the composed path. The backend here is the
cpu one saying ``native_sdpa`` for float32 with the protocol's generic defaults (the reference the fused cuDNN
kernels are measured against on the GPU); cuDNN itself runs the ordinary attention tests against torch on
``cuda``."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph.backends import get_backend
from flowgraph.backends.base import Backend
from flowgraph.nn import functional as F


@pytest.fixture
def fused(monkeypatch):
    """Turn on ``native_sdpa`` (float32) on the cpu backend for one test; yields the call counts."""
    cpu = get_backend("cpu")
    calls = {"forward": 0, "backward": 0}

    def forward(*args):
        calls["forward"] += 1
        return Backend.sdpa_forward(cpu, *args)

    def backward(*args):
        calls["backward"] += 1
        return Backend.sdpa_backward(cpu, *args)

    state = {"on": False}
    monkeypatch.setattr(cpu, "native_sdpa", lambda dtype, head_dim: state["on"] and dtype == np.float32)
    monkeypatch.setattr(cpu, "sdpa_forward", forward)
    monkeypatch.setattr(cpu, "sdpa_backward", backward)
    calls["state"] = state
    return calls


def _run(arrays, g, **kw):
    ts = [fg.tensor(a.copy(), requires_grad=True) for a in arrays]
    y = F.scaled_dot_product_attention(*ts, **kw)
    y.backward(fg.tensor(g))
    return [y.detach().numpy()] + [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("shape,causal", [((2, 3, 5, 4), False), ((2, 3, 6, 8), True), ((4, 7, 4), True),
                                          ((1, 1, 1, 2), False)])
def test_fused_path_matches_the_composed_one(fused, shape, causal):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    g = rng.standard_normal(shape).astype(np.float32)
    plain = _run(arrays, g, is_causal=causal)
    fused["state"]["on"] = True
    native = _run(arrays, g, is_causal=causal)
    for a, b in zip(native, plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert (fused["forward"], fused["backward"]) == (1, 1)


def test_masks_dropout_and_other_dtypes_keep_the_composed_path(fused):
    fused["state"]["on"] = True
    rng = np.random.default_rng(1)
    q = fg.tensor(rng.standard_normal((1, 2, 4, 4)).astype(np.float32))
    F.scaled_dot_product_attention(q, q, q, attn_mask=fg.tensor(np.tril(np.ones((4, 4), bool))))
    F.scaled_dot_product_attention(q, q[..., :3, :], q[..., :3, :], is_causal=True)  # causal with L != S
    F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    q64 = fg.tensor(rng.standard_normal((1, 2, 4, 4)))
    F.scaled_dot_product_attention(q64, q64, q64)
    assert fused["forward"] == 0
    F.scaled_dot_product_attention(q, q, q)
    assert fused["forward"] == 1


def test_double_backward_through_the_fused_op(fused):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3)]

    def second():
        q, k, v = (fg.tensor(a.copy(), requires_grad=True) for a in arrays)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (gq,) = fg.autograd.grad((y * y).sum(), (q,), create_graph=True)
        return [t.numpy() for t in fg.autograd.grad((gq * gq).sum(), (q, k, v))]

    plain = second()
    fused["state"]["on"] = True
    for a, b in zip(second(), plain):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    assert fused["forward"] == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_fused_attention_matches_torch(dtype, causal):
    """cuda only: cuDNN's fused attention, forward and the three gradients, against torch's float32 math."""
    from flowgraph.backends import available_devices

    if not any(d.startswith("cuda") for d in available_devices()):
        pytest.skip("no CUDA device: cuDNN's attention runs on the GPU machine")
    if not fg.backends.cudnn.is_available():
        pytest.skip(f"cuDNN is not available: {fg.backends.cudnn.unavailable_reason()}")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    shape = (2, 4, 64, 32)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    g = rng.standard_normal(shape).astype(np.float32)
    ts = [torch.tensor(a).to(getattr(torch, dtype)).float().requires_grad_(True) for a in arrays]
    ty = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal)
    ty.backward(torch.tensor(g).to(getattr(torch, dtype)).float())
    fdt = getattr(fg, dtype)
    fs = [fg.tensor(a, device="cuda").to(fdt).requires_grad_(True) for a in arrays]
    assert get_backend("cuda").native_sdpa(fs[0].dtype.np, shape[-1])
    fy = F.scaled_dot_product_attention(*fs, is_causal=causal)
    assert "ScaledDotProductAttention" in str(fy.grad_fn) + type(fy.grad_fn).__name__
    fy.backward(fg.tensor(g, device="cuda").to(fdt))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(fy.detach().float().cpu().numpy(), ty.detach().numpy(), **tol)
    for f, t in zip(fs, ts):
        np.testing.assert_allclose(f.grad.float().cpu().numpy(), t.grad.numpy(), **tol)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_float32_attention_is_fused_in_place_and_matches_torch(causal, monkeypatch):
    """The NumPy backend's own ``sdpa_forward`` / ``sdpa_backward`` (float32, strided heads read as they are):
    the same values as the protocol's generic default, and torch's attention with its three gradients."""
    import torch

    cpu = get_backend("cpu")
    assert cpu.native_sdpa(np.dtype(np.float32), 16) and not cpu.native_sdpa(np.dtype(np.float64), 16)
    rng = np.random.default_rng(4)
    qkv = rng.standard_normal((2, 7, 3 * 12)).astype(np.float32)
    # heads as nanoGPT makes them: a (B, L, 3 * H * D) projection split and viewed as (B, H, L, D)
    q, k, v = (qkv[..., i * 12:(i + 1) * 12].reshape(2, 7, 3, 4).transpose(0, 2, 1, 3) for i in range(3))
    g = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    out, stats = cpu.sdpa_forward(q, k, v, 0.5, causal)
    ref_out, ref_stats = Backend.sdpa_forward(cpu, q, k, v, 0.5, causal)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats, ref_stats, rtol=1e-5, atol=1e-6)
    for a, b in zip(cpu.sdpa_backward(q, k, v, out, g, stats, 0.5, causal),
                    Backend.sdpa_backward(cpu, q, k, v, out, g, stats, 0.5, causal)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    calls = []
    forward = cpu.sdpa_forward
    monkeypatch.setattr(cpu, "sdpa_forward", lambda *a: calls.append(a) or forward(*a))
    fs = [fg.tensor(np.ascontiguousarray(t), requires_grad=True) for t in (q, k, v)]
    ts = [torch.tensor(np.ascontiguousarray(t), requires_grad=True) for t in (q, k, v)]
    fy = F.scaled_dot_product_attention(*fs, is_causal=causal)
    ty = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal)
    fy.backward(fg.tensor(g))
    ty.backward(torch.tensor(g))
    assert len(calls) == 1
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    for f, t in zip(fs, ts):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
