"""The CUDA backend's own features: fusion, own cuBLAS, device RNG, memory stats, DLPack, fg.capture.

The protocol itself is checked for every device by test_primitives.py (and the tensor/autograd suites);
this file covers what only the CuPy backend has. GPU tests skip where no CUDA device is visible; the
first tests run everywhere (no CuPy, or CuPy without a GPU).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import flowgraph as fg
from flowgraph.backends import available_devices, fusion, get_backend
from flowgraph.errors import BackendError, FlowError, ShapeError

HAS_CUDA = any(d.startswith("cuda") for d in available_devices())
gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device available here")
F32 = np.float32


# ------------------------------------------------------------------------------------ everywhere
def test_list_devices_never_raises(monkeypatch):
    cupy = pytest.importorskip("cupy")
    from flowgraph.backends.cuda import CupyBackend

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", broken)
    assert CupyBackend.list_devices() == []
    assert CupyBackend.is_available() is False


def test_fg_cuda_module_without_gpu():
    if HAS_CUDA:
        pytest.skip("checks the behaviour without a GPU")
    assert fg.cuda.is_available() is False
    assert fg.cuda.device_count() == 0
    with pytest.raises(BackendError, match="no CUDA device"):
        fg.cuda.memory_allocated()
    with pytest.raises(BackendError):
        fg.cuda.synchronize()


# ------------------------------------------------------------------------------------ fusion
@pytest.fixture
def be():
    if not HAS_CUDA:
        pytest.skip("no CUDA device available here")
    return get_backend("cuda:0")


@pytest.fixture
def fusion_off():
    fusion.set_enabled(False)
    yield
    fusion.set_enabled(True)


def _chain(be, x, y):
    """Ten elementwise ops: a GELU-like chain plus a comparison and a where."""
    t = be.mul(x, 0.5)
    t = be.add(t, be.tanh(be.mul(be.add(x, be.mul(be.mul(be.mul(x, x), x), 0.044715)), 0.79788456)))
    t = be.mul(t, y)
    return be.where(be.gt(t, 0.0), t, be.mul(t, 0.01))


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["float32", "float64", "float16"])
def test_fused_matches_unfused(be, dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(33, 17)).astype(dtype)
    y = rng.normal(size=(17,)).astype(dtype)
    fused = be.to_host(_chain(be, be.from_host(x), be.from_host(y)))
    fusion.set_enabled(False)
    try:
        unfused = be.to_host(_chain(be, be.from_host(x), be.from_host(y)))
    finally:
        fusion.set_enabled(True)
    assert fused.dtype == unfused.dtype == dtype
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(fused.astype(np.float64), unfused.astype(np.float64), rtol=tol, atol=tol)


@gpu
def test_chain_is_one_kernel_and_kernels_are_cached_by_structure(be):
    x, y = be.from_host(np.ones((4, 5), F32)), be.from_host(np.ones(5, F32))
    be.to_host(_chain(be, x, y))  # compile
    launches, kernels = be.stats["fused_launches"], len(be._kernels)
    out = _chain(be, be.from_host(np.full((64, 3), 2.0, F32)), be.from_host(np.ones(3, F32)))
    be.to_host(out)
    assert be.stats["fused_launches"] == launches + 1
    assert len(be._kernels) == kernels  # another shape: the same kernel
    be.to_host(be.mul(be.add(x, 3.0), 7.0))
    be.to_host(be.mul(be.add(x, -1.5), 2.0))
    assert len(be._kernels) == kernels + 1  # other scalar values: the same kernel


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_],
                         ids=["float32", "float16", "int32", "bool"])
def test_sum_of_pending_expression_is_one_kernel(be, dtype):
    rng = np.random.default_rng(5)
    a = (rng.normal(size=(6, 7, 5)) * 3).astype(dtype)
    b = (rng.normal(size=(7, 1)) * 3).astype(dtype)
    x, y = be.from_host(a), be.from_host(b)
    for axes, keepdims in [((0,), False), ((1, 2), True), ((0, 1, 2), False)]:
        expr = be.mul(x, y) if dtype != np.bool_ else be.logical_xor(x, y)
        launches = be.stats["fused_launches"]
        got = be.to_host(be.sum(expr, axes, keepdims))
        assert be.stats["fused_launches"] == launches + 1
        ref = a * b if dtype != np.bool_ else np.logical_xor(a, b)
        kwargs = {"dtype": ref.dtype} if ref.dtype.kind == "f" else {}
        expected = np.sum(ref.astype(np.float64) if dtype == np.float16 else ref, axis=axes, keepdims=keepdims,
                          **({} if dtype == np.float16 else kwargs))
        assert got.dtype == np.sum(ref, axis=axes, **kwargs).dtype
        tol = 1e-2 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_long_reduction_to_few_outputs_runs_in_two_stages(be, dtype):
    from flowgraph.backends.fusion import split_reduction

    rng = np.random.default_rng(6)
    a = (rng.normal(size=(16, 3, 64, 64)) * 0.1).astype(dtype)  # sums stay within float16's range
    m = (rng.normal(size=(1, 3, 1, 1)) * 0.1).astype(dtype)
    assert split_reduction(a.shape, (0, 2, 3))  # two stages
    x, y = be.from_host(a), be.from_host(m)
    for keepdims in (False, True):
        got = be.to_host(be.sum(be.mul(be.sub(x, y), be.sub(x, y)), (0, 2, 3), keepdims))
        ref = ((a.astype(np.float64) - m) ** 2).sum(axis=(0, 2, 3), keepdims=keepdims)
        assert got.dtype == dtype and got.shape == ref.shape
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2 if dtype == np.float16 else 1e-5)
    full = be.to_host(be.sum(be.mul(x, 2.0), (0, 1, 2, 3), False))
    np.testing.assert_allclose(float(full), 2 * a.astype(np.float64).sum(), rtol=1e-2 if dtype == np.float16 else 1e-4,
                               atol=1e-2)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape,axes", [
    ((256, 2048), (1,)), ((256, 2048), (0,)), ((256, 1024), (0, 1)), ((37,), (0,)), ((3, 5, 7), (1,)),
    ((16, 8, 32, 32), (0, 2, 3)), ((2, 3, 4, 5), (0, 3)), ((1 << 18,), (0,)), ((5, 1, 3), (1,)),
    ((64, 32, 8), (2,)), ((64, 32, 8), (0, 2)), ((300, 3), (1,)),  # short: one thread per output
], ids=str)
def test_own_reduction_kernel_matches_numpy(be, dtype, shape, axes):
    from flowgraph.backends.cuda import backend as cuda_backend

    rng = np.random.default_rng(8)
    a = rng.normal(size=shape).astype(dtype)
    bshape = tuple(1 if i in axes else n for i, n in enumerate(shape))
    b = rng.normal(size=bshape).astype(dtype)
    x, y = be.from_host(a), be.from_host(b)
    xt = be.permute(be.contiguous(be.permute(x, tuple(reversed(range(len(shape)))))),
                    tuple(reversed(range(len(shape)))))  # same values, transposed layout
    for src in (x, xt):
        for keepdims in (False, True):
            expr = be.mul(be.sub(src, y), be.add(src, 0.5))
            launches = be.stats["fused_launches"]
            got = be.to_host(be.sum(expr, axes, keepdims))
            # one kernel, plus a second pass of it adding the partial sums of a long reduction
            assert launches + 1 <= be.stats["fused_launches"] <= launches + 2
            ref = ((a.astype(np.float64) - b) * (a + 0.5)).sum(axis=axes, keepdims=keepdims)
            assert got.dtype == dtype and got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-3)
    cuda_backend.OWN_REDUCTIONS = False
    try:
        other = be.to_host(be.sum(be.mul(be.sub(x, y), be.add(x, 0.5)), axes, False))
    finally:
        cuda_backend.OWN_REDUCTIONS = True
    np.testing.assert_allclose(other, got.reshape(other.shape), rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-3)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape,axes", [
    ((256, 2048), (1,)), ((256, 2048), (0,)), ((1 << 18,), (0,)), ((16, 8, 32, 32), (0, 2, 3)), ((3, 5, 7), (-1,)),
], ids=str)
def test_sum_of_realized_arrays_runs_on_the_own_kernel(be, dtype, shape, axes):
    """A realized float array (contiguous, transposed, broadcast) sums on the reduction kernel, as NumPy."""
    rng = np.random.default_rng(9)
    a = rng.normal(size=shape).astype(dtype)
    x = be.from_host(a)
    rev = tuple(reversed(range(len(shape))))
    xt = be.permute(be.contiguous(be.permute(x, rev)), rev)
    wide = be.expand(be.reshape(x, (1, *shape)), (3, *shape))
    tol = dict(rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-3)
    for src, ref_in, ax in ((x, a, axes), (xt, a, axes), (wide, np.broadcast_to(a, (3, *shape)),
                                                           (0, *[d % len(shape) + 1 for d in axes]))):
        for keepdims in (False, True):
            launches = be.stats["fused_launches"]
            got = be.to_host(be.sum(src, ax, keepdims))
            assert launches + 1 <= be.stats["fused_launches"] <= launches + 2
            ref = ref_in.astype(np.float64).sum(axis=ax, keepdims=keepdims)
            assert got.dtype == dtype and got.shape == ref.shape
            np.testing.assert_allclose(got, ref, **tol)


@gpu
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.1), dict(maximize=True),
                                dict(weight_decay=0.1, decoupled_weight_decay=True)])
def test_fused_adam_kernel_matches_cpu(be, kw):
    from flowgraph import nn, optim

    rng = np.random.default_rng(7)
    w0 = rng.normal(size=(33, 17)).astype(F32)
    grads = [rng.normal(size=(33, 17)).astype(F32) for _ in range(5)]
    result = {}
    for device in ("cpu", "cuda"):
        p = nn.Parameter(fg.tensor(w0, device=device))
        opt = optim.Adam([p], lr=1e-2, **kw)
        launches = be.stats["fused_launches"]
        for g in grads:
            p.grad = fg.tensor(g, device=device)
            opt.step()
        if device == "cuda":
            assert be.stats["fused_launches"] == launches  # the Adam kernel, not fused tensor ops
        result[device] = p.detach().numpy()
        assert opt.state[p]["exp_avg"].device.startswith(device)
    np.testing.assert_allclose(result["cuda"], result["cpu"], rtol=1e-5, atol=1e-6)


@gpu
def test_fused_update_in_place_and_pending_readers(be):
    p = be.from_host(np.arange(6, dtype=F32))
    g = be.from_host(np.ones(6, F32))
    old = be.mul(p, 1.0)  # lazy, reads p
    upd = be.sub(p, be.mul(g, 0.5))
    out = be.assign(p, upd)
    assert out is p
    np.testing.assert_allclose(be.to_host(p), np.arange(6) - 0.5)
    np.testing.assert_allclose(be.to_host(old), np.arange(6))  # realized before the write
    np.testing.assert_allclose(be.to_host(upd), np.arange(6) - 0.5)


@gpu
def test_bfloat16(be):
    host = np.array([[1.5, -2.25, 3.0]], dtype=ml_dtypes.bfloat16)
    try:
        x = be.from_host(host)
    except BackendError as exc:
        assert "bfloat16" in str(exc)
        pytest.skip(f"CuPy here has no bfloat16: {exc}")
    np.testing.assert_array_equal(be.to_host(x), host)
    y = be.to_host(be.add(be.mul(x, 2.0), x))
    assert y.dtype == host.dtype
    np.testing.assert_array_equal(y.astype(F32), host.astype(F32) * 3)
    assert be.to_host(be.cast(x, np.dtype(F32))).tolist() == [[1.5, -2.25, 3.0]]
    w = be.from_host(np.ones((3, 2), ml_dtypes.bfloat16))
    np.testing.assert_allclose(be.to_host(be.matmul(x, w)).astype(F32), [[2.25, 2.25]])
    t = fg.randn(4, 4, device="cuda", dtype=fg.bfloat16)
    assert t.dtype == fg.bfloat16 and np.isfinite(t.float().numpy()).all()


# ------------------------------------------------------------------------------------ cuBLAS
def _on_device(be, host, transposed):
    """``host`` on the device, as a transposed view of a contiguous array when ``transposed``."""
    if not transposed:
        return be.from_host(host)
    return be.permute(be.from_host(np.ascontiguousarray(host.swapaxes(-1, -2))), _swap(host.ndim))


@gpu
@pytest.mark.parametrize(
    "shapes", [((7, 5), (5, 3)), ((4, 7, 5), (5, 3)), ((2, 1, 7, 5), (3, 5, 6)), ((6, 1, 5), (6, 5, 1))], ids=str
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["float32", "float64", "float16"])
def test_own_cublas_matmul(be, shapes, dtype):
    import cupy

    rng = np.random.default_rng(1)
    a = rng.normal(size=shapes[0]).astype(dtype)
    b = rng.normal(size=shapes[1]).astype(dtype)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    for name, ta, tb in [("plain", False, False), ("a.T", True, False), ("b.T", False, True), ("both", True, True)]:
        da, db = _on_device(be, a, ta), _on_device(be, b, tb)
        got = be.to_host(be.matmul(da, db))
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=name)
        np.testing.assert_allclose(got, cupy.asnumpy(cupy.matmul(da, db)), rtol=tol, atol=tol, err_msg=name)


def _swap(ndim):
    axes = list(range(ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return tuple(axes)


@gpu
def test_matmul_strided_views_and_errors(be):
    rng = np.random.default_rng(2)
    big = rng.normal(size=(10, 12)).astype(F32)
    x = be.slice(be.from_host(big), (slice(1, 8), slice(2, 9)))  # leading dimension 12, not 7
    y = be.flip(be.from_host(big[:7, :4].copy()), (0,))  # negative strides: staged copy
    np.testing.assert_allclose(be.to_host(be.matmul(x, y)), big[1:8, 2:9] @ big[:7, :4][::-1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError):
        be.matmul(x, be.from_host(big))


# ------------------------------------------------------------------------------------ RNG, memory, DLPack
@gpu
def test_rng_state_lives_on_device(be):
    be.seed(7)
    a = be.to_host(be.normal((1000,), np.dtype(F32)))
    b = be.to_host(be.normal((1000,), np.dtype(F32)))
    be.seed(7)
    np.testing.assert_array_equal(be.to_host(be.normal((1000,), np.dtype(F32))), a)
    assert not np.array_equal(a, b)
    assert int(be.to_host(be._rng_state)[1]) == 250  # two draws of 1000 floats, 4 per Philox block
    u = be.to_host(be.uniform((5000,), np.dtype(np.float16)))
    assert u.dtype == np.float16 and u.min() >= 0 and u.max() < 1
    r = be.to_host(be.randint(0, 3, (3000,), np.dtype(np.int32)))
    assert r.dtype == np.int32 and set(np.unique(r)) == {0, 1, 2}


@gpu
def test_memory_stats_and_fg_cuda():
    assert fg.cuda.is_available() and fg.cuda.device_count() >= 1
    fg.cuda.synchronize()
    before = fg.cuda.memory_allocated()
    fg.cuda.reset_peak_memory_stats()
    x = fg.zeros(1 << 22, device="cuda")  # 16 MiB
    assert fg.cuda.memory_allocated() >= before + x.numel() * 4
    assert fg.cuda.max_memory_allocated() >= fg.cuda.memory_allocated()
    assert fg.cuda.memory_reserved() >= fg.cuda.memory_allocated()
    del x
    assert fg.cuda.memory_allocated() <= before + 4096
    assert fg.cuda.max_memory_allocated() >= before + (1 << 24)
    name = fg.cuda.get_device_name()
    assert isinstance(name, str) and "NVIDIA" in name


@gpu
def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    x = fg.from_dlpack(t)
    assert x.device == "cuda:0"
    t.add_(1)  # shared memory
    np.testing.assert_array_equal(x.numpy(), np.arange(1, 7, dtype=F32).reshape(2, 3))
    back = torch.from_dlpack(x * 2)
    assert back.device.type == "cuda"
    np.testing.assert_array_equal(back.cpu().numpy(), np.arange(1, 7, dtype=F32).reshape(2, 3) * 2)


# ------------------------------------------------------------------------------------ capture
def _mlp_run(captured: bool, steps: int = 50):
    from flowgraph import nn, optim

    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1)).to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(3)
    data = []
    for _ in range(steps):  # a learnable target, so the losses fall
        x = rng.normal(size=(64, 16)).astype(F32)
        data.append((x, (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2]).astype(F32)))
    x0 = fg.tensor(data[0][0], device="cuda")
    y0 = fg.tensor(data[0][1], device="cuda")
    run = fg.capture(step, x0, y0) if captured else step
    losses = [run(fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda")).item() for x, y in data]
    if captured:
        assert run.recordings == 1
    return np.array(losses), [p.detach().numpy() for p in model.parameters()]


@gpu
def test_capture_matches_eager_training():
    eager, eager_params = _mlp_run(captured=False)
    graphed, graphed_params = _mlp_run(captured=True)
    assert eager[-5:].mean() < eager[:5].mean()  # it trains
    np.testing.assert_allclose(graphed, eager, rtol=1e-4, atol=1e-6)
    for p, q in zip(graphed_params, eager_params):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)


@gpu
def test_capture_rejects_host_reads_and_shape_changes():
    w = fg.ones(4, device="cuda", requires_grad=True)

    def peeks(x):
        loss = (w * x).sum()
        if loss.item() > 0:  # a host read: not allowed while recording
            pass
        return loss

    peeking = fg.capture(peeks, fg.ones(4, device="cuda"))
    peeking(fg.ones(4, device="cuda"))  # the first call is eager
    with pytest.raises(FlowError, match="host"):
        peeking(fg.ones(4, device="cuda"))

    def fine(x):
        return (w * x).sum()

    graphed = fg.capture(fine, fg.ones(4, device="cuda"))
    for _ in range(3):  # eager, recorded, replayed
        assert graphed(fg.full((4,), 2.0, device="cuda")).item() == 8.0
    assert graphed(fg.tensor(np.arange(4, dtype=F32), device="cuda")).item() == 6.0
    with pytest.raises(FlowError, match="another signature"):
        graphed(fg.ones(5, device="cuda"))
    # Eager work still runs normally after a capture.
    assert (w * 3).sum().item() == 12.0


@gpu
def test_capture_random_numbers_change_per_replay():
    def draw(x):
        return x + fg.rand(8, device="cuda")

    graphed = fg.capture(draw, fg.zeros(8, device="cuda"))
    graphed(fg.zeros(8, device="cuda")), graphed(fg.zeros(8, device="cuda"))
    a = graphed(fg.zeros(8, device="cuda")).numpy().copy()
    b = graphed(fg.zeros(8, device="cuda")).numpy().copy()
    assert not np.array_equal(a, b) and 0 <= a.min() and a.max() < 1


def _amp_run(captured: bool, steps: int = 12):
    from flowgraph import nn, optim

    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1)).to("cuda")
    opt = optim.Adam(model.parameters(), lr=1e-3)
    scaler = optim.GradScaler(init_scale=2.0 ** 10, growth_interval=4)

    def step(x, y):
        opt.zero_grad()
        with fg.autocast(fg.float16):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    rng = np.random.default_rng(4)
    data = []
    for i in range(steps):
        x = rng.normal(size=(32, 16)).astype(F32)
        if i == 5:
            x[3, 2] = np.inf  # this step overflows: skipped, scale backs off
        data.append((x, rng.normal(size=(32, 1)).astype(F32)))
    x0 = fg.tensor(data[0][0], device="cuda")
    y0 = fg.tensor(data[0][1], device="cuda")
    run = fg.capture(step, x0, y0) if captured else step
    losses = [run(fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda")).item() for x, y in data]
    return np.array(losses), [p.detach().numpy() for p in model.parameters()], scaler.get_scale()


@gpu
def test_capture_with_autocast_and_grad_scaler_matches_eager():
    eager, eager_params, eager_scale = _amp_run(captured=False)
    graphed, graphed_params, graphed_scale = _amp_run(captured=True)
    assert not np.isfinite(eager[5]) and np.isfinite(eager[6:]).all()
    np.testing.assert_allclose(graphed, eager, rtol=1e-3, atol=1e-5)  # inf/NaN at the same step
    for p, q in zip(graphed_params, eager_params):
        assert np.isfinite(p).all()
        np.testing.assert_allclose(p, q, rtol=1e-3, atol=1e-5)
    assert graphed_scale == eager_scale


@gpu
def test_row_kernel_launches_are_packed_once_per_layout(be):
    """A LayerNorm forward and backward launched again with the same shapes reuse their packed launches
    (``_call``), and a second batch size gets launches of its own: results match the first call's and NumPy's."""
    rng = np.random.default_rng(0)
    w, b = (be.from_host(rng.standard_normal(48).astype(np.float32)) for _ in range(2))

    def run(rows):
        x = rng.standard_normal((rows, 48)).astype(np.float32)
        g = rng.standard_normal((rows, 48)).astype(np.float32)
        xa = be.from_host(x)
        y, mean, rstd = be.layer_norm(xa, w, b, 1e-5)
        gx, gw, gb = be.layer_norm_backward(be.from_host(g), xa, mean, rstd, w, True, True, True)
        xhat = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(be.to_host(y), xhat * be.to_host(w) + be.to_host(b), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(be.to_host(gb), g.sum(0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(be.to_host(gw), (g * xhat).sum(0), rtol=1e-4, atol=1e-4)
        return len(be._row_launches)

    be._row_launches.clear()
    first = run(64)
    assert first >= 3  # forward, input gradient, parameter column sums
    assert run(64) == first
    assert run(32) > first
