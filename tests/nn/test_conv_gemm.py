"""The batch-last convolution composite (``Backend.conv_gemm`` / ``conv_gemm_backward``): the NumPy override
(cache-sized blocks of output rows) and the generic default against PyTorch, and what a convolution keeps for
backward (its input and weight only, as PyTorch does: no im2col buffer)."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph.backends import get_backend
from flowgraph.backends.base import Backend
from flowgraph.nn import functional as F

CONFIGS = [  # (C_in, C_out, size, kernel, stride, dilation)
    (3, 4, (7, 6), (3, 3), (1, 1), (1, 1)),
    (2, 5, (9, 8), (4, 4), (2, 2), (1, 1)),
    (4, 3, (8, 9), (3, 2), (2, 1), (2, 1)),
    (3, 4, (18, 17), (4, 2), (2, 2), (1, 1)),  # the NumPy input gradient by stride phases, cropped to 17
    (2, 4, (34, 33), (3, 3), (1, 1), (1, 1)),  # a short reduction (18) over 2976 columns: NumPy's GEMM in pieces
]


def _torch_conv(x, w, kernel, stride, dilation):
    """Reference output and gradients for a (C, *S, N) input and a (C_out, C_in * K) weight."""
    import torch

    tx = torch.tensor(np.moveaxis(x, -1, 0), requires_grad=True)
    tw = torch.tensor(w.reshape((w.shape[0], x.shape[0]) + kernel), requires_grad=True)
    y = torch.nn.functional.conv2d(tx, tw, stride=stride, dilation=dilation)
    g = np.random.default_rng(5).standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(g))
    to_last = lambda a: np.moveaxis(a, 0, -1)  # noqa: E731 - (N, C, *S) -> (C, *S, N)
    return to_last(y.detach().numpy()), to_last(g), to_last(tx.grad.numpy()), tw.grad.numpy().reshape(w.shape)


def _cpu_in_blocks(blocks: str, monkeypatch):
    """The NumPy backend, its composites working in blocks of one output row where ``blocks`` says so."""
    be = get_backend("cpu")
    if blocks == "one_row":
        monkeypatch.setattr(type(be), "_CONV_WHOLE_BYTES", 0)
        monkeypatch.setattr(type(be), "_CONV_CHUNK_BYTES", 1)
    return be


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
def test_conv_gemm_matches_torch(device, cfg, blocks, monkeypatch):
    c_in, c_out, size, kernel, stride, dilation = cfg
    be = get_backend(device)
    if blocks == "one_row":  # the NumPy override in blocks of one output row (a no-op for other backends)
        monkeypatch.setattr(type(be), "_CONV_WHOLE_BYTES", 0, raising=False)
        monkeypatch.setattr(type(be), "_CONV_CHUNK_BYTES", 1, raising=False)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((c_in,) + size + (3,)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in * int(np.prod(kernel)))).astype(np.float32)
    y_ref, g, gx_ref, gw_ref = _torch_conv(x, w, kernel, stride, dilation)
    out = tuple(y_ref.shape[1:-1])
    for forward, backward in ((type(be).conv_gemm, type(be).conv_gemm_backward),
                              (Backend.conv_gemm, Backend.conv_gemm_backward)):
        xa, wa, ga = be.from_host(x), be.from_host(w), be.from_host(np.ascontiguousarray(g))
        y = forward(be, xa, wa, kernel, stride, dilation, out)
        np.testing.assert_allclose(be.to_host(y), y_ref, rtol=1e-4, atol=1e-4)
        gx, gw = backward(be, xa, wa, ga, kernel, stride, dilation, True, True)
        np.testing.assert_allclose(be.to_host(gx), gx_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(be.to_host(gw), gw_ref, rtol=1e-4, atol=1e-4)
        only_w = backward(be, xa, wa, ga, kernel, stride, dilation, False, True)
        assert only_w[0] is None
        np.testing.assert_allclose(be.to_host(only_w[1]), gw_ref, rtol=1e-4, atol=1e-4)


PHASE_CONFIGS = [  # (C_in, C_out, x spatial (padded), kernel, stride): kernels a multiple of the stride
    (3, 4, (10,), (4,), (2,)),
    (2, 5, (9, 8), (4, 4), (2, 2)),
    (3, 2, (11, 12), (6, 2), (3, 2)),
    (2, 3, (6, 7, 8), (2, 4, 2), (2, 2, 1)),
    (4, 3, (8, 8), (2, 2), (2, 2)),
]


@pytest.mark.parametrize("cfg", PHASE_CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
def test_conv_phase_transpose_matches_scattered_adds(cfg, blocks, monkeypatch):
    """The NumPy col2im by stride phases (one GEMM, one interleaving copy) against the generic default's
    scattered adds, in 1-3 dims, with inputs longer than the windows cover (cropped) and in row blocks."""
    c_in, c_out, size, kernel, stride = cfg
    be = _cpu_in_blocks(blocks, monkeypatch)
    rng = np.random.default_rng(2)
    out = tuple((n - k) // s + 1 for n, k, s in zip(size, kernel, stride))
    g = rng.standard_normal((c_out,) + out + (3,)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in * int(np.prod(kernel)))).astype(np.float32)
    x_shape = (c_in,) + size + (3,)
    ones = (1,) * len(kernel)
    want = Backend.conv_gemm_transpose(be, g, w, kernel, stride, ones, x_shape)
    got = be._conv_phase_transpose(g, w, kernel, stride, x_shape)
    assert got.shape == x_shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
def test_conv_gemm_transpose_backward_matches_torch(device, cfg, blocks, monkeypatch):
    """A transposed convolution's gradients from ``conv_gemm_transpose_backward`` (the NumPy override builds
    each block's im2col of ``g`` once for both) and from the generic default, against PyTorch's."""
    import torch

    c_in, c_out, size, kernel, stride, dilation = cfg  # the transposed convolution maps c_out -> c_in
    be = get_backend(device)
    if blocks == "one_row":
        monkeypatch.setattr(type(be), "_CONV_WHOLE_BYTES", 0, raising=False)
        monkeypatch.setattr(type(be), "_CONV_CHUNK_BYTES", 1, raising=False)
    rng = np.random.default_rng(3)
    full = tuple(size)
    in_size = tuple((n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(full, kernel, stride, dilation))
    x = rng.standard_normal((c_out,) + in_size + (3,)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in * int(np.prod(kernel)))).astype(np.float32)
    tx = torch.tensor(np.moveaxis(x, -1, 0), requires_grad=True)
    tw = torch.tensor(w.reshape((c_out, c_in) + kernel), requires_grad=True)
    extra = tuple(n - ((i - 1) * s + d * (k - 1) + 1) for n, i, s, d, k in zip(full, in_size, stride, dilation, kernel))
    y = torch.nn.functional.conv_transpose2d(tx, tw, stride=stride, dilation=dilation, output_padding=extra)
    g = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(g))
    gx_ref, gw_ref = np.moveaxis(tx.grad.numpy(), 0, -1), tw.grad.numpy().reshape(w.shape)
    g_last = np.ascontiguousarray(np.moveaxis(g, 0, -1))
    for backward in (type(be).conv_gemm_transpose_backward, Backend.conv_gemm_transpose_backward):
        xa, wa, ga = be.from_host(x), be.from_host(w), be.from_host(g_last)
        gx, gw = backward(be, xa, wa, ga, kernel, stride, dilation, True, True)
        np.testing.assert_allclose(be.to_host(gx), gx_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(be.to_host(gw), gw_ref, rtol=1e-4, atol=1e-4)
        only_x = backward(be, xa, wa, ga, kernel, stride, dilation, True, False)
        assert only_x[1] is None
        np.testing.assert_allclose(be.to_host(only_x[0]), gx_ref, rtol=1e-4, atol=1e-4)


def _saved_by_graph(y) -> list:
    """Every tensor saved by the nodes of ``y``'s graph."""
    seen, stack, saved = set(), [y.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        saved += [t for t in getattr(node, "saved", ()) if t is not None]
        stack += [edge for edge in getattr(node, "edges", ()) if edge is not None and hasattr(edge, "edges")]
    return saved


@pytest.mark.parametrize("padding", [0, 1])
def test_conv2d_keeps_no_im2col_for_backward(device, padding):
    x = fg.randn(4, 3, 10, 10, device=device, requires_grad=True)
    conv = fg.nn.Conv2d(3, 8, 3, padding=padding).to(device)
    y = F.relu(conv(x))
    largest = max(t.numel() for t in _saved_by_graph(y))
    # im2col would be C_in * 9 * out_h * out_w * N; what is kept is at most the output (relu's) or the input
    assert largest <= max(x.numel(), y.numel()) < 3 * 9 * 8 * 8 * 4
    y.sum().backward()
    assert x.grad.shape == x.shape and conv.weight.grad.shape == conv.weight.shape


@pytest.mark.slow  # 0.6-5.5 s each (OpenCL compiles the models' kernels)
@pytest.mark.parametrize("name", ["mnist_net", "dcgan_g", "dcgan_d"])
def test_benchmark_cnns_train_like_torch(device, name):
    """pytorch/examples' mnist Net and DCGAN G/D of ``python -m benchmarks``: identical weights and batches give
    the same losses over a few Adam steps (the benchmark's ``--check-losses`` at a tiny scale)."""
    from benchmarks.__main__ import loss_agreement

    assert loss_agreement(name, 0.03, device, steps=2) < 1e-4


STRIDED_CONFIGS = [  # (C_in, C_out, size, kernel, stride, dilation): strided windows over odd sizes, 1-3 dims
    (3, 4, (11,), (3,), (2,), (1,)),
    (2, 3, (13,), (4,), (3,), (1,)),
    (2, 3, (9, 11), (3, 4), (3, 2), (1, 1)),
    (3, 2, (10, 7), (4, 4), (2, 2), (1, 1)),
    (2, 3, (11, 9), (3, 3), (2, 3), (2, 1)),
    (2, 3, (7, 8, 9), (3, 2, 3), (2, 3, 2), (1, 1, 1)),
    (2, 2, (9, 7, 8), (2, 4, 2), (3, 2, 2), (1, 1, 1)),
]


@pytest.mark.parametrize("cfg", STRIDED_CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
def test_strided_conv_gemm_matches_torch(cfg, blocks, monkeypatch):
    """The NumPy composites' strided im2col in 1-3 dims, strides 2 and 3 over odd sizes (windows that leave
    trailing rows unread): ``conv_gemm`` and ``conv_gemm_backward``, and ``conv_gemm_transpose_backward`` of
    the transposed convolution, against PyTorch's output and gradients."""
    import torch

    c_in, c_out, size, kernel, stride, dilation = cfg
    nd = len(kernel)
    be = _cpu_in_blocks(blocks, monkeypatch)
    rng = np.random.default_rng(4)
    to_last = lambda a: np.ascontiguousarray(np.moveaxis(a, 0, -1))  # noqa: E731 - (N, C, *S) -> (C, *S, N)
    x = rng.standard_normal((3, c_in) + size).astype(np.float32)
    w = rng.standard_normal((c_out, c_in) + kernel).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = getattr(torch.nn.functional, f"conv{nd}d")(tx, tw, stride=stride, dilation=dilation)
    g = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(g))
    w2 = w.reshape(c_out, -1)
    out = tuple(y.shape[2:])
    got = be.conv_gemm(to_last(x), w2, kernel, stride, dilation, out)
    np.testing.assert_allclose(got, to_last(y.detach().numpy()), rtol=1e-4, atol=1e-4)
    gx, gw = be.conv_gemm_backward(to_last(x), w2, to_last(g), kernel, stride, dilation, True, True)
    np.testing.assert_allclose(gx, to_last(tx.grad.numpy()), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw, tw.grad.numpy().reshape(w2.shape), rtol=1e-4, atol=1e-4)
    # the transposed convolution c_out -> c_in back to ``size``: its backward's im2col is of the strided g
    xt = rng.standard_normal((3, c_out) + out).astype(np.float32)
    txt, twt = torch.tensor(xt, requires_grad=True), torch.tensor(w, requires_grad=True)
    extra = tuple(n - ((i - 1) * s + d * (k - 1) + 1) for n, i, s, d, k in zip(size, out, stride, dilation, kernel))
    yt = getattr(torch.nn.functional, f"conv_transpose{nd}d")(txt, twt, stride=stride, dilation=dilation,
                                                               output_padding=extra)
    gt = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(gt))
    gx, gw = be.conv_gemm_transpose_backward(to_last(xt), w2, to_last(gt), kernel, stride, dilation, True, True)
    np.testing.assert_allclose(gx, to_last(txt.grad.numpy()), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw, twt.grad.numpy().reshape(w2.shape), rtol=1e-4, atol=1e-4)


PADDED_CONFIGS = [  # (C_in, C_out, size, kernel, stride, dilation, padding (low, high) per dim)
    (3, 4, (7, 6), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    (2, 3, (9, 8), (4, 4), (2, 2), (1, 1), ((1, 1), (1, 1))),  # dcgan's 4x4 stride-2 layers
    (2, 3, (8, 9), (3, 2), (2, 1), (2, 1), ((2, 0), (0, 3))),  # asymmetric, dilated
    (2, 2, (5, 4), (2, 2), (1, 1), (1, 1), ((3, 3), (3, 2))),  # windows that read only padding
    (3, 2, (11,), (3,), (2,), (2,), ((4, 1),)),
    (2, 3, (5, 6, 4), (3, 2, 3), (1, 2, 1), (1, 1, 1), ((1, 1), (0, 2), (2, 1))),
]


@pytest.mark.parametrize("cfg", PADDED_CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
@pytest.mark.parametrize("layout", ["batch-last", "permuted"])
def test_padded_conv_gemm_matches_torch(cfg, blocks, layout, monkeypatch):
    """``conv_gemm`` / ``conv_gemm_backward`` given the padding (NumPy writes it into the im2col: zeros in the
    slabs of each window that read it, no padded copy of ``x``) against PyTorch on the padded input, in 1-3
    dims, asymmetric, with windows that read nothing but padding, from a batch-last array or a permuted view
    of an ``(N, C, *S)`` one (the first layer's input); the generic default (pad, then im2col) likewise."""
    import torch

    c_in, c_out, size, kernel, stride, dilation, padding = cfg
    nd = len(kernel)
    be = _cpu_in_blocks(blocks, monkeypatch)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, c_in) + size).astype(np.float32)
    w = rng.standard_normal((c_out, c_in) + kernel).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    flat = [v for lo_hi in reversed(padding) for v in lo_hi]
    y = getattr(torch.nn.functional, f"conv{nd}d")(torch.nn.functional.pad(tx, flat), tw, stride=stride,
                                                    dilation=dilation)
    g = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(g))
    to_last = lambda a: np.ascontiguousarray(np.moveaxis(a, 0, -1))  # noqa: E731 - (N, C, *S) -> (C, *S, N)
    xl = to_last(x) if layout == "batch-last" else np.moveaxis(x, 0, -1)  # the permuted view itself
    w2, gl, out = w.reshape(c_out, -1), to_last(g), tuple(y.shape[2:])
    for forward, backward in ((type(be).conv_gemm, type(be).conv_gemm_backward),
                              (Backend.conv_gemm, Backend.conv_gemm_backward)):
        got = forward(be, xl, w2, kernel, stride, dilation, out, padding)
        np.testing.assert_allclose(got, to_last(y.detach().numpy()), rtol=1e-4, atol=1e-4)
        gx, gw = backward(be, xl, w2, gl, kernel, stride, dilation, True, True, padding)
        assert gx.shape == xl.shape
        np.testing.assert_allclose(gx, to_last(tx.grad.numpy()), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gw, tw.grad.numpy().reshape(w2.shape), rtol=1e-4, atol=1e-4)
        only_w = backward(be, xl, w2, gl, kernel, stride, dilation, False, True, padding)
        assert only_w[0] is None
        np.testing.assert_allclose(only_w[1], tw.grad.numpy().reshape(w2.shape), rtol=1e-4, atol=1e-4)


STRIDE1_CONFIGS = [  # (C_in, C_out, size, kernel, dilation): stride 1, the input gradient's contiguous-shift fold
    (3, 2, (12,), (3,), (1,)),
    (2, 3, (13,), (4,), (3,)),
    (2, 3, (9, 11), (3, 4), (1, 1)),
    (3, 2, (10, 7), (3, 3), (2, 3)),  # dilated: shifts of 2 rows and 3 columns
    (2, 2, (6, 5), (6, 2), (1, 1)),  # a kernel as tall as the input: one output row
    (2, 3, (7, 6, 8), (3, 2, 3), (1, 2, 1)),
]


@pytest.mark.parametrize("cfg", STRIDE1_CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride1_input_gradient_matches_torch(cfg, blocks, dtype, monkeypatch):
    """A stride-1 convolution's input gradient (``conv_gemm_backward``) and a stride-1 transposed convolution's
    forward (``conv_gemm_transpose``), whose col2im the NumPy backend folds as one contiguous shift per kernel
    offset over the flattened input, against PyTorch in 1-3 dims with dilation, in whole and one-row blocks,
    and equal to the generic default's strided adds."""
    import torch

    c_in, c_out, size, kernel, dilation = cfg
    nd, stride = len(kernel), (1,) * len(kernel)
    be = _cpu_in_blocks(blocks, monkeypatch)
    rng = np.random.default_rng(8)
    to_last = lambda a: np.ascontiguousarray(np.moveaxis(a, 0, -1))  # noqa: E731 - (N, C, *S) -> (C, *S, N)
    x = rng.standard_normal((3, c_in) + size).astype(dtype)
    w = rng.standard_normal((c_out, c_in) + kernel).astype(dtype)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = getattr(torch.nn.functional, f"conv{nd}d")(tx, tw, dilation=dilation)
    g = rng.standard_normal(tuple(y.shape)).astype(dtype)
    y.backward(torch.tensor(g))
    w2, gl = w.reshape(c_out, -1), to_last(g)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    gx, _ = be.conv_gemm_backward(to_last(x), w2, gl, kernel, stride, dilation, True, False)
    np.testing.assert_allclose(gx, to_last(tx.grad.numpy()), rtol=tol, atol=tol)
    assert gx.dtype == dtype
    folded = be.conv_gemm_transpose(gl, w2, kernel, stride, dilation, to_last(x).shape)
    reference = Backend.conv_gemm_transpose(be, gl, w2, kernel, stride, dilation, to_last(x).shape)
    np.testing.assert_allclose(folded, reference, rtol=tol, atol=tol)


CROP_CONFIGS = [  # (C_in, C_out, input spatial, kernel, stride, dilation, padding, output_padding)
    (3, 4, (5, 6), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0)),  # DCGAN's layers: by stride phases
    (2, 3, (4, 5), (4, 4), (2, 2), (1, 1), (1, 2), (1, 0)),  # uneven crops: phases from row 1 or 2
    (2, 3, (6,), (6,), (3,), (1,), (2,), (1,)),  # 1-d, three phases
    (3, 2, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0)),  # stride 1: contiguous shifts, then cropped
    (2, 3, (4, 5), (3, 2), (2, 1), (2, 1), (1, 0), (1, 0)),  # dilated: blocks of strided adds, then cropped
]


@pytest.mark.parametrize("cfg", CROP_CONFIGS)
@pytest.mark.parametrize("blocks", ["whole", "one_row"])
def test_cropped_conv_gemm_transpose_matches_torch(device, cfg, blocks, monkeypatch):
    """A transposed convolution with ``padding`` (and ``output_padding``): ``conv_gemm_transpose`` with a
    ``crop`` against PyTorch's output (the NumPy backend writes it contiguous: the next layer's fast paths need
    that), and ``conv_gemm_transpose_backward`` with the crop as ``padding`` (the gradient of the cropped output,
    never padded by the caller) against PyTorch's gradients, for the backend's override and the generic default."""
    import torch

    c_in, c_out, size, kernel, stride, dilation, padding, output_padding = cfg  # the transpose maps c_in -> c_out
    nd = len(kernel)
    be = get_backend(device)
    if blocks == "one_row":
        monkeypatch.setattr(type(be), "_CONV_WHOLE_BYTES", 0, raising=False)
        monkeypatch.setattr(type(be), "_CONV_CHUNK_BYTES", 1, raising=False)
    rng = np.random.default_rng(9)
    to_last = lambda a: np.ascontiguousarray(np.moveaxis(a, 0, -1))  # noqa: E731 - (N, C, *S) -> (C, *S, N)
    x = rng.standard_normal((3, c_in) + size).astype(np.float32)
    w = rng.standard_normal((c_in, c_out) + kernel).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = getattr(torch.nn.functional, f"conv_transpose{nd}d")(tx, tw, stride=stride, padding=padding,
                                                              output_padding=output_padding, dilation=dilation)
    g = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(g))
    full = tuple((i - 1) * s + d * (k - 1) + 1 for i, s, d, k in zip(size, stride, dilation, kernel))
    crop = tuple((p, p - op) for p, op in zip(padding, output_padding))
    shape = (c_out,) + full + (3,)
    xa, wa, ga = be.from_host(to_last(x)), be.from_host(w.reshape(c_in, -1)), be.from_host(to_last(g))
    for forward, backward in ((type(be).conv_gemm_transpose, type(be).conv_gemm_transpose_backward),
                              (Backend.conv_gemm_transpose, Backend.conv_gemm_transpose_backward)):
        out = forward(be, xa, wa, kernel, stride, dilation, shape, crop)
        np.testing.assert_allclose(be.to_host(out), to_last(y.detach().numpy()), rtol=1e-4, atol=1e-4)
        if device == "cpu" and forward is not Backend.conv_gemm_transpose:
            assert out.flags.c_contiguous
        gx, gw = backward(be, xa, wa, ga, kernel, stride, dilation, True, True, crop)
        np.testing.assert_allclose(be.to_host(gx), to_last(tx.grad.numpy()), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(be.to_host(gw), tw.grad.numpy().reshape(c_in, -1), rtol=1e-4, atol=1e-4)


def test_dcgan_block_takes_the_batch_norm_fast_paths(monkeypatch):
    """A padded transposed convolution followed by batch norm (DCGAN's generator block) on the CPU: the
    convolution's cropped output and its gradient reach the NumPy batch norm, forward and backward, in layouts
    its fast paths take (a cropped view sent both through the generic default, ~25% of dcgan_g's step), and
    the gradient of the crop is never a padded copy."""
    from flowgraph.backends.array_backend import ArrayBackend

    def generic(*args, **kwargs):
        raise AssertionError("the generic default ran")

    monkeypatch.setattr(ArrayBackend, "batch_norm", generic)
    monkeypatch.setattr(ArrayBackend, "batch_norm_backward", generic)
    monkeypatch.setattr(type(get_backend("cpu")), "pad", generic)
    up = fg.nn.ConvTranspose2d(8, 4, 4, 2, 1, bias=False)
    bn = fg.nn.BatchNorm2d(4)
    x = fg.randn(2, 8, 5, 5, requires_grad=True)
    y = F.relu(bn(up(x)))
    assert y.shape == (2, 4, 10, 10)
    y.sum().backward()
    assert x.grad.shape == x.shape and up.weight.grad.shape == up.weight.shape
