"""Declared backend capabilities (``flowgraph/backends/base.py``): each generic default against the device's
own override, on every available device, and the contracts the layers above rely on."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from flowgraph.backends import get_backend
from flowgraph.backends.base import Backend
from flowgraph.errors import BackendError

F32 = np.float32


def _arrays(be, *hosts):
    return [be.from_host(np.ascontiguousarray(h)) for h in hosts]


def _host(be, *arrays):
    return [None if a is None else be.to_host(a) for a in arrays]


@pytest.mark.parametrize("kw", [
    dict(),
    dict(l2=0.1, maximize=True),
    dict(decay=0.99),
], ids=["plain", "l2-maximize", "decoupled"])
def test_adam_step_override_matches_generic_default(device, kw):
    be = get_backend(device)
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal((6, 5)).astype(F32) for _ in range(3))
    v = np.abs(rng.standard_normal((6, 5))).astype(F32)
    results = []
    for step in (type(be).adam_step, Backend.adam_step):
        arrays = _arrays(be, p, g, m, v)
        out = step(be, *arrays, 0.9, 0.999, 1e-2, 1e-8, **kw)
        assert len(out) == 4 and out[3] is None
        results.append(_host(be, *out[:3]))
    for fast, generic in zip(*results):
        np.testing.assert_allclose(fast, generic, rtol=1e-6, atol=1e-7)


def test_adam_step_amsgrad_keeps_the_running_maximum(device):
    be = get_backend(device)
    p, g, m, v = _arrays(be, np.ones(4, F32), np.full(4, 2.0, F32), np.zeros(4, F32), np.zeros(4, F32))
    (v_max,) = _arrays(be, np.array([0.0, 1.0, 0.0, 1.0], F32))
    p, m, v, v_max = be.adam_step(p, g, m, v, 0.9, 0.999, 0.1, 1e-8, v_max=v_max)
    np.testing.assert_allclose(be.to_host(v), np.full(4, 0.004), rtol=1e-6)
    np.testing.assert_allclose(be.to_host(v_max), [0.004, 1.0, 0.004, 1.0], rtol=1e-6)
    expected = 1 - 0.1 * 0.2 / (np.sqrt(be.to_host(v_max).astype(np.float64)) + 1e-8)
    np.testing.assert_allclose(be.to_host(p), expected, rtol=1e-5)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_step_override_matches_generic_default(device, nesterov):
    be = get_backend(device)
    rng = np.random.default_rng(1)
    p, g, buf = (rng.standard_normal((3, 7)).astype(F32) for _ in range(3))
    results = []
    for step in (type(be).sgd_step, Backend.sgd_step):
        arrays = _arrays(be, p, g, buf)
        results.append(_host(be, *step(be, *arrays, 0.1, 0.9, 0.0, 0.01, nesterov, False)))
    for fast, generic in zip(*results):
        np.testing.assert_allclose(fast, generic, rtol=1e-6, atol=1e-7)


def test_sgd_step_first_momentum_step_copies_the_gradient(device):
    be = get_backend(device)
    p, g = _arrays(be, np.ones(3, F32), np.array([1.0, -2.0, 3.0], F32))
    p, buf = be.sgd_step(p, g, None, 0.5, 0.9, 0.3, 0.0, False, False)
    np.testing.assert_array_equal(be.to_host(buf), [1.0, -2.0, 3.0])
    np.testing.assert_allclose(be.to_host(p), [0.5, 2.0, -0.5])
    be.assign(g, 0.0)
    np.testing.assert_array_equal(be.to_host(buf), [1.0, -2.0, 3.0])  # its own storage, not the gradient's
    p, none = be.sgd_step(p, g, None, 0.5, 0.0, 0.0, 0.0, False, False)
    assert none is None


@pytest.mark.parametrize("kernel,spatial", [((2, 2), (6, 4)), ((3, 1), (6, 4)), ((1, 1), (6, 4)), ((2,), (6,)),
                                            ((2, 1, 2), (4, 3, 4))])
@pytest.mark.parametrize("dtype", [F32, np.float64])
@pytest.mark.parametrize("transposed", [False, True])
def test_max_pool_blocks_override_matches_generic_default(device, kernel, spatial, dtype, transposed):
    be = get_backend(device)
    if dtype == np.float64 and not be.supports_float64:
        pytest.skip(f"{device} has no float64")
    rng = np.random.default_rng(2)
    x = rng.integers(-2, 3, size=(2, 3, *spatial)).astype(dtype)  # many ties: the first maximum must win
    x.reshape(-1)[[0, x.size - 5]] = np.nan
    out = (2, 3, *(s // k for s, k in zip(spatial, kernel)))
    gy = rng.standard_normal(out).astype(dtype)
    gy.reshape(-1)[1] = np.nan  # a NaN gradient reaches its block's maximum only; elsewhere +0, never -0
    results = []
    for forward, backward in ((type(be).max_pool_blocks, type(be).max_pool_blocks_backward),
                              (Backend.max_pool_blocks, Backend.max_pool_blocks_backward)):
        if transposed:  # a channels-swapped view: not contiguous
            (a,) = _arrays(be, np.ascontiguousarray(np.swapaxes(x, 0, 1)))
            a = be.permute(a, (1, 0, *range(2, x.ndim)))
        else:
            (a,) = _arrays(be, x)
        best = forward(be, a, kernel)
        (g,) = _arrays(be, gy)
        results.append(_host(be, best, backward(be, a, best, g, kernel)))
    for fast, generic in zip(*results):
        np.testing.assert_array_equal(fast, generic)
    np.testing.assert_array_equal(np.signbit(results[0][1]), np.signbit(results[1][1]))
    finite = ~np.isnan(gy)
    assert np.isnan(results[0][1]).sum() == (~finite).sum()
    assert np.nansum(results[0][1]) == pytest.approx(gy[finite].sum(), rel=1e-5)  # each gradient lands once


def test_add_into_contract(device):
    be = get_backend(device)
    dst, src = _arrays(be, np.arange(4, dtype=F32), np.ones(4, F32))
    total = be.add_into(dst, src)
    np.testing.assert_array_equal(be.to_host(total), [1.0, 2.0, 3.0, 4.0])
    if total is dst:  # added in place: ``dst`` holds the sum
        np.testing.assert_array_equal(be.to_host(dst), [1.0, 2.0, 3.0, 4.0])


def test_capability_attributes_and_their_errors(device):
    be = get_backend(device)
    (a,) = _arrays(be, np.ones(2, F32))
    if not be.supports_graph_capture:
        with pytest.raises(BackendError, match="supports_graph_capture"):
            be.graph_session()
    if not be.supports_dlpack:
        with pytest.raises(BackendError, match=be.name):
            be.to_dlpack(a)
        with pytest.raises(BackendError, match=be.name):
            be.dlpack_device(a)
    else:
        assert isinstance(be.dlpack_device(a), tuple)


def test_no_capability_probes_above_the_backends():
    """Code above ``backends/`` calls declared capabilities, never ``getattr(backend, "name", ...)``."""
    root = pathlib.Path(__file__).resolve().parents[2] / "flowgraph"
    probe = re.compile(r"getattr\(\s*[\w.]*(?:bk|backend)\w*\s*,\s*['\"]")
    found = [f"{path.relative_to(root)}:{n}" for path in root.rglob("*.py") if "backends" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert not found, f"capability probes: {found}"


@pytest.mark.parametrize("axes,w_shape", [((0, 2, 3), (1, 3, 1, 1)), ((2, 3), (1, 3, 1, 1)), ((0, 2, 3), None),
                                          ((1,), (5,)), ((3,), (1, 1, 1, 5))],
                         ids=["batch", "instance", "no-affine", "layer-row", "row-4d"])
def test_standardize_backward_generic_default_matches_the_formula(device, axes, w_shape):
    """The generic ``standardize_backward``, whether it takes its two-reduction form (an affine constant over each
    reduced group) or the general one, against the closed form in float64 NumPy."""
    be = get_backend(device)
    rng = np.random.default_rng(4)
    shape = (4, 5) if axes == (1,) else (4, 3, 2, 5)
    x = rng.standard_normal(shape).astype(F32)
    g = rng.standard_normal(shape).astype(F32)
    w = None if w_shape is None else rng.standard_normal(w_shape).astype(F32)
    mean = x.astype(np.float64).mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(x.astype(np.float64).var(axis=axes, keepdims=True) + 1e-5)
    xhat = (x - mean) * rstd
    gy = g if w is None else g * w
    gx = rstd * (gy - gy.mean(axis=axes, keepdims=True) - xhat * (gy * xhat).mean(axis=axes, keepdims=True))

    def summed(a, to):
        lead = a.ndim - len(to)
        red = tuple(i for i in range(a.ndim) if i < lead or (to[i - lead] == 1 and a.shape[i] != 1))
        return a.sum(axis=red, keepdims=True).reshape(to)

    arrays = _arrays(be, g, xhat.astype(F32), rstd.astype(F32), *(() if w is None else (w,)))
    wd = arrays[3] if w is not None else None
    out = Backend.standardize_backward(be, arrays[0], arrays[1], arrays[2], wd, axes, True, w_shape, w_shape)
    got = _host(be, *out)
    np.testing.assert_allclose(got[0], gx, rtol=2e-4, atol=2e-5)
    if w_shape is not None:
        np.testing.assert_allclose(got[1], summed(g * xhat, w_shape), rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(got[2], summed(g.astype(np.float64), w_shape), rtol=2e-4, atol=2e-4)
    else:
        assert got[1] is None and got[2] is None


@pytest.mark.parametrize("biases", ["none", "both", "hidden"])
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_gru_cell_override_matches_generic_default(device, dtype, biases, monkeypatch):
    """A backend's one-kernel GRU cell (``_gru_kernel``, CUDA and OpenCL) against the generic default's
    primitives, forward and backward, with the biases added in the kernel (both, the hidden one only as
    ``nn.GRU`` passes it, or none)."""
    be = get_backend(device)
    if dtype == np.float64 and not be.supports_float64:
        pytest.skip(f"{device} has no float64")
    rng = np.random.default_rng(5)
    b, hidden = 5, 7
    x, p = (rng.standard_normal((b, 3 * hidden)).astype(dtype) * 2 for _ in range(2))
    h, g = (rng.standard_normal((b, hidden)).astype(dtype) for _ in range(2))
    bx, bp = (rng.standard_normal(3 * hidden).astype(dtype) for _ in range(2))
    bx, bp = {"none": (None, None), "both": (bx, bp), "hidden": (None, bp)}[biases]
    if not device.startswith("cpu"):  # the device backends take their kernel here
        assert be._gru_kernel(False, tuple(_arrays(be, x, p, h)), (None, None)) is not None
    results = []
    for generic in (False, True):
        if generic:
            monkeypatch.setattr(be, "_gru_kernel", lambda backward, arrays, biases: None)
        xa, pa, ha = _arrays(be, x, p, h)
        # g as the autograd engine's sum of two contributions (pending on a lazy backend: the kernel adds them)
        ga = be.add(*_arrays(be, g * 0.25, g * 0.75))
        bxa, bpa = (None if v is None else _arrays(be, v)[0] for v in (bx, bp))
        h_new, rz, n = be.gru_cell(xa, pa, ha, bxa, bpa)
        results.append(_host(be, h_new, rz, n, *be.gru_cell_backward(ga, rz, n, ha, pa, bpa)))
        np.testing.assert_allclose(be.to_host(ga), g, rtol=1e-6)  # the sum, written out by the kernel
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == F32 else dict(rtol=1e-12, atol=1e-13)
    for fast, slow in zip(*results):
        np.testing.assert_allclose(fast, slow, **tol)
    xb, pb = x + (0 if bx is None else bx), p + (0 if bp is None else bp)
    r, z = results[1][1][:, :hidden], results[1][1][:, hidden:]
    np.testing.assert_allclose(r, 1 / (1 + np.exp(-(xb[:, :hidden] + pb[:, :hidden]))), rtol=1e-5)
    n_ref = np.tanh(xb[:, 2 * hidden:] + r * pb[:, 2 * hidden:])
    np.testing.assert_allclose(results[0][2], n_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(results[0][5], g * z, rtol=1e-5)  # gh
