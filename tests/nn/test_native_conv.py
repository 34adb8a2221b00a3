"""The native-convolution contract (``Backend.native_conv`` / ``conv_forward`` / ``conv_input_grad`` /
``conv_weight_grad``) as the ``nn`` layer uses it: a backend that says ``native_conv`` gets every convolution and
transposed convolution through those three ops, gradients of any order included.

The backend here is NumPy's with the three ops answered by torch's own convolution and its ``torch.nn.grad``
adjoints (a test-only reference implementation of the contract); results must equal the im2col path of the plain
NumPy backend. The real native backends (cuDNN on CUDA, the OpenCL kernels) run the ordinary convolution tests
against torch on their devices."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph.autograd.gradcheck import gradcheck
from flowgraph.backends.array_backend import NumpyBackend
from flowgraph.nn import functional as F
from flowgraph.tensor.tensor import _wrap

torch = pytest.importorskip("torch")


class TorchConvBackend(NumpyBackend):
    """NumPy, with native convolutions answered by torch (the contract's reference). Counts its calls."""

    def __init__(self):
        super().__init__()
        self.calls = {"forward": 0, "input_grad": 0, "weight_grad": 0}

    def native_conv(self, dtype, nd):
        return dtype.kind == "f"

    @staticmethod
    def _fn(nd, suffix=""):
        return getattr(torch.nn.functional, f"conv{nd}d") if not suffix else getattr(torch.nn.grad,
                                                                                     f"conv{nd}d_{suffix}")

    def conv_forward(self, x, w, stride, padding, dilation, groups):
        self.calls["forward"] += 1
        y = self._fn(x.ndim - 2)(torch.from_numpy(x), torch.from_numpy(w), None, stride, padding, dilation, groups)
        return y.numpy()

    def conv_input_grad(self, g, w, x_shape, stride, padding, dilation, groups):
        self.calls["input_grad"] += 1
        return self._fn(g.ndim - 2, "input")(x_shape, torch.from_numpy(w), torch.from_numpy(g), stride, padding,
                                             dilation, groups).numpy()

    def conv_weight_grad(self, x, g, w_shape, stride, padding, dilation, groups):
        self.calls["weight_grad"] += 1
        return self._fn(x.ndim - 2, "weight")(torch.from_numpy(x), w_shape, torch.from_numpy(g), stride, padding,
                                              dilation, groups).numpy()


class GenericConvBackend(NumpyBackend):
    """NumPy saying ``native_conv`` with the protocol's generic defaults (the batch-last composites per group):
    the fallback a native backend uses for a problem its library refuses."""

    def __init__(self):
        super().__init__()
        self.calls = {"forward": 0, "input_grad": 0, "weight_grad": 0}

    def native_conv(self, dtype, nd):
        return dtype.kind == "f"

    def conv_forward(self, *args):
        self.calls["forward"] += 1
        return super().conv_forward(*args)

    def conv_input_grad(self, *args):
        self.calls["input_grad"] += 1
        return super().conv_input_grad(*args)

    def conv_weight_grad(self, *args):
        self.calls["weight_grad"] += 1
        return super().conv_weight_grad(*args)


BACKENDS = [TorchConvBackend, GenericConvBackend]


def _pair(bk, *arrays):
    """The same arrays as leaf tensors on ``bk`` and on the plain cpu backend."""
    native = [_wrap(a.copy(), bk).requires_grad_(True) for a in arrays]
    plain = [fg.tensor(a.copy(), requires_grad=True) for a in arrays]
    return native, plain


CONV = [  # (nd, C_in, C_out, size, kernel, stride, padding, dilation, groups)
    (1, 4, 6, (9,), (3,), (2,), (1,), (1,), 2),
    (2, 3, 4, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 4, 4, (9, 8), (4, 2), (2, 1), (0, 1), (1, 2), 4),
    (3, 2, 3, (5, 4, 5), (2, 3, 2), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1),
]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("cfg", CONV, ids=lambda c: f"{c[0]}d-g{c[-1]}")
def test_convolution_goes_native_and_matches_im2col(cfg, backend):
    nd, c_in, c_out, size, kernel, stride, padding, dilation, groups = cfg
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c_in) + size)
    w = rng.standard_normal((c_out, c_in // groups) + kernel)
    b = rng.standard_normal(c_out)
    bk = backend()
    conv = getattr(F, f"conv{nd}d")
    (xn, wn, bn), (xp, wp, bp) = _pair(bk, x, w, b)
    yn = conv(xn, wn, bn, stride, padding, dilation, groups)
    yp = conv(xp, wp, bp, stride, padding, dilation, groups)
    np.testing.assert_allclose(yn.detach().numpy(), yp.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(tuple(yp.shape))
    yn.backward(_wrap(g, bk))
    yp.backward(fg.tensor(g))
    for a, p in ((xn, xp), (wn, wp), (bn, bp)):
        np.testing.assert_allclose(a.grad.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-10)
    assert bk.calls == {"forward": 1, "input_grad": 1, "weight_grad": 1}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("output_padding", [0, 1])
def test_transposed_convolution_is_the_input_gradient(output_padding, backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5, 6))
    w = rng.standard_normal((4, 3, 3, 3))  # groups=2: (C_in, C_out / groups, *K)
    bk = backend()
    (xn, wn), (xp, wp) = _pair(bk, x, w)
    kw = dict(stride=2, padding=1, output_padding=output_padding, groups=2)
    yn, yp = F.conv_transpose2d(xn, wn, **kw), F.conv_transpose2d(xp, wp, **kw)
    assert yn.shape == yp.shape
    np.testing.assert_allclose(yn.detach().numpy(), yp.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(tuple(yp.shape))
    yn.backward(_wrap(g, bk))
    yp.backward(fg.tensor(g))
    np.testing.assert_allclose(xn.grad.numpy(), xp.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(wn.grad.numpy(), wp.grad.numpy(), rtol=1e-10, atol=1e-10)
    assert bk.calls == {"forward": 1, "input_grad": 1, "weight_grad": 1}


def test_gradients_of_every_order_stay_native():
    rng = np.random.default_rng(2)
    bk = TorchConvBackend()
    (xn, wn, vn), (xp, wp, vp) = _pair(bk, rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)),
                                       rng.standard_normal((1, 2, 5, 5)))

    def second(x, w, v):  # d/d(x, w) of <d/dx sum(conv(x, w)^2), v>: through D's and W's own backward
        y = F.conv2d(x, w, stride=2, padding=1)
        one = _wrap(np.ones(()), x._backend)  # the seed on the tensors' own backend instance
        (gx,) = fg.autograd.grad((y * y).sum(), (x,), one, create_graph=True)
        return fg.autograd.grad((gx * v).sum(), (x, w), one)

    for a, p in zip(second(xn, wn, vn), second(xp, wp, vp)):
        np.testing.assert_allclose(a.detach().numpy(), p.detach().numpy(), rtol=1e-10, atol=1e-10)
    assert bk.calls["forward"] >= 2 and bk.calls["input_grad"] >= 2 and bk.calls["weight_grad"] >= 1


def test_native_ops_pass_gradcheck(monkeypatch):
    """The three native ops' backward formulas against finite differences (the cpu backend instance itself
    answers the contract here, through the reference methods, so gradcheck's own tensors share its backend)."""
    from flowgraph.backends import get_backend
    from flowgraph.nn.conv import _native_forward, _native_forward_bias, _native_input_grad, _native_weight_grad

    ref = TorchConvBackend()
    cpu = get_backend("cpu")
    for name in ("native_conv", "conv_forward", "conv_input_grad", "conv_weight_grad"):
        monkeypatch.setattr(cpu, name, getattr(ref, name))
    rng = np.random.default_rng(4)
    geometry = ((2, 1), (1, 0), (1, 2), 1)
    x = fg.tensor(rng.standard_normal((1, 2, 6, 5)), requires_grad=True)
    w = fg.tensor(rng.standard_normal((3, 2, 3, 2)), requires_grad=True)
    g = fg.tensor(rng.standard_normal((1, 3, 3, 3)), requires_grad=True)
    assert gradcheck(lambda x, w: _native_forward(x, w, geometry), (x, w))
    assert gradcheck(lambda g, w: _native_input_grad(g, w, (1, 2, 6, 5), geometry), (g, w))
    assert gradcheck(lambda x, g: _native_weight_grad(x, g, (3, 2, 3, 2), geometry), (x, g))
    assert gradcheck(lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (x, w))
    b = fg.tensor(rng.standard_normal(3), requires_grad=True)
    assert gradcheck(lambda x, w, b: _native_forward_bias(x, w, b, geometry), (x, w, b))
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (x, w, b))
    assert all(ref.calls.values())


def test_asymmetric_padding_and_other_padding_modes_keep_the_im2col_path():
    rng = np.random.default_rng(3)
    bk = TorchConvBackend()
    x = _wrap(rng.standard_normal((1, 2, 6, 6)), bk)
    w = _wrap(rng.standard_normal((2, 2, 2, 2)), bk)
    F.conv2d(x, w, padding="same")  # even kernel: one more on the right
    layer = fg.nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
    layer.weight = fg.nn.Parameter(_wrap(rng.standard_normal((2, 2, 3, 3)), bk))
    layer.bias = None
    layer(x)
    assert bk.calls["forward"] == 0


def _cuda_or_skip():
    from flowgraph.backends import available_devices

    if not any(d.startswith("cuda") for d in available_devices()):
        pytest.skip("no CUDA device: the cuDNN path runs on the GPU machine")
    if not fg.backends.cudnn.is_available():
        pytest.skip(f"cuDNN is not available: {fg.backends.cudnn.unavailable_reason()}")


CUDNN_CONV = [  # (nd, C_in, C_out, size, kernel, stride, padding, dilation, groups, transposed)
    (2, 3, 8, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    (2, 8, 8, (9, 9), (4, 4), (2, 2), (1, 1), (1, 1), 8, False),
    (2, 4, 6, (8, 7), (3, 2), (2, 1), (0, 1), (2, 1), 2, False),
    (1, 4, 6, (11,), (5,), (2,), (2,), (1,), 1, False),
    (2, 6, 4, (5, 6), (4, 4), (2, 2), (1, 1), (1, 1), 2, True),
]


@pytest.mark.parametrize("enabled", [True, False], ids=["cudnn", "no-cudnn"])
@pytest.mark.parametrize("cfg", CUDNN_CONV, ids=lambda c: f"{c[0]}d-g{c[8]}{'-T' if c[9] else ''}")
def test_cuda_convolutions_with_and_without_cudnn_match_torch(cfg, enabled):
    """cuda only: cuDNN on (TF32 off, exact float32) and off give torch's forward and both gradients."""
    _cuda_or_skip()
    nd, c_in, c_out, size, kernel, stride, padding, dilation, groups, transposed = cfg
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, c_in) + size).astype(np.float32)
    wshape = (c_in, c_out // groups) + kernel if transposed else (c_out, c_in // groups) + kernel
    w = rng.standard_normal(wshape).astype(np.float32)
    name = f"conv_transpose{nd}d" if transposed else f"conv{nd}d"
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = getattr(torch.nn.functional, name)(tx, tw, **kw)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.tensor(g))
    saved = fg.backends.cudnn.enabled, fg.backends.cudnn.allow_tf32
    fg.backends.cudnn.enabled, fg.backends.cudnn.allow_tf32 = enabled, False
    try:
        fx = fg.tensor(x, device="cuda", requires_grad=True)
        fw = fg.tensor(w, device="cuda", requires_grad=True)
        fy = getattr(F, name)(fx, fw, **kw)
        fy.backward(fg.tensor(g, device="cuda"))
        if enabled:
            assert fy.grad_fn is not None and "Convolution" in type(fy.grad_fn).__name__ + str(fy.grad_fn)
    finally:
        fg.backends.cudnn.enabled, fg.backends.cudnn.allow_tf32 = saved
    np.testing.assert_allclose(fy.detach().cpu().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fx.grad.cpu().numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fw.grad.cpu().numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_cudnn_plans_execute_natively_with_the_public_calls_result():
    """cuda only: the plans a float32 convolution builds (fprop, dgrad, wgrad) run through the frontend's native
    entry point, and the public ``execute`` of the same plan gives the same result."""
    _cuda_or_skip()
    import cupy

    bk = fg.get_backend("cuda")
    rng = np.random.default_rng(3)
    x = fg.tensor(rng.standard_normal((2, 3, 9, 8)).astype(np.float32), device="cuda", requires_grad=True)
    w = fg.tensor(rng.standard_normal((5, 3, 3, 3)).astype(np.float32), device="cuda", requires_grad=True)
    F.conv2d(x, w, padding=1).sum().backward()
    cd = bk.cudnn()
    plans = {key[0]: p for key, p in cd.plans.items()
             if key[0] in ("fprop", "dgrad", "wgrad") and key[4] == "float32"
             and key[1] in ((2, 3, 9, 8), (2, 5, 9, 8)) and key[2] in ((5, 3, 3, 3), (2, 5, 9, 8), (2, 3, 9, 8))}
    assert set(plans) == {"fprop", "dgrad", "wgrad"}
    for op, plan in plans.items():
        assert plan.native is not None, op
        ins = {role: cupy.asarray(rng.standard_normal(t.get_dim()).astype(np.float32))
               for role, t in plan.tensors.items() if role != "y"}
        outs = [cupy.full(plan.tensors["y"].get_dim(), np.nan, dtype=cupy.float32) for _ in range(2)]
        ptrs = {role: a.data.ptr for role, a in ins.items()}
        cd._execute(plan, {**ptrs, "y": outs[0].data.ptr})
        plan.graph.execute({plan.tensors[r]: p for r, p in {**ptrs, "y": outs[1].data.ptr}.items()},
                           cd._reserve(plan.workspace), handle=cd.handle)
        first, second = (cupy.asnumpy(o) for o in outs)
        assert not np.isnan(first).any(), op
        np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-5, err_msg=op)


def test_native_cudnn_execute_falls_back_to_the_public_call():
    """A frontend without the native entry point, a plan served by one of its Python engines, or a graph with
    inputs bound by itself get no native call: the public ``execute`` runs them."""
    from flowgraph.backends.cuda import cudnn as cudnn_mod

    class Cfg:
        cpp_index = 4

    class Lowered:
        def __init__(self):
            self.calls = []

        def _execute_plan_at_index(self, *args):
            self.calls.append(args)

    class Graph:
        selected_engine = None
        _data_bindings: dict = {}
        _plan_index = 4

        def __init__(self):
            self._lowered_graph = Lowered()

        def _materialize_backend_plan(self, index):
            assert index == 4
            return Cfg()

    class Handle:
        backend_handle = 1234

    g = Graph()
    run = cudnn_mod._native_execute(g, Handle())
    run({1: 10, 2: 20}, 99)
    assert g._lowered_graph.calls == [({1: 10, 2: 20}, 99, 4, 1234, None, None, None)]
    python_engine = Graph()
    python_engine.selected_engine = object()
    bound = Graph()
    bound._data_bindings = {7: 0.5}
    old = Graph()
    del old._lowered_graph
    assert cudnn_mod._native_execute(python_engine, Handle()) is None
    assert cudnn_mod._native_execute(bound, Handle()) is None
    assert cudnn_mod._native_execute(old, Handle()) is None
