"""OpenCL-only behaviour: fusion, the program cache, dtype rules, device discovery, lazy import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from flowgraph.backends import fusion, get_backend
from flowgraph.backends.lazy import flatten
from flowgraph.errors import BackendError

cl_devices = [d for d in get_backend.__globals__["available_devices"]() if d.startswith("opencl")]
needs_opencl = pytest.mark.skipif(not cl_devices, reason="no OpenCL device available here")
F32 = np.dtype(np.float32)


@pytest.fixture
def be():
    return get_backend(cl_devices[0])


@pytest.fixture
def unfused():
    fusion.set_enabled(False)
    yield
    fusion.set_enabled(True)


def gelu_chain(be, x):
    """A GELU-like chain of ~12 elementwise ops ending in a reduction."""
    inner = be.mul(be.add(x, be.mul(be.mul(be.mul(x, x), x), 0.044715)), 0.7978845608)
    y = be.mul(be.mul(x, 0.5), be.add(be.tanh(inner), 1.0))
    z = be.where(be.gt(y, 0.1), be.exp(be.neg(y)), be.sqrt(be.abs(y)))
    return z, be.sum(z, (1,), False)


@needs_opencl
def test_elementwise_is_lazy_and_fuses_into_one_kernel(be):
    x = be.from_host(np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6))
    z, total = gelu_chain(be, x)
    assert z.lazy is not None and z.buffer is None
    assert z.lazy.nodes > 10
    reduce_key = next(k for k in be._kernels if k[0] == "reduce" and k[2] == flatten(z)[0])
    assert "tanh" in be.kernel_source(reduce_key)  # the whole chain was fused into the reduction
    host = be.to_host(z)
    assert z.lazy is None and z.buffer is not None
    assert host.shape == (4, 6)
    del total


@needs_opencl
def test_fused_and_unfused_agree(be):
    rng = np.random.default_rng(0)
    host = rng.normal(size=(5, 7)).astype(np.float32)
    fused_z, fused_sum = gelu_chain(be, be.from_host(host))
    fused = be.to_host(fused_z), be.to_host(fused_sum)
    fusion.set_enabled(False)
    try:
        plain_z, plain_sum = gelu_chain(be, be.from_host(host))
        assert plain_z.lazy is None
        plain = be.to_host(plain_z), be.to_host(plain_sum)
    finally:
        fusion.set_enabled(True)
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fused[1], plain[1], rtol=1e-5, atol=1e-6)


@needs_opencl
def test_broadcast_of_a_lazy_operand_stays_fused(be):
    rng = np.random.default_rng(2)
    host = rng.normal(size=(4, 6)).astype(np.float32)
    x = be.from_host(host)
    mean = be.mul(be.sum(x, (1,), True), 1 / 6)
    centered = be.sub(x, mean)
    var = be.mul(be.sum(be.mul(centered, centered), (1,), True), 1 / 6)
    scale = be.sqrt(be.add(var, 1e-5))  # lazy, shape (4, 1)
    out = be.div(centered, scale)  # broadcasts the lazy (4, 1) chain into the (4, 6) kernel
    assert scale.lazy is not None and out.lazy is not None
    ref = (host - host.mean(1, keepdims=True)) / np.sqrt(host.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(be.to_host(out), ref, rtol=1e-5, atol=1e-5)
    assert scale.lazy is not None, "the small chain was recomputed inside the kernel, not realized"
    np.testing.assert_allclose(be.to_host(scale), np.sqrt(host.var(1, keepdims=True) + 1e-5), rtol=1e-5)
    # A write to a buffer the broadcast copy reads still realizes it first.
    y = be.from_host(np.ones((3, 1), np.float32))
    lazy_col = be.add(y, 1.0)
    wide = be.mul(be.from_host(np.ones((3, 5), np.float32)), lazy_col)
    be.assign(y, 10.0)
    np.testing.assert_array_equal(be.to_host(wide), np.full((3, 5), 2.0, np.float32))


@needs_opencl
def test_long_chain_realizes_at_the_cap(be):
    x = be.from_host(np.ones(8, np.float32))
    y = x
    for _ in range(3 * fusion.MAX_NODES):
        y = be.add(y, 1.0)
        assert y.lazy is None or y.lazy.nodes <= fusion.MAX_NODES
    np.testing.assert_array_equal(be.to_host(y), np.full(8, 1 + 3 * fusion.MAX_NODES, np.float32))


@needs_opencl
def test_program_cache_serves_every_shape(be):
    def run(shape, scalar):
        x = be.from_host(np.ones(shape, np.float32))
        y = be.permute(be.from_host(np.ones(shape[::-1], np.float32)), (1, 0))
        out = be.sum(be.mul(be.add(x, y), scalar), (0,), False)
        return be.to_host(be.matmul(x, be.permute(y, (1, 0)))), be.to_host(out)

    run((3, 4), 2.0)
    before = be.compile_stats()["compiled"]
    cached = len(be._kernels)
    _, out = run((37, 5), 3.0)
    np.testing.assert_allclose(out, np.full(5, 37 * 6.0))
    assert be.compile_stats()["compiled"] == before, "another shape or scalar value must not compile"
    assert len(be._kernels) == cached


@needs_opencl
def test_programs_shared_across_backend_instances(be):
    from flowgraph.backends.opencl import OpenCLBackend

    be.to_host(be.exp(be.from_host(np.ones(3, np.float32))))
    before = be.compile_stats()["compiled"]
    other = OpenCLBackend(be.device)
    other.to_host(other.exp(other.from_host(np.ones(5, np.float32))))
    assert other.compile_stats()["compiled"] == before


@needs_opencl
def test_structural_key_ignores_values_and_sizes(be):
    a = be.add(be.mul(be.from_host(np.ones(3, np.float32)), 2.0), 1.0)
    b = be.add(be.mul(be.from_host(np.ones(50, np.float32)), -7.5), 4.0)
    c = be.add(be.mul(be.from_host(np.ones(3, np.float32)), 2.0), be.from_host(np.ones(3, np.float32)))
    assert fusion.linearize(a).key == fusion.linearize(b).key
    assert fusion.linearize(a).key != fusion.linearize(c).key


@needs_opencl
def test_dtype_rules(be):
    with pytest.raises(BackendError, match="bfloat16 is not supported on OpenCL"):
        import ml_dtypes

        be.from_host(np.zeros(2, dtype=ml_dtypes.bfloat16))
    with pytest.raises(BackendError, match="bfloat16"):
        be.cast(be.from_host(np.zeros(2, np.float32)), np.dtype("bfloat16"))
    if not be.supports_float16:
        with pytest.raises(BackendError, match="cl_khr_fp16"):
            be.from_host(np.zeros(2, np.float16))
    else:
        x = be.from_host(np.array([1.5, -2.0], np.float16))
        np.testing.assert_array_equal(be.to_host(be.mul(x, 2.0)), np.array([3.0, -4.0], np.float16))
    if not be.supports_float64:
        with pytest.raises(BackendError, match="cl_khr_fp64"):
            be.full((2,), 1.0, np.dtype(np.float64))
    with pytest.raises(BackendError, match="one dtype"):
        be.add(be.from_host(np.zeros(2, np.float32)), be.from_host(np.zeros(2, np.int32)))
    with pytest.raises(BackendError, match="negative integer powers"):
        be.pow(be.from_host(np.array([2], np.int32)), -1)
    with pytest.raises(BackendError, match="not defined"):
        be.sub(be.from_host(np.zeros(2, bool)), be.from_host(np.zeros(2, bool)))


@needs_opencl
def test_device_selection_errors():
    from flowgraph.backends.opencl import OpenCLBackend

    with pytest.raises(BackendError, match="no OpenCL device opencl:99"):
        OpenCLBackend("opencl:99")
    assert OpenCLBackend.is_available()
    assert OpenCLBackend.list_devices()[0] == "opencl:0"


def test_list_devices_without_pyopencl(monkeypatch):
    from flowgraph.backends.opencl import runtime

    monkeypatch.setattr(runtime, "cl", None)
    assert runtime.list_devices() == []
    with pytest.raises(BackendError, match="pip install"):
        runtime.device_context(12345)


def test_import_flowgraph_does_not_import_pyopencl():
    code = "import sys, flowgraph, flowgraph.backends; assert 'pyopencl' not in sys.modules, 'pyopencl imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_collapse_merges_contiguous_axes():
    from flowgraph.backends.opencl.kernels import collapse

    assert collapse((2, 3, 4), [(12, 4, 1), (12, 4, 1)]) == ((24,), ((1,), (1,)))
    assert collapse((2, 1, 4), [(4, 4, 1), (0, 0, 1)]) == ((2, 4), ((4, 1), (0, 1)))
    assert collapse((), [()]) == ((), ((),))
    assert collapse((3, 4), [(1, 3)]) == ((3, 4), ((1, 3),))
    # memoised: the same layout again is the same answer, a list of strides keys like a tuple
    assert collapse([2, 3, 4], ((12, 4, 1), (12, 4, 1))) is collapse((2, 3, 4), [(12, 4, 1), (12, 4, 1)])


@pytest.mark.parametrize("limit", [2**31 - 1, 0], ids=["int-index", "long-index"])
def test_index_type_of_elementwise_and_reductions(be, monkeypatch, limit):
    """Elementwise kernels and reductions use 32-bit index arithmetic where every offset fits
    (``fusion.INT_INDEX_LIMIT``) and 64-bit otherwise (forced here with a limit of 0): the same values either way,
    broadcast, transposed and offset views included, and each kernel keyed by its index type."""
    monkeypatch.setattr(fusion, "INT_INDEX_LIMIT", limit)
    want = "int" if limit else "long"
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 5, 9, 4)).astype(np.float32)
    w = rng.standard_normal((1, 5, 1, 1)).astype(np.float32)
    xa, wa = be.from_host(x), be.from_host(w)
    t = be.permute(xa, (3, 1, 2, 0))  # strided
    s = be.slice(xa, (slice(1, 5), slice(None), slice(2, 9), slice(None)))  # an offset view
    y = be.maximum(be.add(be.mul(be.sub(xa, wa), wa), 0.5), 0.0)
    np.testing.assert_allclose(be.to_host(y), np.maximum((x - w) * w + 0.5, 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(be.to_host(be.mul(t, 3.0)), np.transpose(x, (3, 1, 2, 0)) * 3, rtol=1e-6)
    np.testing.assert_allclose(be.to_host(be.sum(be.mul(be.sub(xa, wa), xa), (0, 2, 3), False)),
                               ((x - w) * x).astype(np.float64).sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(be.to_host(be.sum(s, (1, 3), False)), x[1:5, :, 2:9].sum((1, 3)), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(be.to_host(be.argmax(t, 3, False)), np.transpose(x, (3, 1, 2, 0)).argmax(3))
    keys = [k for k in be._kernels if isinstance(k, tuple) and k and k[0] in ("ew", "reduce")]
    assert any(k[0] == "ew" and k[-1] == want for k in keys) and any(k[0] == "reduce" and k[-1] == want
                                                                      for k in keys)


@needs_opencl
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "any", "all", "argmax"])
def test_short_reductions_over_many_outputs(be, op):
    """At most ``SERIAL_REDUCE_INPUTS`` inputs per output into at least ``SERIAL_REDUCE_OUTPUTS`` outputs (the sum
    of split-K partial results; a leading-axis sum) run one work-item per output: the same values as NumPy on a
    fused input, a transposed view, an offset view and a short last axis, NaN included; argmax keeps the
    work-group form. The form is chosen from the sizes: a long reduction keeps the tree."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 70, 90)).astype(np.float32)
    x[1, 2, 3] = np.nan
    xa = be.from_host(x)
    ref = getattr(np, op)
    fused = be.add(be.mul(xa, 2.0), 1.0)
    cases = [(fused, x * 2 + 1, (0,)), (be.permute(xa, (2, 1, 0)), np.transpose(x, (2, 1, 0)), (2,)),
             (be.slice(xa, (slice(1, 3), slice(None), slice(None))), x[1:3], (0,)),
             (be.permute(xa, (1, 0, 2)), np.transpose(x, (1, 0, 2)), (1,))]
    if op in ("any", "all"):
        cases = [(be.gt(a, 0.5), w > 0.5, ax) for a, w, ax in cases]
    for arr, want, axes in cases:
        if op == "argmax":
            got = be.to_host(be.argmax(arr, axes[0], False))
            np.testing.assert_array_equal(got, np.argmax(want, axes[0]))
            continue
        got = be.to_host(getattr(be, op)(arr, axes, False))
        expect = ref(want.astype(np.float64) if want.dtype.kind == "f" else want, axis=axes)
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    serial_ops = {k[1] for k in be._kernels if isinstance(k, tuple) and k[:1] == ("reduce_serial",)}
    assert (op in serial_ops) == (op != "argmax")
    if op in ("sum", "prod", "max", "any"):  # an empty reduced axis: the identity (max has none: an error)
        empty = be.from_host(np.zeros((0, 5000), np.float32))
        if op == "max":
            with pytest.raises(BackendError, match="no identity"):
                be.max(empty, (0,), False)
        else:
            got = be.to_host(getattr(be, op)(be.gt(empty, 0.0) if op == "any" else empty, (0,), False))
            np.testing.assert_array_equal(got, np.full(5000, {"sum": 0, "prod": 1, "any": False}[op]))
    # a long reduction over few outputs keeps the work-group tree
    long_sum = be.to_host(be.sum(be.from_host(np.ones((5000, 3), np.float32)), (0,), False))
    np.testing.assert_array_equal(long_sum, [5000, 5000, 5000])
