"""``F.layer_norm`` / ``nn.LayerNorm`` on the backends' ``layer_norm`` kernels, against PyTorch on every device.

Shapes cover one row, rows not a power of two, rows longer than a work-group (256), several trailing dims and
an empty batch; weight and bias are optional; float64 runs where the device has it. The jitted step (a CUDA
graph on cuda) must give what the eager one gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
import flowgraph.nn.functional as F
from flowgraph import nn, optim
from flowgraph.errors import ShapeError
from tests.training import train

# (input shape, normalized_shape)
SHAPES = [
    ((1, 7), (7,)),  # one row
    ((5, 33), (33,)),  # cols not a power of two
    ((3, 700), (700,)),  # cols > the work-group size
    ((2, 3, 4, 5), (4, 5)),  # several trailing dims
    ((64, 16), (16,)),  # many short rows
]
AFFINE = [(True, True), (True, False), (False, False)]


def _dtype_or_skip(device: str, dtype: str):
    if dtype == "float64" and not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    return getattr(fg, dtype)


def _case(shape, norm, affine, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    w = rng.standard_normal(norm).astype(dtype) if affine[0] else None
    b = rng.standard_normal(norm).astype(dtype) if affine[1] else None
    g = rng.standard_normal(shape).astype(dtype)
    return x, w, b, g


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("affine", AFFINE, ids=["w-b", "w", "none"])
@pytest.mark.parametrize("shape,norm", SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_layer_norm_matches_torch(device, shape, norm, affine, dtype):
    import torch

    fdt = _dtype_or_skip(device, dtype)
    x, w, b, g = _case(shape, norm, affine, dtype)
    fx = fg.tensor(x, dtype=fdt, device=device, requires_grad=True)
    fw, fb = (None if a is None else fg.tensor(a, dtype=fdt, device=device, requires_grad=True) for a in (w, b))
    tx = torch.tensor(x, requires_grad=True)
    tw, tb = (None if a is None else torch.tensor(a, requires_grad=True) for a in (w, b))
    out = F.layer_norm(fx, norm, fw, fb, eps=1e-5)
    ref = torch.nn.functional.layer_norm(tx, norm, tw, tb, eps=1e-5)
    tol = dict(rtol=1e-5, atol=2e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), **tol)
    out.backward(fg.tensor(g, dtype=fdt, device=device))
    ref.backward(torch.tensor(g))
    grad_tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), **grad_tol)
    for mine, theirs in ((fw, tw), (fb, tb)):
        if mine is not None:
            np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), **grad_tol)


def test_layer_norm_only_the_parameter_gradients(device):
    """An input that needs no gradient: only the weight and bias reductions run."""
    import torch

    x, w, b, g = _case((9, 12), (12,), (True, True), "float32", seed=4)
    fw, fb = (fg.tensor(a, device=device, requires_grad=True) for a in (w, b))
    out = F.layer_norm(fg.tensor(x, device=device), (12,), fw, fb)
    out.backward(fg.tensor(g, device=device))
    tw, tb = (torch.tensor(a, requires_grad=True) for a in (w, b))
    torch.nn.functional.layer_norm(torch.tensor(x), (12,), tw, tb).backward(torch.tensor(g))
    np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fb.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_of_a_strided_input_and_an_empty_batch(device):
    import torch

    x = np.random.default_rng(2).standard_normal((6, 10)).astype(np.float32)
    fx = fg.tensor(x, device=device).transpose(0, 1)  # (10, 6), not contiguous
    ref = torch.nn.functional.layer_norm(torch.tensor(x).t(), (6,))
    np.testing.assert_allclose(F.layer_norm(fx, (6,)).numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    empty = fg.zeros(0, 6, device=device, requires_grad=True)
    out = nn.LayerNorm(6).to(device)(empty)
    assert out.shape == (0, 6)
    out.sum().backward()
    assert empty.grad.shape == (0, 6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_16_bit_is_computed_in_float32(device, dtype):
    """16-bit inputs are normalised in float32 (statistics float32, as PyTorch), the output rounded once."""
    import torch

    be = fg.get_backend(device)
    if dtype == "float16" and not be.supports_float16 or dtype == "bfloat16" and device.startswith("opencl"):
        pytest.skip(f"{device} has no {dtype}")
    x32 = (np.random.default_rng(3).standard_normal((4, 40)) * 4 + 2).astype(np.float32)
    w32 = np.random.default_rng(4).standard_normal(40).astype(np.float32)
    fx = fg.tensor(x32, device=device).to(getattr(fg, dtype)).requires_grad_()
    fw = fg.tensor(w32, device=device).to(getattr(fg, dtype)).requires_grad_()
    out = F.layer_norm(fx, (40,), fw)
    assert out.dtype == getattr(fg, dtype)
    tdt = getattr(torch, dtype)
    tx, tw = torch.tensor(x32).to(tdt).requires_grad_(), torch.tensor(w32).to(tdt).requires_grad_()
    ref = torch.nn.functional.layer_norm(tx.float(), (40,), tw.float()).to(tdt)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "float16" else dict(rtol=4e-2, atol=4e-2)
    np.testing.assert_allclose(out.detach().float().numpy(), ref.detach().float().numpy(), **tol)
    out.float().sum().backward()
    ref.float().sum().backward()
    assert fx.grad.dtype == getattr(fg, dtype) and fw.grad.dtype == getattr(fg, dtype)
    np.testing.assert_allclose(fw.grad.float().numpy(), tw.grad.float().numpy(), **tol)


def test_layer_norm_weight_of_the_wrong_shape_is_named():
    with pytest.raises(ShapeError, match="weight has shape"):
        F.layer_norm(fg.zeros(2, 6), (6,), fg.ones(3))


def test_layer_norm_saves_no_input_sized_tensor_but_x(device):
    """Backward keeps x, the per-row statistics and the weight (as PyTorch does), not a normalised copy."""
    x = fg.randn(8, 32, device=device, requires_grad=True)
    m = nn.LayerNorm(32).to(device)
    node = m(x).grad_fn
    assert node.name == "LayerNorm"
    sizes = sorted(t.numel() for t in node.saved)
    assert sizes == [8, 8, 32, 8 * 32]


def test_layer_norm_trains_the_same_inside_jit(device):
    """A LayerNorm model's jitted training step (recorded calls on cpu/opencl, a CUDA graph on cuda) gives the
    eager step's losses and parameters."""
    def run(jitted):
        return train(device, lambda: nn.Sequential(nn.Linear(6, 300), nn.LayerNorm(300), nn.GELU(), nn.Linear(300, 3)),
                     lambda ps: optim.Adam(ps, lr=1e-2), ((10, 6), (10, 3)), jitted, seed=5)[:2]

    eager, eager_params = run(False)
    jitted, jit_params = run(True)
    tol = dict(rtol=0, atol=0) if not device.startswith("cuda") else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(jitted, eager, **tol)
    for p, q in zip(jit_params, eager_params):
        np.testing.assert_allclose(p, q, **tol)


def test_layer_norm_of_views_with_offsets(device):
    """Row slices of the input and slices of one parameter as weight and bias (buffers read at an offset)."""
    import torch

    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((8, 20)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    fx, fw = (fg.tensor(a, device=device, requires_grad=True) for a in (x, w))
    out = F.layer_norm(fx[3:6], (20,), fw[10:30], fw[20:40])
    (out * out).sum().backward()
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    ref = torch.nn.functional.layer_norm(tx[3:6], (20,), tw[10:30], tw[20:40])
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
