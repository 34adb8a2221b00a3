"""Native convolutions on the backends that have them (the OpenCL implicit-GEMM kernels; cuDNN where a CUDA backend
says ``native_conv``): every configuration of ``nn`` convolutions and transposed convolutions against PyTorch,
forward and both gradients, in float64 and float32; the backend ops themselves on lazy and offset operands, the
weight gradient's split-K path, their errors, the memory they keep (no im2col buffer), one compiled kernel per rank
serving every shape, and a convolutional step under ``fg.jit``. Skipped on backends without native convolutions
(NumPy: its im2col path is tested in test_conv_gemm.py and test_layers.py)."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.backends import get_backend
from flowgraph.errors import BackendError, ShapeError
from flowgraph.nn import functional as F
from tests.training import train

torch = pytest.importorskip("torch")

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)


def _opencl_backend(device, dtype, nd):
    """The OpenCL backend with native ``dtype`` ``nd``-d convolutions, or a skip (the test reads the OpenCL
    kernels' own splits, index widths, error texts or compile counters; cuDNN has its own tests)."""
    if not str(device).startswith("opencl"):
        pytest.skip(f"{device}: the test reads the OpenCL convolution kernels' internals")
    return _native_backend(device, dtype, nd)


def _native_backend(device, dtype, nd):
    """The device's backend, or a skip where it has no native convolution of ``dtype`` in ``nd`` dims."""
    be = get_backend(device)
    if not be.native_conv(np.dtype(dtype), nd):
        pytest.skip(f"{device} has no native {np.dtype(dtype)} {nd}-d convolution")
    return be


def _count_native_calls(be, monkeypatch):
    """Count the backend's native-convolution calls (proof that the layer took the native path)."""
    calls = {"forward": 0, "input_grad": 0, "weight_grad": 0}
    for name in calls:
        method = getattr(be, f"conv_{name}")

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(be, f"conv_{name}", counted)
    biased = be.conv_forward_bias

    def counted_biased(*args, **kwargs):  # a biased forward: one forward, whether or not it calls conv_forward
        before = calls["forward"]
        out = biased(*args, **kwargs)
        if calls["forward"] == before:
            calls["forward"] += 1
        return out

    monkeypatch.setattr(be, "conv_forward_bias", counted_biased)
    return calls


def _tol(dtype):
    return dict(rtol=1e-9, atol=1e-9) if dtype == F64 else dict(rtol=2e-4, atol=2e-4)


CONV = {  # name: (nd, N, C_in, C_out, size, kernel, stride, padding, dilation, groups)
    "1d": (1, 2, 3, 5, (11,), (3,), 1, 1, 1, 1),
    "1d-stride-dilation-groups": (1, 2, 4, 6, (13,), (3,), 2, 2, 2, 2),
    "2d": (2, 2, 3, 4, (7, 6), (3, 3), 1, 1, 1, 1),
    "2d-1x1": (2, 3, 5, 7, (5, 4), (1, 1), 1, 0, 1, 1),
    "2d-stride2-pad1": (2, 2, 3, 4, (9, 8), (3, 3), 2, 1, 1, 1),
    "2d-dilation": (2, 2, 2, 3, (9, 10), (3, 2), 1, (2, 1), (2, 3), 1),
    "2d-groups": (2, 2, 6, 4, (7, 7), (3, 3), 1, 1, 1, 2),
    "2d-depthwise": (2, 2, 4, 8, (8, 7), (3, 3), (2, 1), 1, 1, 4),
    "2d-depthwise-multiplier1": (2, 3, 5, 5, (9, 7), (3, 3), 1, 1, 1, 5),
    "2d-batch1-odd": (2, 1, 3, 5, (13, 11), (5, 3), (3, 2), (2, 0), 1, 1),
    "2d-wide": (2, 2, 40, 36, (6, 6), (3, 3), 1, 1, 1, 1),
    "3d": (3, 2, 2, 3, (5, 4, 6), (2, 3, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1),
    "3d-groups": (3, 1, 4, 2, (4, 5, 3), (3, 1, 2), 1, (1, 0, 1), 1, 2),
}


def _conv_case(device, cfg, dtype, monkeypatch):
    nd, n, c_in, c_out, size, kernel, stride, padding, dilation, groups = cfg
    be = _native_backend(device, dtype, nd)
    calls = _count_native_calls(be, monkeypatch)
    rng = np.random.default_rng(sum(size) + c_out)
    x = rng.standard_normal((n, c_in) + size).astype(dtype)
    w = rng.standard_normal((c_out, c_in // groups) + kernel).astype(dtype)
    b = rng.standard_normal(c_out).astype(dtype)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = getattr(torch.nn.functional, f"conv{nd}d")(tx, tw, tb, **kw)
    g = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.tensor(g))
    fx, fw, fb = (fg.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    fy = getattr(F, f"conv{nd}d")(fx, fw, fb, **kw)
    fy.backward(fg.tensor(g, device=device))
    tol = _tol(dtype)
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), **tol)
    for mine, ref in ((fx, tx), (fw, tw), (fb, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), **tol)
    assert calls == {"forward": 1, "input_grad": 1, "weight_grad": 1}


@pytest.mark.parametrize("name", list(CONV))
def test_convolution_matches_torch_float64(device, name, monkeypatch):
    _conv_case(device, CONV[name], F64, monkeypatch)


@pytest.mark.parametrize("name", ["1d-stride-dilation-groups", "2d-depthwise", "2d-depthwise-multiplier1", "2d-wide",
                                  "3d"])
def test_convolution_matches_torch_float32(device, name, monkeypatch):
    _conv_case(device, CONV[name], F32, monkeypatch)


FUSED_BIAS = {  # name: CONV's layout; problems the H200's cuDNN took as one conv_fprop + bias graph in float32
    "1d": (1, 2, 4, 6, (11,), (5,), 2, 2, 1, 1),
    "2d": (2, 2, 3, 8, (9, 8), (3, 3), 1, 1, 1, 1),
}


@pytest.mark.parametrize("name", list(FUSED_BIAS))
def test_cuda_biased_convolution_is_one_cudnn_graph(device, name, monkeypatch):
    """cuda only: a biased float32 convolution (TF32 off) builds one cuDNN graph, conv_fprop + bias, and gives
    torch's output and gradients (``_conv_case``)."""
    if not device.startswith("cuda"):
        pytest.skip("the fused conv+bias graph is cuDNN's")
    _conv_case(device, FUSED_BIAS[name], F32, monkeypatch)
    plans = get_backend(device).cudnn().plans
    assert any(key[0] == "fprop" and key[-1] and key[4] == "float32" for key in plans)


def _spy_launches(be, monkeypatch, flag):
    """The ``(op, flag(kwargs))`` of every ``_conv_launch`` on ``be`` from now on (a list that fills as they run)."""
    launches = []
    launch = be._conv_launch

    def spy(op, *args, **kwargs):
        launches.append((op, flag(kwargs)))
        return launch(op, *args, **kwargs)

    monkeypatch.setattr(be, "_conv_launch", spy)
    return launches


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(FUSED_BIAS))
def test_opencl_biased_convolution_adds_the_bias_in_the_forward_kernel(device, name, dtype, monkeypatch):
    """OpenCL: a biased convolution's forward is one kernel launch that adds the bias as it stores the result
    (``conv_forward_bias``), with torch's output and gradients (``_conv_case``); a split forward (a long
    reduction into a small output) adds it afterwards instead."""
    be = _opencl_backend(device, dtype, FUSED_BIAS[name][0])
    launches = _spy_launches(be, monkeypatch, lambda kwargs: kwargs.get("bias") is not None)
    _conv_case(device, FUSED_BIAS[name], dtype, monkeypatch)
    assert launches.count(("forward", True)) == 1 and ("forward", False) not in launches
    launches.clear()
    x = fg.tensor(np.ones((1, 2, 300, 300), dtype), device=device)
    w, b = fg.tensor(np.ones((1, 2, 3, 3), dtype), device=device), fg.tensor(np.full(1, 0.5, dtype), device=device)
    monkeypatch.setattr(be, "_conv_splits", lambda *a: (2, 9))  # a forward split in two: the generic add
    y = F.conv2d(x, w, b, stride=100)
    np.testing.assert_allclose(y.numpy(), np.full((1, 1, 3, 3), 18.5))
    assert ("forward", False) in launches and ("forward", True) not in launches


KERNEL_VARIANTS = {  # name: (op, its _conv_launch keyword, CONV's layout where op takes that variant)
    # the forward reads channels innermost with a multiple of 16 input channels per group
    "forward-channels-inner-2d": ("forward", "channels_inner", (2, 2, 16, 8, (7, 6), (3, 3), 1, 1, 1, 1)),
    "forward-channels-inner-2d-stride-dilation-groups": (
        "forward", "channels_inner", (2, 2, 32, 6, (9, 8), (3, 2), (2, 1), (1, 2), (1, 2), 2)),
    "forward-channels-inner-1d": ("forward", "channels_inner", (1, 2, 48, 5, (11,), (5,), 2, 2, 1, 1)),
    "forward-channels-inner-3d": (
        "forward", "channels_inner", (3, 1, 16, 4, (4, 5, 3), (2, 3, 2), 1, (1, 0, 1), 1, 1)),
    # a small output over a long reduction: split-K
    "forward-channels-inner-2d-split": ("forward", "channels_inner", (2, 1, 64, 3, (2, 2), (3, 3), 1, 1, 1, 1)),
    # the weight gradient reads runs of output positions where the output's last size is a multiple of 16
    "wgrad-row-runs-2d": ("wgrad", "row_runs", (2, 2, 3, 4, (6, 16), (3, 3), 1, 1, 1, 1)),
    "wgrad-row-runs-2d-stride-dilation-groups": (
        "wgrad", "row_runs", (2, 2, 4, 6, (5, 32), (3, 3), (1, 2), (1, 2), (1, 2), 2)),
    "wgrad-row-runs-1d": ("wgrad", "row_runs", (1, 2, 3, 5, (36,), (5,), 1, 0, 1, 1)),
    "wgrad-row-runs-3d": ("wgrad", "row_runs", (3, 1, 2, 3, (3, 2, 16), (2, 3, 3), 1, (0, 1, 1), 1, 1)),
    # a small weight over a long reduction: split-K
    "wgrad-row-runs-2d-split": ("wgrad", "row_runs", (2, 8, 2, 3, (8, 32), (3, 3), 1, 1, 1, 1)),
    # ... or whole rows where the last size divides 16 and a step stays in one plane (convnet's 8x8, 4x4 layers)
    "wgrad-whole-rows-2d-8x8": ("wgrad", "row_runs", (2, 3, 4, 5, (8, 8), (3, 3), 1, 1, 1, 1)),
    "wgrad-whole-rows-2d-4x4-split": ("wgrad", "row_runs", (2, 8, 3, 2, (4, 4), (3, 3), 1, 1, 1, 1)),
    "wgrad-whole-rows-2d-stride-dilation-groups": (
        "wgrad", "row_runs", (2, 2, 4, 6, (15, 4), (3, 2), (2, 3), (2, 1), (2, 1), 2)),
    "wgrad-whole-rows-2d-width1": ("wgrad", "row_runs", (2, 2, 3, 4, (16, 3), (3, 3), 1, (1, 0), 1, 1)),
    "wgrad-whole-rows-3d": ("wgrad", "row_runs", (3, 1, 2, 3, (3, 4, 4), (2, 3, 3), 1, (0, 1, 1), 1, 1)),
}


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(KERNEL_VARIANTS))
def test_opencl_convolution_takes_its_table_free_variant(device, name, dtype, monkeypatch):
    """OpenCL: where a layout allows it the forward runs its reduction channels innermost (the weight copied to
    ``(C_out, *K, C_in / groups)``) and the weight gradient reads each K step as one run of consecutive output
    positions, neither with a row table; with torch's output and gradients."""
    op, keyword, cfg = KERNEL_VARIANTS[name]
    be = _opencl_backend(device, dtype, cfg[0])
    launches = _spy_launches(be, monkeypatch, lambda kwargs: kwargs.get(keyword, False))
    _conv_case(device, cfg, dtype, monkeypatch)
    assert (op, True) in launches and (op, False) not in launches


INPUT_GRAD_CHANNELS_INNER = {  # name: CONV's layout, with a multiple of 16 output channels per group (the input
    # gradient reads channels innermost)
    "2d": (2, 2, 3, 16, (7, 6), (3, 3), 1, 1, 1, 1),
    "2d-stride2-pad2": (2, 2, 4, 32, (9, 8), (3, 3), 2, 2, 1, 1),
    "2d-dilation-groups": (2, 2, 6, 32, (9, 10), (3, 2), 1, (2, 1), 2, 2),
    "2d-stride2-dilation2-pad0-groups": (2, 1, 4, 64, (11, 9), (3, 3), 2, 0, 2, 2),  # phases without offsets
    "1d-stride2": (1, 2, 5, 16, (13,), (4,), 2, 1, 1, 1),
    "3d": (3, 1, 2, 16, (4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 0, 1), 1, 1),
    "3d-stride2-groups": (3, 2, 4, 32, (5, 4, 4), (3, 2, 2), 2, 1, (1, 2, 1), 2),
}


@pytest.mark.parametrize("dtype, index", [(F64, "int32"), (F32, "int32"), (F64, "int64")],
                         ids=["float64", "float32", "float64-int64"])
@pytest.mark.parametrize("name", list(INPUT_GRAD_CHANNELS_INNER))
def test_opencl_input_grad_reads_channels_innermost(device, name, dtype, index, monkeypatch):
    """OpenCL: with a multiple of 16 output channels per group, the input gradient runs its reduction channels
    innermost in every stride phase (the weight copied to ``(groups, C_in / groups, *K, C_out / groups)``),
    in the int32 and the int64 index variant, with torch's output and gradients."""
    cfg = INPUT_GRAD_CHANNELS_INNER[name]
    be = _opencl_backend(device, dtype, cfg[0])
    if index == "int64":
        monkeypatch.setattr(be, "CONV_INT32_LIMIT", 16)
    monkeypatch.setitem(be.__dict__, "_conv_choice", {})  # the kernels this test chooses, by their cache keys
    _conv_case(device, cfg, dtype, monkeypatch)
    chosen = {(key[0], key[3], key[7]) for key in be._conv_choice}  # (op, index dtype, channels_inner)
    assert ("dgrad", np.dtype(index), True) in chosen
    assert not any(op == "dgrad" and not inner for op, _, inner in chosen)


@pytest.mark.parametrize("shape", ["huge", "tall", "mid", "short", "single"])
def test_gpu_tile_table_input_grad_channels_inner(device, shape, monkeypatch):
    """The channels-inner input gradient with the GPU tile configurations on whatever device this is."""
    be = _opencl_backend(device, F32, 2)
    monkeypatch.setattr(type(be), "_conv_gpu_tiles", property(lambda self: True))
    monkeypatch.setattr(type(be), "_compute_units", property(lambda self: 1))
    monkeypatch.setitem(be.__dict__, "_conv_choice", {})
    c_in = {"huge": 130, "tall": 40, "mid": 12, "short": 5, "single": 2}[shape]
    groups = 2 if shape == "single" else 1
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, c_in, 11, 9)).astype(np.float32)
    w = rng.standard_normal((32, c_in // groups, 3, 3)).astype(np.float32)
    g = rng.standard_normal((2, 32, 11, 9)).astype(np.float32)
    geometry = ((1, 1), (1, 1), (1, 1), groups)
    gx = be.to_host(be.conv_input_grad(be.from_host(g), be.from_host(w), x.shape, *geometry))
    np.testing.assert_allclose(gx, _torch_grads(x, w, g, *geometry)[0], rtol=1e-4, atol=1e-4)
    assert {(key[0], key[4], key[7], key[-1]) for key in be._conv_choice} == {("dgrad", shape, True, True)}


@pytest.mark.parametrize("op", ["forward", "dgrad"])
def test_channels_inner_sources_read_no_row_table(op):
    """A channels-inner kernel (scalar or TF32, int32 or int64 indices) builds no row or A-offset table: each K
    step's kernel offset and bounds test are worked out once per work-item; the weight gradient has no such
    variant, and only the forward adds a bias."""
    from flowgraph.backends.opencl import conv as CK

    for itype in (np.int32, np.int64):
        for tiles, tf32 in ((CK.CPU_TILES["tall"], False), (CK.GPU_TF32_TILES[op]["tall"], True)):
            source = CK.conv_source(op, 2, F32, F32, np.dtype(itype), tiles, tf32, channels_inner=True).source
            assert "Rt[" not in source and "Aoff" not in source and "in_window" in source
            assert ("mma.sync" in source) == tf32
    with pytest.raises(ValueError, match="channels_inner"):
        CK.conv_source("wgrad", 2, F32, F32, np.dtype(np.int32), CK.CPU_TILES["tall"], channels_inner=True)
    with pytest.raises(ValueError, match="bias"):
        CK.conv_source("dgrad", 2, F32, F32, np.dtype(np.int32), CK.CPU_TILES["tall"], bias=True)


TRANSPOSED = {  # name: (nd, N, C_in, C_out, size, kernel, stride, padding, output_padding, dilation, groups)
    "1d": (1, 2, 3, 4, (7,), (3,), 2, 1, 1, 1, 1),
    "2d-output-padding": (2, 2, 4, 3, (5, 4), (3, 3), 2, 1, 1, 1, 1),
    "2d-groups-dilation": (2, 1, 4, 6, (4, 5), (2, 3), (2, 1), (0, 1), (1, 0), (1, 2), 2),
    "3d": (3, 1, 2, 3, (3, 4, 3), (2, 2, 3), (2, 1, 2), (1, 0, 1), (1, 0, 0), 1, 1),
    "2d-from-1x1": (2, 3, 5, 4, (1, 1), (4, 3), 1, 0, 0, 1, 1),  # one window: the input gradient is a matmul
}


@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_transposed_convolution_matches_torch(device, name, monkeypatch):
    nd, n, c_in, c_out, size, kernel, stride, padding, output_padding, dilation, groups = TRANSPOSED[name]
    be = _native_backend(device, F64, nd)
    calls = _count_native_calls(be, monkeypatch)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c_in) + size)
    w = rng.standard_normal((c_in, c_out // groups) + kernel)
    b = rng.standard_normal(c_out)
    kw = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = getattr(torch.nn.functional, f"conv_transpose{nd}d")(tx, tw, tb, **kw)
    g = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    fx, fw, fb = (fg.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    fy = getattr(F, f"conv_transpose{nd}d")(fx, fw, fb, **kw)
    assert tuple(fy.shape) == tuple(ty.shape)
    fy.backward(fg.tensor(g, device=device))
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), rtol=1e-9, atol=1e-9)
    for mine, ref in ((fx, tx), (fw, tw), (fb, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), rtol=1e-9, atol=1e-9)
    # a transposed convolution is the input gradient; its backward is the forward and the weight gradient
    assert calls == {"forward": 1, "input_grad": 1, "weight_grad": 1}


def _torch_grads(x, w, g, stride, padding, dilation, groups):
    nd = x.ndim - 2
    tw, tg = torch.tensor(w), torch.tensor(g)
    gx = getattr(torch.nn.grad, f"conv{nd}d_input")(x.shape, tw, tg, stride, padding, dilation, groups)
    gw = getattr(torch.nn.grad, f"conv{nd}d_weight")(torch.tensor(x), w.shape, tg, stride, padding, dilation, groups)
    return gx.numpy(), gw.numpy()


@pytest.mark.parametrize("shape", ["huge", "tall", "mid", "short", "single"])
def test_gpu_tile_table_computes_the_same(device, shape, monkeypatch):
    """The GPU tile configurations (128x128, 64x64, 32x64, 16x128) on whatever device this is: the tile
    choice decides speed only, never results."""
    be = _native_backend(device, F32, 2)
    if not hasattr(type(be), "_conv_gpu_tiles"):
        pytest.skip(f"{device} has no OpenCL tile tables")
    monkeypatch.setattr(type(be), "_conv_gpu_tiles", property(lambda self: True))
    monkeypatch.setattr(type(be), "_compute_units", property(lambda self: 1))
    c_out = {"huge": 130, "tall": 40, "mid": 12, "short": 5, "single": 1}[shape]
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 6, 11, 9)).astype(np.float32)
    w = rng.standard_normal((c_out, 6, 3, 3)).astype(np.float32)
    g = rng.standard_normal((2, c_out, 11, 9)).astype(np.float32)
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    y = be.to_host(be.conv_forward(be.from_host(x), be.from_host(w), *geometry))
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), None, *geometry).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    gx_ref, gw_ref = _torch_grads(x, w, g, *geometry)
    np.testing.assert_allclose(be.to_host(be.conv_input_grad(be.from_host(g), be.from_host(w), x.shape, *geometry)),
                               gx_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(be.to_host(be.conv_weight_grad(be.from_host(x), be.from_host(g), w.shape, *geometry)),
                               gw_ref, rtol=1e-4, atol=1e-4)
    assert any(key[-1] for key in be._conv_choice)  # the GPU table was used


PHASES = [  # (size, kernel, stride, padding, dilation): the input gradient's stride phases
    ((10,), (1,), (3,), (0,), (1,)),         # positions no kernel offset reaches get zeros
    ((11,), (2,), (4,), (1,), (1,)),         # stride above the kernel
    ((12,), (3,), (2,), (2,), (2,)),         # stride and dilation share a factor: half the phases have no offsets
    ((13,), (4,), (3,), (1,), (2,)),         # coprime stride and dilation
    ((9, 10), (3, 4), (2, 3), (1, 2), (1, 1)),
    ((7, 8), (2, 3), (3, 2), (0, 1), (2, 3)),
]


@pytest.mark.parametrize("cfg", PHASES, ids=lambda c: f"s{c[2]}-d{c[4]}-k{c[1]}")
def test_input_gradient_stride_phases_match_torch(device, cfg):
    size, kernel, stride, padding, dilation = cfg
    be = _native_backend(device, F64, len(size))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 4) + size)
    w = rng.standard_normal((6, 2) + kernel)
    out = getattr(torch.nn.functional, f"conv{len(size)}d")(torch.tensor(x), torch.tensor(w), None, stride, padding,
                                                             dilation, 2)
    g = rng.standard_normal(tuple(out.shape))
    gx = be.to_host(be.conv_input_grad(be.from_host(g), be.from_host(w), x.shape, stride, padding, dilation, 2))
    np.testing.assert_allclose(gx, _torch_grads(x, w, g, stride, padding, dilation, 2)[0], rtol=1e-9, atol=1e-9)


def test_weight_gradient_split_k_matches_torch(device):
    """A small weight over a long reduction (batch x output positions) runs as split-K plus a sum."""
    be = _opencl_backend(device, F64, 2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3, 24, 20))
    w = rng.standard_normal((4, 3, 3, 3))
    g = rng.standard_normal((6, 4, 24, 20))
    splits, chunk = be._conv_splits("wgrad", 4, 27, 6 * 24 * 20, 1, F64)
    assert splits > 1 and (splits - 1) * chunk < 6 * 24 * 20 <= splits * chunk
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    gw = be.to_host(be.conv_weight_grad(be.from_host(x), be.from_host(g), w.shape, *geometry))
    np.testing.assert_allclose(gw, _torch_grads(x, w, g, *geometry)[1], rtol=1e-9, atol=1e-9)


def test_gpu_split_k_fills_its_waves(device, monkeypatch):
    """On a GPU of 132 compute units (two 256-item work-groups resident on each) the weight gradients of the
    benchmark's convnet split so that no wave of work-groups runs nearly empty: 64 -> 128 channels at 32x32
    (9 tiles, K = 131,072) took 30 splits, 270 work-groups on 264 slots, 1.3x slower than 24-29; the 4x4
    layer (288 tiles) ran unsplit in two waves, the second of 24 work-groups."""
    be = _opencl_backend(device, F32, 2)
    monkeypatch.setattr(type(be), "_conv_gpu_tiles", property(lambda self: True))
    monkeypatch.setattr(type(be), "_compute_units", property(lambda self: 132))
    monkeypatch.setattr(type(be), "_tf32_tensor_cores", property(lambda self: True))
    monkeypatch.setattr(be, "_max_group", 1024)
    be.__dict__.pop("_split_choice", None)
    slots = 132 * 2
    for c_in, c_out, side in ((64, 128, 32), (128, 256, 16), (256, 512, 8), (512, 512, 4)):
        m, n, k = c_out, c_in * 9, 128 * side * side
        splits, chunk = be._conv_splits("wgrad", m, n, k, 1, F32)
        assert (splits - 1) * chunk < k <= splits * chunk
        blocks = -(-m // 128) * -(-n // 64) * splits  # the TF32 weight gradient's 128 x 64 tiles
        # split, and either three or more waves or a last wave at least half full
        assert splits > 1 and (blocks >= 3 * slots or blocks % slots in range(slots // 2, slots) or
                                blocks % slots == 0), (c_in, splits, blocks)
    assert be._conv_splits("wgrad", 128, 576, 131072, 1, F32)[0] <= 29  # 9 tiles: one wave of 264
    be.__dict__.pop("_split_choice", None)


def test_forward_split_k_matches_torch(device):
    """A small output (batch 1, a 2x2 map) over a long reduction (many channels) splits too."""
    be = _opencl_backend(device, F64, 2)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 96, 4, 4))
    w = rng.standard_normal((5, 96, 3, 3))
    splits, _ = be._conv_splits("forward", 5, 4, 96 * 9, 1, F64)
    assert splits > 1
    y = be.to_host(be.conv_forward(be.from_host(x), be.from_host(w), (2, 2), (1, 1), (1, 1), 1))
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), None, 2, 1).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9)


def test_backend_ops_take_lazy_and_offset_operands(device):
    be = _native_backend(device, F64, 2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2, 6, 5))
    w = rng.standard_normal((4, 2, 3, 3))
    g = rng.standard_normal((2, 4, 3, 3))
    geometry = ((2, 2), (1, 1), (1, 1), 1)
    lazy_x = be.mul(be.from_host(x), 2.0)  # a pending elementwise expression
    offset_x = be.slice(be.from_host(x), (slice(1, 3),))  # a row-major view at an offset
    lazy_w, lazy_g = be.add(be.from_host(w), 0.0), be.mul(be.from_host(g), 1.0)
    y = be.to_host(be.conv_forward(lazy_x, lazy_w, *geometry))
    ref = torch.nn.functional.conv2d(torch.tensor(2 * x), torch.tensor(w), None, *geometry).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9)
    gx_ref, gw_ref = _torch_grads(x[1:3], w, g, *geometry)
    gx = be.to_host(be.conv_input_grad(lazy_g, lazy_w, (2, 2, 6, 5), *geometry))
    gw = be.to_host(be.conv_weight_grad(offset_x, lazy_g, w.shape, *geometry))
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-9, atol=1e-9)


def test_int64_indexing_and_empty_batch(device, monkeypatch):
    """The int64-index variant (taken by convolutions past 2**31 elements) computes the same; an empty batch
    gives an empty output and a zero weight gradient."""
    be = _opencl_backend(device, F64, 2)
    monkeypatch.setattr(be, "CONV_INT32_LIMIT", 16)
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 2))
    g = rng.standard_normal((2, 6, 4, 5))
    geometry = ((2, 1), (1, 0), (1, 1), 2)
    y = be.to_host(be.conv_forward(be.from_host(x), be.from_host(w), *geometry))
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), None, *geometry).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9)
    gx_ref, gw_ref = _torch_grads(x, w, g, *geometry)
    gx = be.to_host(be.conv_input_grad(be.from_host(g), be.from_host(w), x.shape, *geometry))
    gw = be.to_host(be.conv_weight_grad(be.from_host(x), be.from_host(g), w.shape, *geometry))
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-9, atol=1e-9)
    empty_x, empty_g = be.from_host(np.zeros((0, 4, 7, 6))), be.from_host(np.zeros((0, 6, 4, 5)))
    assert be.to_host(be.conv_forward(empty_x, be.from_host(w), *geometry)).shape == (0, 6, 4, 5)
    np.testing.assert_array_equal(be.to_host(be.conv_weight_grad(empty_x, empty_g, w.shape, *geometry)), 0)


@pytest.mark.parametrize("nd", [1, 2])
def test_float16_where_the_device_has_it(device, nd):
    be = _native_backend(device, np.float16, nd)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3) + (9,) * nd).astype(np.float16)
    w = rng.standard_normal((4, 3) + (3,) * nd).astype(np.float16)
    geometry = ((1,) * nd, (1,) * nd, (1,) * nd, 1)
    y = be.to_host(be.conv_forward(be.from_host(x), be.from_host(w), *geometry))
    conv = getattr(torch.nn.functional, f"conv{nd}d")
    ref = conv(torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32), None, *geometry)
    np.testing.assert_allclose(y.astype(np.float32), ref.numpy(), rtol=1e-2, atol=1e-2)


def test_backend_op_errors_name_the_problem(device):
    be = _opencl_backend(device, F64, 2)
    x = be.from_host(np.zeros((1, 4, 5, 5)))
    w = be.from_host(np.zeros((6, 4, 3, 3)))
    with pytest.raises(ShapeError, match="groups=3 must divide C_in=4"):
        be.conv_forward(x, w, (1, 1), (0, 0), (1, 1), 3)
    with pytest.raises(ShapeError, match="stride .* must have one entry per spatial dim"):
        be.conv_forward(x, w, (1,), (0, 0), (1, 1), 1)
    with pytest.raises(ShapeError, match="smaller than the kernel's extent"):
        be.conv_forward(x, w, (1, 1), (0, 0), (3, 3), 1)
    with pytest.raises(ShapeError, match=r"g has shape \(1, 6, 2, 2\); this convolution's output is \(1, 6, 3, 3\)"):
        be.conv_input_grad(be.from_host(np.zeros((1, 6, 2, 2))), w, (1, 4, 5, 5), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(BackendError, match="dtypes float64 and float32"):
        be.conv_forward(x, be.from_host(np.zeros((6, 4, 3, 3), np.float32)), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(BackendError, match="no native convolution for int64"):
        be.conv_forward(be.from_host(np.zeros((1, 4, 5, 5), np.int64)), be.from_host(np.zeros((6, 4, 3, 3),
                        np.int64)), (1, 1), (0, 0), (1, 1), 1)


def test_forward_allocates_its_output_only(device):
    """No im2col buffer: the forward's peak allocation is its output (im2col would be 9x the input here)."""
    be = _native_backend(device, F32, 2)
    if "peak" not in be.memory_stats():
        pytest.skip(f"{device} does not count allocations")
    x = be.from_host(np.ones((4, 8, 16, 16), np.float32))
    w = be.from_host(np.ones((8, 8, 3, 3), np.float32))
    g = be.from_host(np.ones((4, 8, 16, 16), np.float32))
    for op in (lambda: be.conv_forward(x, w, (1, 1), (1, 1), (1, 1), 1),
               lambda: be.conv_input_grad(g, w, (4, 8, 16, 16), (1, 1), (1, 1), (1, 1), 1)):
        be.synchronize()
        before = be.memory_stats()["allocated"]
        be.reset_peak_memory_stats()
        out = be.realize(op())
        assert be.memory_stats()["peak"] - before <= out.nbytes + 4096 < 9 * 4 * 8 * 16 * 16 * 4


def test_one_kernel_per_rank_serves_every_shape(device):
    be = _opencl_backend(device, F64, 2)
    rng = np.random.default_rng(5)

    def run(n, c, size, k, stride):
        x = be.from_host(rng.standard_normal((n, c) + size))
        w = be.from_host(rng.standard_normal((c + 1, c) + k))
        be.to_host(be.conv_forward(x, w, stride, (1, 0), (1, 1), 1))

    run(2, 3, (9, 7), (3, 3), (1, 1))
    compiled = be.compile_stats()["compiled"]
    run(3, 5, (12, 5), (2, 3), (2, 1))  # other sizes, kernel, stride: the same binary
    run(1, 6, (6, 9), (3, 1), (1, 2))
    assert be.compile_stats()["compiled"] == compiled


def test_tile_choice_fits_the_device():
    from flowgraph.backends.opencl.conv import choose_tiles, tile_class

    for is_gpu in (True, False):
        for row_class in ("huge", "tall", "mid", "short", "single"):
            for max_group, local_mem in ((1024, 65536), (64, 65536), (256, 4096), (16, 2048)):
                tiles = choose_tiles(is_gpu, max_group, local_mem, 8, row_class)
                assert tiles.valid() and tiles.group <= max_group and tiles.local_bytes(8) <= local_mem, tiles
    # a GPU with 132 compute units: large tiles only where there are enough of them to fill it
    assert tile_class(True, 512, 128 * 32 * 32, 1, 132) == "huge"
    assert tile_class(True, 512, 128 * 4 * 4, 1, 132) == "tall"
    assert tile_class(True, 16, 10**6, 1, 132) == "mid" and tile_class(True, 3, 10**6, 1, 132) == "short"
    assert tile_class(False, 1, 10**6, 64, 2) == "single"
    assert choose_tiles(True, 1024, 49152, 4, "tall").tile_m == 64
    assert choose_tiles(True, 1024, 49152, 4, "short").tile_m <= 16


def test_convolution_step_under_jit_equals_eager(device):
    _native_backend(device, F32, 2)

    def make_model():
        return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, stride=2, groups=2),
                             nn.Flatten(), nn.Linear(4 * 3 * 3, 2))

    def run(jitted):
        return train(device, make_model, lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9),
                     ((4, 3, 8, 8), (4, 2)), jitted, seed=6)

    eager, _, _ = run(False)
    jitted, _, step = run(True)
    np.testing.assert_allclose(jitted, eager, rtol=0, atol=0)
    assert step.recordings == 1 and eager[-1] < eager[0]


def test_tensor_core_warp_layout_covers_each_tile():
    """``mma_warps``: every GPU tile with 16+ rows splits among its warps into blocks of whole 16x8 fragments that
    cover the tile once (the squarest such split); the one-row tile has none (it runs the float32 kernel), and
    a TF32 source is refused for anything but float32 on such tiles."""
    from flowgraph.backends.opencl import conv as CK

    tables = [*CK.GPU_TILES.values(), *(t for per_op in CK.GPU_TF32_TILES.values() for t in per_op.values())]
    for tiles in tables:
        warps = CK.mma_warps(tiles)
        if tiles.tile_m < 16:
            assert warps is None, tiles
            continue
        rows, cols = warps
        assert rows * cols * 32 == tiles.group, tiles
        block_m, block_n = tiles.tile_m // rows, tiles.tile_n // cols
        assert block_m * rows == tiles.tile_m and block_n * cols == tiles.tile_n
        assert block_m % CK.MMA_M == 0 and block_n % CK.MMA_N == 0
    assert CK.mma_warps(CK.ConvTiles(16, 16, 8, 8, 16)) == (2, 4)   # 128 x 128: 64 x 32 blocks
    assert CK.mma_warps(CK.ConvTiles(32, 8, 4, 8, 16)) == (2, 4)    # 64 x 128: 32 x 32 blocks
    assert CK.mma_warps(CK.ConvTiles(16, 16, 4, 4, 12)) is None      # depth not whole 8-steps
    source = CK.conv_source("forward", 2, F32, F32, np.dtype(np.int32), CK.ConvTiles(32, 8, 4, 8, 16), tf32=True)
    assert source.source.count("mma.sync.aligned.m16n8k8") == 2 * 8 and "cvt.rna.tf32.f32" in source.source
    with pytest.raises(ValueError, match="no TF32 kernel"):
        CK.conv_source("forward", 2, F64, F64, np.dtype(np.int32), CK.ConvTiles(32, 8, 4, 8, 16), tf32=True)
    with pytest.raises(ValueError, match="no TF32 kernel"):
        CK.conv_source("wgrad", 2, F32, F32, np.dtype(np.int32), CK.GPU_TILES["single"], tf32=True)


@pytest.mark.parametrize("depth", [8, 16, 32])
def test_tf32_staging_swizzle_is_bank_conflict_free(depth):
    """``swizzle``: with slice rows ``tile + MMA_PAD`` words apart, one warp's transposing store (lane ``i`` at
    row ``i % depth`` and column ``i // depth``, then XORed) and every fragment read (rows ``k0 + tq``, columns
    ``c0 + gq`` XORed by the row's constant) touch 32 different banks of 32; without the XOR the store is
    ``32 / 8``-way conflicted at depth 16 (the conflict it removes). The generated TF32 source stores through
    the per-work-item column and reads through the XORed bases."""
    from flowgraph.backends.opencl import conv as CK

    def banks(cells, stride):
        return len({(row * stride + col) % 32 for row, col in cells})

    for tile in (16, 32, 64, 128, 256):
        stride = tile + CK.MMA_PAD
        for first in range(0, tile * depth, 32):  # every warp's store
            cells = [(e % depth, (e // depth) ^ CK.swizzle(e % depth, depth)) for e in range(first, first + 32)]
            assert all(col < tile for _, col in cells) and banks(cells, stride) == 32, (tile, first)
        for k0 in range(0, depth, 4):  # every fragment read
            for c0 in range(0, tile, 8):
                cells = [(k0 + tq, (c0 + gq) ^ CK.swizzle(k0, depth)) for gq in range(8) for tq in range(4)]
                assert banks(cells, stride) == 32, (tile, k0, c0)
    plain = [(e % 16, e // 16) for e in range(32)]
    assert banks(plain, 128 + CK.MMA_PAD) == 8  # 4-way without the swizzle
    assert CK.swizzle("sk", 16) == "(((sk) >> 2) * 2 & 7)" and CK.swizzle(12, 16) == 6
    source = CK.conv_source("wgrad", 2, F32, F32, np.dtype(np.int32), CK.ConvTiles(16, 16, 4, 8, 16), tf32=True,
                            row_runs=True).source
    assert "As[sk][sc + l * 16]" in source and "Bs[sk][sc + l * 16]" in source
    assert "As[8 + tq + 4][wr6 + 0]" in source and "Bs[8 + tq + 4][wc6 + 0]" in source
    # a work-group of 64 (4 columns a store round) would break the per-work-item XOR: it stores unswizzled
    small = CK.conv_source("wgrad", 2, F32, F32, np.dtype(np.int32), CK.ConvTiles(8, 8, 4, 4, 16), tf32=True).source
    assert "As[e % 16][e / 16]" in small and "wr2" not in small


TF32 = {  # name: (x shape, w shape, stride, padding, dilation, groups, compute units): each tile class's kernel
    "huge": ((3, 24, 12, 10), (130, 24, 3, 3), 1, 1, 1, 1, 1),
    "huge-input-grad": ((3, 64, 12, 10), (16, 64, 3, 3), 1, 1, 1, 1, 1),  # dgrad's own 64 x 256 huge tiles
    "tall": ((2, 16, 11, 9), (40, 16, 3, 3), 1, 1, 1, 1, 1),
    "mid-stride2": ((2, 6, 11, 9), (12, 6, 3, 3), 2, 1, 1, 1, 1),
    "short-groups-dilation": ((2, 12, 13, 11), (9, 4, 3, 2), (2, 1), 2, (2, 1), 3, 1),
    "1d-split-k": ((6, 3, 500), (4, 3, 5), 1, 2, 1, 1, None),
    "3d": ((2, 4, 5, 6, 7), (20, 4, 3, 2, 3), (1, 2, 1), 1, 1, 1, 1),
    # both channels-inner kernels: 48 input and 32 output channels per group
    "channels-inner-stride2-groups": ((2, 96, 11, 9), (64, 48, 3, 3), 2, 1, 1, 2, 1),
}


@pytest.mark.parametrize("name", list(TF32))
def test_tf32_tensor_core_kernels_match_torch_to_tf32_precision(device, name, monkeypatch):
    """NVIDIA devices (compute capability 8.0+) only: under ``fg.backends.cudnn.allow_tf32`` float32 forward,
    input and weight gradients run the ``mma.sync`` kernels, in every tile class, split-K and stride phases
    included. Their error against a float64 reference is TF32's (inputs rounded to 10 mantissa bits), many
    times the float32 kernels' error on the same problem, which shows that the tensor cores ran."""
    x_shape, w_shape, stride, padding, dilation, groups, units = TF32[name]
    nd = len(x_shape) - 2
    be = _opencl_backend(device, F32, nd)
    if not be._tf32_tensor_cores:
        pytest.skip(f"{device}: no TF32 tensor cores reachable from OpenCL (an NVIDIA GPU of compute capability 8+)")
    if units is not None:  # so that the small problem takes its tile class's tiles, not split-K
        monkeypatch.setattr(type(be), "_compute_units", property(lambda self: units))
    rng = np.random.default_rng(21)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    geometry = tuple((v,) * nd if isinstance(v, int) else v for v in (stride, padding, dilation)) + (groups,)
    y_ref = getattr(torch.nn.functional, f"conv{nd}d")(torch.tensor(x), torch.tensor(w), None, *geometry).numpy()
    g = rng.standard_normal(y_ref.shape)
    refs = (y_ref, *_torch_grads(x, w, g, *geometry))
    xs, ws, gs = (be.from_host(a.astype(np.float32)) for a in (x, w, g))

    def errors(tf32):
        monkeypatch.setattr(fg.backends.cudnn, "allow_tf32", tf32)
        outs = (be.conv_forward(xs, ws, *geometry), be.conv_input_grad(gs, ws, x.shape, *geometry),
                be.conv_weight_grad(xs, gs, w.shape, *geometry))
        return [np.abs(be.to_host(out) - ref).max() / np.sqrt(np.mean(ref**2)) for out, ref in zip(outs, refs)]

    exact, rounded = errors(False), errors(True)
    assert any(key[5] for key in be._conv_choice)  # a tensor-core kernel was chosen
    if name.startswith("huge"):
        op = "dgrad" if name == "huge-input-grad" else "forward"
        assert any(key[0] == op and key[4] == "huge" and key[5] for key in be._conv_choice), be._conv_choice
    for op, e32, etf in zip(("forward", "input grad", "weight grad"), exact, rounded):
        assert e32 < 1e-5 and 1e-5 < etf < 1e-2, (op, e32, etf)
