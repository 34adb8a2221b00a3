"""Activation modules and functions against PyTorch CPU, their gradients at the kinks, in-place forms and
float64 gradchecks.

Tolerance: rtol=1e-5, atol=1e-5 for every float32 comparison with torch (``RTOL``/``ATOL``); gradients at
the kink points are compared exactly (they are 0, 1, a slope or a constant in both libraries).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import activation
from flowgraph.nn import functional as F

from .test_layers_support import (
    ATOL,
    RTOL,
    Case,
    compare_with_torch,
    floats,
    gradcheck_module,
    host,
    skip_if_no_float64,
)

WIDE = floats(2, 4, 3, 2, scale=3.0)  # spans every branch (|x| up to ~10: past hardtanh/hardswish limits)

MODULES = [
    Case("relu", "ReLU", (), {}, WIDE),
    Case("leaky_relu", "LeakyReLU", (0.2,), {}, WIDE),
    Case("elu", "ELU", (), {"alpha": 0.7}, WIDE),
    Case("selu", "SELU", (), {}, WIDE),
    Case("celu", "CELU", (), {"alpha": 1.3}, WIDE),
    Case("gelu", "GELU", (), {}, WIDE),
    Case("gelu-tanh", "GELU", (), {"approximate": "tanh"}, WIDE),
    Case("silu", "SiLU", (), {}, WIDE),
    Case("mish", "Mish", (), {}, WIDE),
    Case("softplus", "Softplus", (), {"beta": 2.0, "threshold": 3.0}, WIDE),
    Case("softsign", "Softsign", (), {}, WIDE),
    Case("hardswish", "Hardswish", (), {}, WIDE),
    Case("hardsigmoid", "Hardsigmoid", (), {}, WIDE),
    Case("hardtanh", "Hardtanh", (-0.5, 2.0), {}, WIDE),
    Case("relu6", "ReLU6", (), {}, WIDE),
    Case("prelu-shared", "PReLU", (), {}, WIDE),
    Case("prelu-channels", "PReLU", (4,), {"init": 0.1}, WIDE),
    Case("sigmoid", "Sigmoid", (), {}, WIDE),
    Case("tanh", "Tanh", (), {}, WIDE),
    Case("softmax", "Softmax", (), {"dim": 1}, WIDE),
    Case("log_softmax", "LogSoftmax", (), {"dim": -1}, WIDE),
    Case("softmin", "Softmin", (), {"dim": 1}, WIDE),
    Case("glu", "GLU", (), {"dim": 1}, WIDE),
    Case("logsigmoid", "LogSigmoid", (), {}, WIDE),
    Case("tanhshrink", "Tanhshrink", (), {}, WIDE),
    Case("softshrink", "Softshrink", (0.7,), {}, WIDE),
    Case("hardshrink", "Hardshrink", (), {}, WIDE),
    Case("threshold", "Threshold", (0.1, -2.0), {}, WIDE),
    Case("rrelu-eval", "RReLU", (0.1, 0.3), {}, WIDE, steps=0, eval_step=True),  # training is random
    Case("softmax2d", "Softmax2d", (), {}, WIDE),
]


def test_every_activation_is_covered():
    exported = set(activation.__all__)
    # MODULES drives both the torch comparison and the gradcheck below
    assert sorted(exported - {c.cls for c in MODULES}) == [], "activations without a torch comparison/gradcheck"


@pytest.mark.parametrize("case", MODULES, ids=[c.id for c in MODULES])
def test_activation_module_matches_torch(case: Case, device: str):
    t_mod = case.build(torch.nn)
    f_mod = case.build(nn)
    assert repr(f_mod) == repr(t_mod)
    compare_with_torch(f_mod, t_mod, case.inputs, device, RTOL, ATOL, case.steps, case.eval_step)


@pytest.mark.parametrize("case", MODULES, ids=[c.id for c in MODULES])
def test_activation_gradcheck(case: Case, device: str):
    skip_if_no_float64(device)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 3)) * 2
    x[np.abs(x) < 0.05] += 0.2  # keep finite differences away from the kink at 0
    for kink in (-3.0, -1.0, -0.5, 0.1, 0.5, 0.7, 1.0, 2.0, 3.0, 6.0):
        x[np.abs(x - kink) < 0.05] += 0.15
    mod = case.build(nn).to(device).double()  # RReLU trains with random slopes: reseeded per evaluation
    assert gradcheck_module(mod, [fg.tensor(x, device=device, requires_grad=True)], lambda: fg.manual_seed(3))


# name -> kwargs; torch.nn.functional has the same function with the same arguments
FUNCTIONAL = {
    "relu": {}, "leaky_relu": {"negative_slope": 0.3}, "elu": {"alpha": 0.5}, "selu": {}, "celu": {"alpha": 2.0},
    "gelu": {"approximate": "tanh"}, "silu": {}, "mish": {}, "softplus": {"beta": 0.5, "threshold": 5.0},
    "softsign": {}, "hardswish": {}, "hardsigmoid": {}, "hardtanh": {"min_val": -2.0, "max_val": 0.5},
    "relu6": {}, "sigmoid": {}, "tanh": {}, "softmax": {"dim": 2}, "log_softmax": {"dim": 0},
    "softmin": {"dim": -1}, "glu": {"dim": 1}, "logsigmoid": {}, "tanhshrink": {}, "softshrink": {"lambd": 0.3},
    "hardshrink": {"lambd": 0.3}, "threshold": {"threshold": 0.5, "value": 3.0},
}  # fmt: skip


def test_every_functional_is_covered():
    assert sorted(set(activation.__functional__) - set(FUNCTIONAL) - {"prelu", "rrelu"}) == []


def test_rrelu_training_slopes(device: str):
    """In training each non-positive element gets its own slope in [lower, upper]; the gradient is it."""
    fg.manual_seed(0)
    x = fg.tensor(np.linspace(-3, 3, 2001).astype(np.float32), device=device, requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    y.sum().backward()
    xs, ys, gs = host(x.detach()), host(y.detach()), host(x.grad)
    neg = xs < 0
    slopes = ys[neg] / xs[neg]
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6 and slopes.std() > 0.04
    np.testing.assert_allclose(gs[neg], slopes, rtol=1e-5)
    np.testing.assert_array_equal(ys[xs > 0], xs[xs > 0])
    np.testing.assert_array_equal(gs[xs > 0], 1.0)
    module = nn.RReLU(0.1, 0.3).eval()
    np.testing.assert_allclose(host(module(x.detach())), host(F.leaky_relu(x.detach(), 0.2)), rtol=1e-6)


def _pair(x: np.ndarray, device: str):
    return (fg.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True))


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_matches_torch(name: str, device: str):
    x = (np.random.default_rng(2).standard_normal((3, 4, 2)) * 3).astype(np.float32)
    a, b = _pair(x, device)
    kwargs = FUNCTIONAL[name]
    y = getattr(F, name)(a, **kwargs)
    z = getattr(torch.nn.functional, name)(b, **kwargs)
    np.testing.assert_allclose(host(y), host(z), rtol=RTOL, atol=ATOL)
    g = np.random.default_rng(3).standard_normal(z.shape).astype(np.float32)
    y.backward(fg.tensor(g, device=device))
    z.backward(torch.tensor(g))
    np.testing.assert_allclose(host(a.grad), host(b.grad), rtol=RTOL, atol=ATOL)


def test_prelu_functional_matches_torch(device: str):
    x = (np.random.default_rng(2).standard_normal((2, 3, 4)) * 3).astype(np.float32)
    w = np.array([0.1, -0.2, 0.5], dtype=np.float32)
    a, b = _pair(x, device)
    wa, wb = _pair(w, device)
    y, z = F.prelu(a, wa), torch.nn.functional.prelu(b, wb)
    np.testing.assert_allclose(host(y), host(z), rtol=RTOL, atol=ATOL)
    y.sum().backward()
    z.sum().backward()
    np.testing.assert_allclose(host(wa.grad), host(wb.grad), rtol=RTOL, atol=ATOL)
    with pytest.raises(fg.ShapeError, match="channels"):
        F.prelu(a, fg.ones(4, device=device))


KINKS = {
    "relu": ([-1.0, 0.0, 1.0], {}),
    "leaky_relu": ([-1.0, 0.0, 1.0], {"negative_slope": 0.1}),
    "elu": ([-1.0, 0.0, 1.0], {}),
    "celu": ([-1.0, 0.0, 1.0], {}),
    "selu": ([-1.0, 0.0, 1.0], {}),
    "hardtanh": ([-2.0, -1.0, 0.0, 1.0, 2.0], {}),
    "relu6": ([-1.0, 0.0, 3.0, 6.0, 7.0], {}),
    "hardsigmoid": ([-4.0, -3.0, 0.0, 3.0, 4.0], {}),
    "hardswish": ([-4.0, -3.0, 0.0, 2.0, 4.0], {}),
    "softshrink": ([-1.0, -0.5, 0.0, 0.5, 1.0], {}),
    "hardshrink": ([-1.0, -0.5, 0.0, 0.5, 1.0], {}),
    "threshold": ([-1.0, 0.5, 1.0], {"threshold": 0.5, "value": 2.0}),
    "softplus": ([-30.0, 0.0, 20.0, 25.0], {}),
}


@pytest.mark.parametrize("name", sorted(KINKS))
def test_gradient_at_kinks_like_torch(name: str, device: str):
    """At a kink both libraries pick the same one-sided gradient (PyTorch's convention)."""
    values, kwargs = KINKS[name]
    x = np.array(values, dtype=np.float32)
    a, b = _pair(x, device)
    getattr(F, name)(a, **kwargs).sum().backward()
    getattr(torch.nn.functional, name)(b, **kwargs).sum().backward()
    np.testing.assert_allclose(host(a.grad), host(b.grad), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "name",
    [
        "relu",
        "leaky_relu",
        "elu",
        "selu",
        "celu",
        "silu",
        "mish",
        "hardswish",
        "hardsigmoid",
        "hardtanh",
        "relu6",
        "threshold",
    ],
)
def test_inplace_matches_torch(name: str, device: str):
    """``inplace=True`` overwrites the input (a non-leaf here) and the gradient still flows through it."""
    x = (np.random.default_rng(4).standard_normal((3, 5)) * 3).astype(np.float32)
    a, b = _pair(x, device)
    kwargs = {"threshold": 0.5, "value": 2.0} if name == "threshold" else {}
    ha, hb = a * 1.0, b * 1.0
    ra = getattr(F, name)(ha, inplace=True, **kwargs)
    rb = getattr(torch.nn.functional, name)(hb, inplace=True, **kwargs)
    assert ra is ha
    np.testing.assert_allclose(host(ha), host(hb), rtol=RTOL, atol=ATOL)
    (ra * ra).sum().backward()
    (rb * rb).sum().backward()
    np.testing.assert_allclose(host(a.grad), host(b.grad), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("slope", [0.2, 0.0, 1.0, 1.5, -0.3])
@pytest.mark.parametrize("inplace", [False, True])
def test_leaky_relu_special_values_like_torch(slope: float, inplace: bool, device: str):
    """Every slope branch (``maximum`` for 0 < slope <= 1, the output-reading backward for slope >= 0, the
    input-reading one for a negative slope) gives torch's values bit for bit at infinities, signed zeros,
    subnormals and NaN; in place, a slope >= 0 keeps no copy of the input (the node saves the output)."""
    x = np.array([-np.inf, -3.0, -0.0, 0.0, 1e-45, -1e-45, 2.0, np.inf, np.nan], dtype=np.float32)
    g = np.arange(1, x.size + 1, dtype=np.float32)
    a, b = _pair(x, device)
    ya = F.leaky_relu(a * 1.0, slope, inplace=inplace)
    yb = torch.nn.functional.leaky_relu(b * 1.0, slope, inplace=inplace and slope >= 0)
    if inplace and slope >= 0:
        node = ya.grad_fn
        assert node.name == "LeakyRelu" and node.saved and all(t._data is ya._data for t in node.saved)
    ya.backward(fg.tensor(g, device=device))
    yb.backward(torch.tensor(g))
    ours, theirs = [host(ya), host(a.grad)], [yb.detach().numpy(), b.grad.numpy()]
    if _gpu(device):
        # GPU kernels flush subnormals to zero and return the canonical NaN: compare values (NaN equal to NaN)
        # away from the two subnormal inputs; the CPU backends are checked bit for bit.
        keep = np.abs(x) != np.float32(1e-45)
        for a_, b_ in zip(ours, theirs):
            np.testing.assert_array_equal(a_[keep], b_[keep])
        return
    bits = lambda v: np.ascontiguousarray(v).view(np.uint32)  # noqa: E731
    for a_, b_ in zip(ours, theirs):
        np.testing.assert_array_equal(bits(a_), bits(b_))


def _gpu(device: str) -> bool:
    """Whether ``device`` computes on a GPU (CUDA, or an OpenCL GPU device such as NVIDIA's)."""
    if device.startswith("cuda"):
        return True
    if device.startswith("opencl"):
        from flowgraph.backends import get_backend

        return bool(get_backend(device)._conv_gpu_tiles)
    return False


def test_inplace_module_flag(device: str):
    x = fg.tensor([-1.0, 2.0], device=device)
    out = nn.ReLU(inplace=True)(x)
    assert out is x and host(x).tolist() == [0.0, 2.0]
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True))


def test_softmax_implicit_dim_like_torch(device: str):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about the implicit dim
        for shape in ((4,), (3, 4), (2, 3, 4)):
            arr = x.reshape(-1)[: int(np.prod(shape))].reshape(shape)
            np.testing.assert_allclose(
                host(F.softmax(fg.tensor(arr, device=device))),
                torch.nn.functional.softmax(torch.tensor(arr)).numpy(),
                rtol=RTOL,
                atol=ATOL,
            )


def test_bad_arguments_raise():
    with pytest.raises(fg.FlowError, match="approximate"):
        nn.GELU("fast")
    with pytest.raises(fg.FlowError, match="min_val"):
        nn.Hardtanh(1.0, -1.0)
    with pytest.raises(fg.ShapeError, match="odd"):
        F.glu(fg.zeros(2, 3))
    with pytest.raises(fg.FlowError, match="num_parameters"):
        nn.PReLU(0)
