"""Every backend primitive against NumPy, on every available device (cpu, opencl:0, cuda:0).

The same table runs on each device from the ``device`` fixture; device-specific checks (fusion, program
cache, fp16/fp64/bfloat16 rules) skip where they do not apply. Shapes cover broadcasting, 0-d, empty and
non-contiguous views. Kernels are cached by structure, so the suite compiles each structure once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowgraph.backends import get_backend
from flowgraph.backends.base import BINARY_OPS, REDUCE_OPS, UNARY_OPS, Backend
from flowgraph.errors import BackendError, ShapeError

F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

NUMPY_UNARY = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "erf": np.vectorize(math.erf, otypes=[float]),
    "abs": np.abs,
    "sign": np.sign,
    "reciprocal": np.reciprocal,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "logical_not": np.logical_not,
    "isnan": np.isnan,
    "isinf": np.isinf,
}
NUMPY_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "floor_divide": np.floor_divide,
    "remainder": np.remainder,
    "atan2": np.arctan2,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}
POSITIVE_DOMAIN = {"log", "sqrt", "log1p"}


def backend_for(device: str, dtype=None):
    be = get_backend(device)
    if dtype is not None:
        dtype = np.dtype(dtype)
        if dtype == np.float64 and not be.supports_float64:
            pytest.skip(f"{device} has no float64 (cl_khr_fp64)")
        if dtype == np.float16 and not be.supports_float16:
            pytest.skip(f"{device} has no float16 (cl_khr_fp16)")
    return be


def assert_matches(be, result, expected, rtol=None, atol=None):
    host = be.to_host(result)
    if not host.dtype.isnative:  # the NumPy backend keeps a foreign byte order; values are what count
        host = host.astype(host.dtype.newbyteorder("="))
    expected = np.asarray(expected)
    assert host.shape == expected.shape, (host.shape, expected.shape)
    assert host.dtype == expected.dtype, (host.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        tight = expected.dtype == np.float64
        np.testing.assert_allclose(
            host,
            expected,
            rtol=rtol or (1e-12 if tight else 2e-6),
            atol=atol or (1e-12 if tight else 2e-6),
            equal_nan=True,
        )
    else:
        np.testing.assert_array_equal(host, expected)


def transposed(be, host: np.ndarray):
    """``host`` on the device as a non-contiguous (permuted) view."""
    return be.permute(be.from_host(np.ascontiguousarray(host.T)), tuple(reversed(range(host.ndim))))


def sample(rng, shape, dtype, op=None):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    x = rng.uniform(-3, 3, size=shape)
    if op in POSITIVE_DOMAIN:
        x = np.abs(x) + 0.1
    return x.astype(dtype)


# ------------------------------------------------------------------------------------------ elementwise
# float64 runs the ops whose code differs by dtype (helpers, literals, NaN handling); the rest share templates.
F64_UNARY = ("exp", "erf", "sign", "round", "reciprocal", "isnan", "abs")
F64_BINARY = ("div", "pow", "maximum", "floor_divide", "remainder", "atan2", "lt", "logical_xor")
UNARY_CASES = (
    [(op, F32) for op in UNARY_OPS]
    + [(op, F64) for op in F64_UNARY]
    + [(op, I32) for op in ("neg", "abs", "sign", "logical_not", "isnan", "isinf")]
    + [("logical_not", BOOL)]
)


@pytest.mark.parametrize("op,dtype", UNARY_CASES, ids=[f"{o}-{np.dtype(d)}" for o, d in UNARY_CASES])
def test_unary(device, op, dtype):
    be = backend_for(device, dtype)
    rng = np.random.default_rng(0)
    host = sample(rng, (4, 5), dtype, op)
    if op in ("isnan", "isinf", "sign", "abs", "neg") and np.dtype(dtype).kind == "f":
        host[0, :3] = [np.nan, np.inf, -np.inf]
    if op == "round" and np.dtype(dtype).kind == "f":
        host[1, :4] = [0.5, 1.5, -2.5, 2.5]  # ties to even
    expected = NUMPY_UNARY[op](host)
    rtol = None
    if op == "erf":
        expected = expected.astype(dtype)
        rtol = 1e-10 if np.dtype(dtype) == np.float64 else None  # the NumPy backend's erf is a fit
    assert_matches(be, getattr(be, op)(transposed(be, host)), expected, rtol=rtol, atol=rtol)


def _binary_operands(op, dtype, rng):
    a = sample(rng, (3, 1, 4), dtype)
    b = sample(rng, (5, 1), dtype)
    kind = np.dtype(dtype).kind
    if op in ("floor_divide", "remainder", "div") and kind in "iu":
        b[b == 0] = 3
    if op == "pow":
        if kind in "iu":
            b = np.abs(b) % 4
        else:
            a = np.abs(a) + 0.1
    return a, b


BINARY_CASES = (
    [(op, F32) for op in BINARY_OPS]
    + [(op, F64) for op in F64_BINARY]
    + [(op, I32) for op in BINARY_OPS if op != "atan2"]
    + [
        (op, BOOL)
        for op in ("add", "mul", "maximum", "minimum", "eq", "ne", "logical_and", "logical_or", "logical_xor")
    ]
)


@pytest.mark.parametrize("op,dtype", BINARY_CASES, ids=[f"{o}-{np.dtype(d)}" for o, d in BINARY_CASES])
def test_binary_broadcast(device, op, dtype):
    be = backend_for(device, dtype)
    if op == "div" and np.dtype(dtype).kind in "iub":
        backend_for(device, F64)  # NumPy's true division of integers gives float64
    a, b = _binary_operands(op, dtype, np.random.default_rng(1))
    expected = NUMPY_BINARY[op](a, b)
    assert_matches(be, getattr(be, op)(be.from_host(a), be.from_host(b)), expected)


SCALAR_CASES = [(op, F32) for op in BINARY_OPS] + [
    (op, I32) for op in ("add", "mul", "floor_divide", "remainder", "pow", "lt")
]


@pytest.mark.parametrize("op,dtype", SCALAR_CASES, ids=[f"{o}-{np.dtype(d)}" for o, d in SCALAR_CASES])
def test_binary_with_scalar(device, op, dtype):
    be = backend_for(device, dtype)
    rng = np.random.default_rng(2)
    a = sample(rng, (2, 3), dtype)
    scalar = 3 if np.dtype(dtype).kind == "i" else 1.5
    if op == "pow":
        a = np.abs(a) + (0.1 if np.dtype(dtype).kind == "f" else 0)
    typed = np.dtype(dtype).type(scalar)
    x = transposed(be, a)
    assert_matches(be, getattr(be, op)(x, scalar), NUMPY_BINARY[op](a, typed))
    assert_matches(be, getattr(be, op)(scalar, x), NUMPY_BINARY[op](typed, a))


def test_float_division_edge_cases(device):
    be = backend_for(device)
    a = np.array([7.0, -7.0, 7.0, -7.0, 0.0, 5.5, 1.0, -0.0], dtype=F32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 0.0, np.inf, 4.0], dtype=F32)
    for op in ("floor_divide", "remainder"):
        with np.errstate(all="ignore"):
            expected = NUMPY_BINARY[op](a, b)
        assert_matches(be, getattr(be, op)(be.from_host(a), be.from_host(b)), expected)
    ia = np.array([7, -7, 7, -7, 0], dtype=I32)
    ib = np.array([2, 2, -2, -2, 5], dtype=I32)
    for op in ("floor_divide", "remainder"):
        assert_matches(be, getattr(be, op)(be.from_host(ia), be.from_host(ib)), NUMPY_BINARY[op](ia, ib))


def test_maximum_minimum_propagate_nan(device):
    be = backend_for(device)
    a = np.array([1.0, np.nan, 3.0], dtype=F32)
    b = np.array([np.nan, 2.0, 1.0], dtype=F32)
    for op in ("maximum", "minimum"):
        assert_matches(be, getattr(be, op)(be.from_host(a), be.from_host(b)), NUMPY_BINARY[op](a, b))


@HYPOTHESIS
@given(data=st.data())
def test_binary_broadcast_property(device, data):
    be = backend_for(device)
    base = data.draw(st.lists(st.integers(0, 4), min_size=0, max_size=4), label="shape")
    shape_a = tuple(n if data.draw(st.booleans()) else 1 for n in base)
    shape_b = tuple(n if data.draw(st.booleans()) else 1 for n in base)[data.draw(st.integers(0, len(base))) :]
    rng = np.random.default_rng(len(base))
    a = sample(rng, shape_a, F32)
    b = sample(rng, shape_b, F32)
    flip_a = data.draw(st.booleans())
    xa = be.flip(be.from_host(a[..., ::-1].copy()), (a.ndim - 1,)) if flip_a and a.ndim else be.from_host(a)
    assert_matches(be, be.sub(be.mul(xa, be.from_host(b)), 0.5), a * b - np.float32(0.5))


def test_where_and_cast(device):
    be = backend_for(device)
    rng = np.random.default_rng(3)
    cond = rng.random((3, 4)) < 0.5
    a = sample(rng, (3, 4), F32)
    b = sample(rng, (1, 4), F32)
    c = be.from_host(cond)
    assert_matches(be, be.where(c, be.from_host(a), be.from_host(b)), np.where(cond, a, b))
    assert_matches(be, be.where(c, be.from_host(a), 0.0), np.where(cond, a, np.float32(0)))
    assert_matches(be, be.where(c, 2.0, be.from_host(b)), np.where(cond, np.float32(2), b))
    x = be.from_host(a * 3)
    assert be.cast(x, np.dtype(F32)) is x
    assert_matches(be, be.cast(x, np.dtype(I32)), (a * 3).astype(I32))
    assert_matches(be, be.cast(x, np.dtype(BOOL)), (a * 3).astype(BOOL))
    assert_matches(be, be.cast(be.from_host(cond), np.dtype(F32)), cond.astype(F32))
    assert_matches(be, be.cast(be.from_host(np.array([1, -2, 3], I64)), np.dtype(I32)), np.array([1, -2, 3], I32))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_where_large_is_exact(device, dtype):
    """Arrays past the NumPy backend's bitwise-select threshold: the same bits as np.where (NaN, -0.0), with a
    broadcast condition or value, a permuted layout and Python scalars (+0, -0.0: only +0 is a plain mask)."""
    be = backend_for(device)
    if dtype is F64 and not be.supports_float64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 16, 16, 32)).astype(dtype)
    a.flat[::7], a.flat[::11] = np.nan, -0.0
    b = rng.standard_normal((16, 1, 32)).astype(dtype)
    cond = a > 0
    perm = (3, 0, 1, 2)
    cases = [
        (cond, a, a * dtype(0.2)), (cond, a, b), (cond, b, a), (cond, a, 0.0), (cond, 1.5, a), (cond, -1, a),
        (cond[:1], a, a), (cond.transpose(perm), a.transpose(perm), 0.5),
        (cond, a, 0), (cond, a, -0.0), (cond[:1], a, 0.0), (cond, b, 0.0),  # a scalar zero (ReLU's backward)
    ]
    for c, x, y in cases:
        put = lambda v: be.from_host(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v  # noqa: E731
        xd, yd, cd = put(x), put(y), put(c)
        if c.ndim and c.strides != np.ascontiguousarray(c).strides:  # keep the permuted layout on the device
            xd, cd = be.permute(put(a), perm), be.permute(put(cond), perm)
        got = be.to_host(be.where(cd, xd, yd))
        want = np.where(c, x, y).astype(dtype)
        assert got.dtype == want.dtype and got.shape == want.shape
        bits = lambda v: np.ascontiguousarray(v).view(np.uint8)  # noqa: E731
        np.testing.assert_array_equal(bits(got), bits(want))


# ------------------------------------------------------------------------------------------ reductions
REDUCE_CASES = [
    ((3, 4, 5), (1,), False),
    ((3, 4, 5), (0, 2), True),
    ((3, 4, 5), (0, 1, 2), False),
    ((6,), (0,), False),
    ((2, 0, 3), (1,), False),
    ((4, 3), (), False),
    ((), (), False),
]


def check_reduce(be, op, host, axes, keepdims):
    kwargs = {"dtype": host.dtype} if op == "sum" and host.dtype.kind == "f" else {}
    expected = getattr(np, op)(host, axis=axes, keepdims=keepdims, **kwargs)
    x = be.from_host(host) if host.ndim < 2 else transposed(be, host)
    assert_matches(be, getattr(be, op)(x, axes, keepdims), np.asarray(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=["float32", "int32", "bool"])
def test_reduce(device, op, dtype):
    be = backend_for(device)
    check_reduce(be, op, sample(np.random.default_rng(4), (3, 4, 5), dtype), (0, 2), True)


@pytest.mark.parametrize("case", REDUCE_CASES, ids=str)
def test_reduce_layouts(device, case):
    be = backend_for(device)
    shape, axes, keepdims = case
    rng = np.random.default_rng(4)
    check_reduce(be, "sum", sample(rng, shape, F32), axes, keepdims)
    if 0 not in shape:
        check_reduce(be, "max", sample(rng, shape, I32), axes, keepdims)


def test_reduce_float64_and_nan(device):
    be = backend_for(device, F64)
    host = np.random.default_rng(5).normal(size=(7, 300))
    assert_matches(be, be.sum(be.from_host(host), (1,), False), host.sum(axis=1), rtol=1e-12)
    nan = np.array([[1.0, np.nan, 2.0], [3.0, 4.0, 0.5]], dtype=F32)
    assert_matches(be, be.max(be.from_host(nan), (1,), False), nan.max(axis=1))
    assert_matches(be, be.min(be.from_host(nan), (0,), True), nan.min(axis=0, keepdims=True))


def test_reduce_large_sum(device):
    be = backend_for(device)
    host = np.random.default_rng(6).random(100_003).astype(F32)
    assert_matches(be, be.sum(be.from_host(host), (0,), False), host.sum(dtype=F64).astype(F32), rtol=1e-5)


@pytest.mark.parametrize("op", ["sum", "max", "any"])
def test_reduce_few_outputs_many_inputs(device, op):
    # Few outputs over many inputs: the OpenCL backend splits each output over several work-groups.
    be = backend_for(device)
    rng = np.random.default_rng(15)
    host = rng.random((3, 50_000)).astype(F32) if op != "any" else np.zeros((3, 50_000), BOOL)
    if op == "any":
        host[1, 49_999] = True
    for axes, keepdims in (((1,), True), ((0, 1), False)):
        kwargs = {"dtype": F64} if op == "sum" else {}
        expected = np.asarray(getattr(np, op)(host, axis=axes, keepdims=keepdims, **kwargs)).astype(host.dtype)
        assert_matches(be, getattr(be, op)(be.from_host(host), axes, keepdims), expected, rtol=1e-5)


@pytest.mark.parametrize("shape", [(64, 32), (32, 4, 32, 32), (1024, 65), (5, 7), (300, 200), (3, 1)])
def test_max_over_the_last_axis_rows_with_inf_and_nan(device, shape):
    """A max over a short last axis of many rows (the NumPy backend reduces a transposed copy there) equals
    NumPy's, with infinities, NaN rows and negative rows; keepdims either way."""
    be = backend_for(device)
    rng = np.random.default_rng(21)
    host = rng.standard_normal(shape).astype(F32)
    flat = host.reshape(-1, shape[-1])
    flat[0, -1] = np.inf
    if flat.shape[0] > 2:
        flat[1, 0] = -np.inf
        flat[2] = -np.abs(flat[2]) - 1.0
    if flat.shape[0] > 3:
        flat[3, shape[-1] // 2] = np.nan
    for keepdims in (True, False):
        expected = np.max(host, axis=-1, keepdims=keepdims)
        got = be.to_host(be.max(be.from_host(host), (len(shape) - 1,), keepdims))
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_max_of_empty_axis_raises(device):
    be = backend_for(device)
    with pytest.raises((BackendError, ValueError)):
        be.to_host(be.max(be.from_host(np.zeros((2, 0), F32)), (1,), False))


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(device, op):
    be = backend_for(device)
    host = np.array([[1.0, 5.0, 5.0, 0.0], [2.0, 2.0, -1.0, -1.0], [np.nan, 1.0, np.nan, 9.0]], dtype=F32)
    for axis in (0, 1):
        for keepdims in (False, True):
            expected = getattr(np, op)(host, axis=axis, keepdims=keepdims).astype(I64)
            assert_matches(be, getattr(be, op)(transposed(be, host), axis, keepdims), expected)
    ints = np.random.default_rng(7).integers(-3, 3, size=(5, 300)).astype(I32)
    assert_matches(be, getattr(be, op)(be.from_host(ints), 1, False), getattr(np, op)(ints, axis=1).astype(I64))


@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=["float32", "int32", "bool"])
def test_cumsum(device, dtype):
    be = backend_for(device)
    host = sample(np.random.default_rng(8), (3, 4, 5), dtype)
    for axis in range(3):
        expected = np.cumsum(host, axis=axis, dtype=host.dtype)
        assert_matches(be, be.cumsum(transposed(be, host), axis), expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ movement
def test_views(device):
    be = backend_for(device)
    host = np.arange(24, dtype=F32).reshape(2, 3, 4)
    x = be.from_host(host)
    assert_matches(be, be.reshape(x, (4, 6)), host.reshape(4, 6))
    assert_matches(be, be.reshape(x, (-1,)), host.reshape(-1))
    assert_matches(be, be.reshape(x, (3, -1, 2)), host.reshape(3, -1, 2))
    assert_matches(be, be.reshape(x, ()) if host.size == 1 else be.reshape(x, (24,)), host.reshape(24))
    p = be.permute(x, (2, 0, 1))
    assert_matches(be, p, host.transpose(2, 0, 1))
    assert_matches(be, be.reshape(p, (8, 3)), host.transpose(2, 0, 1).reshape(8, 3))
    assert_matches(
        be, be.expand(be.from_host(host[:, :1, :]), (5, 2, 3, 4)), np.broadcast_to(host[:, :1], (5, 2, 3, 4))
    )
    index = (slice(0, 2, 1), slice(1, 3, 1), slice(0, 4, 3))
    assert_matches(be, be.slice(x, index), host[index])
    assert_matches(be, be.slice(x, (slice(1, 1, 1),)), host[1:1])
    assert_matches(be, be.flip(x, (0, 2)), host[::-1, :, ::-1])
    assert_matches(
        be, be.slice(be.flip(x, (2,)), (slice(0, 2), slice(0, 3), slice(1, 4, 2))), host[:2, :, ::-1][:, :, 1::2]
    )
    assert len(x) == 2 and x.ndim == 3 and x.shape == (2, 3, 4) and x.dtype == np.float32


@HYPOTHESIS
@given(data=st.data())
def test_movement_property(device, data):
    be = backend_for(device)
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4), label="shape"))
    host = np.arange(int(np.prod(shape)), dtype=F32).reshape(shape)
    x, ref = be.from_host(host), host
    axes = tuple(data.draw(st.permutations(range(len(shape))), label="axes"))
    x, ref = be.permute(x, axes), ref.transpose(axes)
    index = []
    for n in ref.shape:
        start = data.draw(st.integers(0, n - 1))
        stop = data.draw(st.integers(start, n))
        index.append(slice(start, stop, data.draw(st.integers(1, 2))))
    x, ref = be.slice(x, tuple(index)), ref[tuple(index)]
    flips = tuple(d for d in range(ref.ndim) if data.draw(st.booleans()))
    x, ref = be.flip(x, flips), np.flip(ref, flips)
    assert_matches(be, x, ref)
    assert_matches(be, be.reshape(x, (ref.size,)), ref.reshape(-1))
    assert_matches(be, be.add(x, be.contiguous(x)), ref * 2)


def test_views_share_storage_on_opencl(device):
    be = backend_for(device)
    if not device.startswith("opencl"):
        pytest.skip("checks CLArray buffer sharing")
    x = be.from_host(np.arange(12, dtype=F32).reshape(3, 4))
    for view in (
        be.reshape(x, (4, 3)),
        be.permute(x, (1, 0)),
        be.expand(x, (2, 3, 4)),
        be.slice(x, (slice(1, 3), slice(0, 4, 2))),
        be.flip(x, (1,)),
    ):
        assert view.buffer is x.buffer
    assert be.contiguous(x) is x
    assert be.contiguous(be.permute(x, (1, 0))).buffer is not x.buffer


def test_pad_concatenate_contiguous(device):
    be = backend_for(device)
    rng = np.random.default_rng(9)
    host = sample(rng, (2, 3), F32)
    assert_matches(
        be, be.pad(transposed(be, host), [(1, 0), (2, 1)], 0.5), np.pad(host, [(1, 0), (2, 1)], constant_values=0.5)
    )
    parts = [sample(rng, (2, n), F32) for n in (1, 3, 0, 2)]
    assert_matches(be, be.concatenate([be.from_host(p) for p in parts], 1), np.concatenate(parts, 1))
    ints = [sample(rng, (n, 2), I32) for n in (2, 1)]
    assert_matches(be, be.concatenate([transposed(be, p) for p in ints], 0), np.concatenate(ints, 0))
    assert_matches(be, be.contiguous(be.flip(be.from_host(host), (1,))), host[:, ::-1])


@pytest.mark.parametrize("shape, perm", [((32, 3, 32, 32), (1, 2, 3, 0)), ((32, 3, 32, 32), (3, 0, 1, 2)),
                                         ((64, 2048), (1, 0)), ((2048, 64), (1, 0)), ((16, 24, 40), (2, 0, 1))])
def test_large_permuted_copies(device, shape, perm):
    """contiguous, a flattening reshape and pad of permuted views large enough for the NumPy backend's
    two-stage transposing copy (a batch-last convolution layout read batch-first, and back)."""
    be = backend_for(device)
    host = sample(np.random.default_rng(10), shape, F32)
    view = be.permute(be.from_host(host), perm)
    want = host.transpose(perm)
    assert_matches(be, be.contiguous(view), want)
    assert be.is_contiguous(be.contiguous(view))
    assert_matches(be, be.reshape(view, (want.shape[0], -1)), want.reshape(want.shape[0], -1))
    widths = [(1, 0)] + [(0, 0)] * (len(shape) - 2) + [(0, 2)]
    assert_matches(be, be.pad(view, widths, 0.0), np.pad(want, widths))



def test_is_contiguous(device):
    be = backend_for(device)
    host = np.arange(24, dtype=F32).reshape(2, 3, 4)
    a = be.from_host(host)
    cases = {
        "fresh": (a, True), "transposed": (be.permute(a, (2, 1, 0)), False),
        "row slice": (be.slice(a, (slice(1, 2), slice(None), slice(None))), True),
        "column slice": (be.slice(a, (slice(None), slice(None), slice(1, 3))), False),
        "flipped": (be.flip(a, (2,)), False), "copied": (be.contiguous(be.permute(a, (2, 1, 0))), True),
        "computed": (be.add(a, 1.0), True),
    }
    for name, (arr, expected) in cases.items():
        assert be.is_contiguous(arr) is expected, name
        if not expected:  # the generic default (from ``contiguous``'s contract) agrees with the override
            assert Backend.is_contiguous(be, arr) is False, name
    assert Backend.is_contiguous(be, a) is True

def test_assign(device):
    be = backend_for(device)
    host = np.zeros((3, 4), F32)
    x = be.from_host(host)
    row = be.slice(x, (slice(1, 2), slice(0, 4)))
    src = np.arange(4, dtype=F32)
    out = be.assign(row, be.from_host(src))
    host[1:2] = src
    assert_matches(be, x, host)
    assert_matches(be, out, host[1:2])
    col = be.slice(x, (slice(0, 3), slice(2, 3)))
    be.assign(col, 7.0)
    host[:, 2:3] = 7.0
    assert_matches(be, x, host)
    # Overlapping read and write in different layouts: the result is as if the source were copied first.
    y = be.from_host(np.arange(5, dtype=F32))
    be.assign(be.slice(y, (slice(1, 5),)), be.slice(y, (slice(0, 4),)))
    assert_matches(be, y, np.array([0, 0, 1, 2, 3], F32))
    # In-place update reading the destination itself (the optimizer pattern).
    z = be.from_host(np.ones(4, F32))
    be.assign(z, be.sub(z, be.mul(be.from_host(np.arange(4, dtype=F32)), 0.5)))
    assert_matches(be, z, 1 - np.arange(4, dtype=F32) * 0.5)
    # A dtype-converting write and a broadcast destination.
    ints = be.from_host(np.zeros(3, I32))
    be.assign(ints, be.from_host(np.array([1.7, -2.2, 3.9], F32)))
    assert_matches(be, ints, np.array([1, -2, 3], I32))
    wide = be.assign(be.expand(be.from_host(np.zeros((1, 3), F32)), (2, 3)), be.from_host(np.ones((2, 3), F32)))
    assert_matches(be, wide, np.ones((2, 3), F32))


def test_assign_source_keeps_its_value(device):
    be = backend_for(device)
    p = be.from_host(np.arange(4, dtype=F32))
    new = be.sub(p, 1.0)
    twice = be.mul(new, 2.0)
    be.assign(p, new)
    expected = np.arange(4, dtype=F32) - 1
    assert_matches(be, new, expected)
    be.assign(p, 100.0)
    assert_matches(be, new, expected)
    assert_matches(be, twice, expected * 2)
    assert_matches(be, p, np.full(4, 100.0, F32))
    inner = be.exp(p)
    outer = be.add(inner, 1.0)
    be.to_host(inner)  # realizes inner; outer now reads its buffer
    be.assign(inner, 0.0)
    assert_matches(be, outer, np.exp(np.full(4, 100.0, F32)) + 1)


def test_pending_results_survive_assign(device):
    be = backend_for(device)
    x = be.from_host(np.arange(4, dtype=F32))
    doubled = be.mul(x, 2.0)  # lazy on accelerated backends
    be.assign(x, 0.0)
    assert_matches(be, doubled, np.arange(4, dtype=F32) * 2)
    assert_matches(be, x, np.zeros(4, F32))


# ------------------------------------------------------------------------------------------ matmul
MATMUL_CASES = [
    ((4, 3), (3, 5)),
    ((17, 33), (33, 5)),
    ((2, 3, 4), (4, 6)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((5,), (5, 3)),
    ((3, 5), (5,)),
    ((5,), (5,)),
    ((3, 0), (0, 4)),
    ((0, 3), (3, 4)),
    ((1, 1), (1, 1)),
]


@pytest.mark.parametrize("shapes", MATMUL_CASES, ids=[f"{a}@{b}" for a, b in MATMUL_CASES])
def test_matmul(device, shapes):
    be = backend_for(device)
    rng = np.random.default_rng(10)
    a, b = (sample(rng, s, F32) for s in shapes)
    assert_matches(be, be.matmul(be.from_host(a), be.from_host(b)), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_matmul_views_and_dtypes(device):
    be = backend_for(device)
    rng = np.random.default_rng(11)
    a = sample(rng, (40, 30), F32)
    b = sample(rng, (20, 30), F32)
    expected = a @ b.T
    assert_matches(be, be.matmul(be.from_host(a), be.permute(be.from_host(b), (1, 0))), expected, rtol=1e-5, atol=1e-4)
    ia, ib = sample(rng, (3, 7), I32), sample(rng, (7, 2), I32)
    assert_matches(be, be.matmul(be.from_host(ia), be.from_host(ib)), ia @ ib)
    with pytest.raises((ShapeError, ValueError)):
        be.matmul(be.from_host(a), be.from_host(a))


def test_matmul_float64(device):
    be = backend_for(device, F64)
    rng = np.random.default_rng(12)
    a, b = rng.normal(size=(3, 19, 21)), rng.normal(size=(21, 18))
    assert_matches(be, be.matmul(be.from_host(a), be.from_host(b)), a @ b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ indexing
def test_gather_scatter(device):
    be = backend_for(device)
    rng = np.random.default_rng(13)
    a = sample(rng, (3, 5, 4), F32)
    for axis in range(3):
        shape = list(a.shape)
        shape[axis] = 6
        index = rng.integers(0, a.shape[axis], size=shape).astype(I64)
        index.flat[0] = -1  # negative indices count from the end, as in NumPy
        assert_matches(be, be.gather(transposed(be, a), axis, be.from_host(index)), np.take_along_axis(a, index, axis))
        small = np.abs(index[tuple(slice(0, 2) if d == axis else slice(None) for d in range(3))])
        src = sample(rng, small.shape, F32)
        grid = list(np.indices(small.shape, sparse=True))
        grid[axis] = small
        added = a.copy()
        np.add.at(added, tuple(grid), src)
        assert_matches(
            be,
            be.scatter_add(be.from_host(a), axis, be.from_host(small), be.from_host(src)),
            added,
            rtol=1e-5,
            atol=1e-5,
        )
        written = a.copy()
        written[tuple(grid)] = src
        assert_matches(be, be.scatter(be.from_host(a), axis, be.from_host(small), be.from_host(src)), written)


def test_scatter_add_duplicates(device):
    be = backend_for(device)
    a = np.zeros((2, 3), F32)
    index = np.array([[0, 0, 2, 0], [1, 1, 1, 1]], I64)
    src = np.ones((2, 4), F32)
    expected = a.copy()
    np.add.at(expected, (np.arange(2)[:, None], index), src)
    assert_matches(be, be.scatter_add(be.from_host(a), 1, be.from_host(index), be.from_host(src)), expected)


def test_scatter_add_many_duplicates_matches_torch(device):
    # an embedding's backward: every row of the index repeats one token id, many rows hit one token
    import torch

    be = backend_for(device)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 65, 8)).astype(F32)
    index = np.broadcast_to(rng.integers(0, 65, size=(3, 300, 1)), (3, 300, 8)).astype(I64)
    src = rng.standard_normal((3, 300, 9)).astype(F32)[..., :8]
    expected = torch.scatter_add(torch.from_numpy(a), 1, torch.from_numpy(index.copy()),
                                 torch.from_numpy(src.copy()))
    got = be.scatter_add(be.from_host(a), 1, be.from_host(index), be.from_host(src))
    assert_matches(be, got, expected.numpy(), rtol=1e-5, atol=1e-5)
    if device != "cpu":
        return
    with pytest.raises(IndexError):  # out of range on the CPU: reported, not summed into another row
        be.to_host(be.scatter_add(be.from_host(a), 1, be.from_host(np.full((1, 2, 8), 65, I64)),
                                  be.from_host(src[:1, :2])))


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((9, 4), 0), ((3, 11, 5), 1), ((2, 3, 6), 2), ((1, 4), 0)],
                         ids=str)
def test_index_select_and_index_add_patterns_match_the_elementwise_forms(device, shape, axis):
    """``gather`` and ``scatter_add`` with an index broadcast (stride 0) along every axis but ``axis``: how
    ``index_select`` and ``index_add`` (an embedding's forward and backward) reach the backend. NumPy takes them
    by whole rows (``np.take``; a sort and one ``np.add.reduceat``); the results equal ``take_along_axis`` and
    ``np.add.at``, with repeated, negative (gather) and unused rows."""
    be = backend_for(device)
    rng = np.random.default_rng(len(shape) + axis)
    a = sample(rng, shape, F32)
    picks = 13
    rows = rng.integers(0, shape[axis], size=picks)
    rows[0] = rows[-1]  # a repeated row
    view = [1] * len(shape)
    view[axis] = picks
    out_shape = list(shape)
    out_shape[axis] = picks
    index = np.broadcast_to(rows.reshape(view), out_shape)  # stride 0 off the axis, as expand() leaves it
    negative = rows - shape[axis]  # counted from the end, as in NumPy
    for idx in (index, np.broadcast_to(negative.reshape(view), out_shape)):
        got = be.gather(be.from_host(a), axis, be.from_host(idx) if device != "cpu" else idx)
        assert_matches(be, got, np.take_along_axis(a, np.ascontiguousarray(idx), axis))
    src = sample(rng, tuple(out_shape), F32)
    grid = list(np.indices(index.shape, sparse=True))
    grid[axis] = np.ascontiguousarray(index)
    added = a.copy()
    np.add.at(added, tuple(grid), src)
    got = be.scatter_add(be.from_host(a), axis, be.from_host(index) if device != "cpu" else index, be.from_host(src))
    assert_matches(be, got, added, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, axes", [((64, 16, 8), (2,)), ((6, 5, 4, 3), (2, 3)), ((3, 4, 5), (2, 1)),
                                         ((7, 5000), (1,)), ((9, 3), (0,)), ((6, 5, 4), (1, 0)), ((5000, 3), (0,)),
                                         ((4, 6), (0, 1)), ((4, 5, 6), (1,))], ids=str)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_over_trailing_axes_matches_numpy(device, shape, axes, dtype, keepdims):
    """``sum`` over the trailing or leading axes of a contiguous array (NumPy: one BLAS product with ones up to
    ``_SUM_ROW_MAX`` elements a result), over longer runs, a middle axis and all axes, and of a transposed view
    (NumPy's own sum), against ``np.sum`` in float64."""
    be = backend_for(device, dtype)
    rng = np.random.default_rng(sum(shape))
    a = sample(rng, shape, dtype)
    want = np.sum(a.astype(np.float64), axis=axes, keepdims=keepdims)
    tol = 1e-5 if dtype == F32 else 1e-12
    assert_matches(be, be.sum(be.from_host(a), axes, keepdims), want.astype(dtype), rtol=tol, atol=tol * 10)
    assert_matches(be, be.sum(transposed(be, a), axes, keepdims), want.astype(dtype), rtol=tol, atol=tol * 10)


# ------------------------------------------------------------------------------------------ creation
@pytest.mark.parametrize(
    "dtype",
    [F32, F64, I32, I64, BOOL, np.uint8, np.int8],
    ids=["float32", "float64", "int32", "int64", "bool", "uint8", "int8"],
)
def test_host_roundtrip_and_full(device, dtype):
    be = backend_for(device, dtype)
    rng = np.random.default_rng(14)
    for shape in [(), (0,), (3, 0, 2), (5,), (2, 3, 4)]:
        host = sample(rng, shape, dtype)
        assert_matches(be, be.from_host(host), host)
        assert_matches(be, be.full(shape, 1, np.dtype(dtype)), np.full(shape, 1, dtype=dtype))
    strided = sample(rng, (4, 6), dtype)[::2, ::-3]
    assert_matches(be, be.from_host(strided), strided)
    swapped = strided.astype(strided.dtype.newbyteorder(">"))
    assert_matches(be, be.from_host(swapped), strided)


@pytest.mark.parametrize(
    "args", [(0, 10, 1, I64), (2, 11, 3, I32), (0.0, 1.0, 0.1, F32), (5, 0, -1.5, F32), (3, 3, 1, F32)], ids=str
)
def test_arange(device, args):
    be = backend_for(device)
    start, stop, step, dtype = args
    assert_matches(
        be,
        be.arange(start, stop, step, np.dtype(dtype)),
        np.arange(start, stop, step, dtype=dtype),
        rtol=1e-6,
        atol=1e-6,
    )


# ------------------------------------------------------------------------------------------ random
def test_random_reproducible_and_sane(device):
    be = backend_for(device)
    be.seed(123)
    u1 = be.to_host(be.uniform((4000,), np.dtype(F32)))
    n1 = be.to_host(be.normal((4001,), np.dtype(F32)))
    r1 = be.to_host(be.randint(-3, 7, (3000,), np.dtype(I64)))
    be.seed(123)
    u2 = be.to_host(be.uniform((4000,), np.dtype(F32)))
    n2 = be.to_host(be.normal((4001,), np.dtype(F32)))
    r2 = be.to_host(be.randint(-3, 7, (3000,), np.dtype(I64)))
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(n1, n2)
    np.testing.assert_array_equal(r1, r2)
    assert u1.dtype == F32 and n1.dtype == F32 and r1.dtype == I64
    assert 0.0 <= u1.min() and u1.max() < 1.0
    assert abs(u1.mean() - 0.5) < 0.02 and abs(u1.std() - math.sqrt(1 / 12)) < 0.02
    assert abs(n1.mean()) < 0.06 and abs(n1.std() - 1.0) < 0.05
    assert r1.min() == -3 and r1.max() == 6
    assert not np.array_equal(be.to_host(be.uniform((4000,), np.dtype(F32))), u1)  # the counter advanced
    be.seed(124)
    assert not np.array_equal(be.to_host(be.uniform((4000,), np.dtype(F32))), u1)


def test_random_float64(device):
    be = backend_for(device, F64)
    be.seed(0)
    u = be.to_host(be.uniform((3001,), np.dtype(F64)))
    n = be.to_host(be.normal((3001,), np.dtype(F64)))
    assert u.dtype == F64 and 0.0 <= u.min() and u.max() < 1.0
    assert abs(n.mean()) < 0.08 and abs(n.std() - 1.0) < 0.06


# ------------------------------------------------------------------------------------------ runtime
def test_synchronize_and_memory_stats(device):
    be = backend_for(device)
    be.synchronize()
    stats = be.memory_stats()
    assert isinstance(stats, dict)
    if device.startswith("opencl"):
        x = be.from_host(np.zeros(1 << 16, F32))
        stats = be.memory_stats()
        assert stats["allocated"] >= x.size * 4 and stats["peak"] >= stats["allocated"] and stats["total"] > 0


def test_split_reduction_keeps_outer_axes_only_for_long_reductions_to_few_outputs():
    from flowgraph.backends.fusion import MIN_REDUCTION_BLOCKS, split_reduction

    assert split_reduction((128, 64, 64, 64), (0, 2, 3)) == (0,)  # BatchNorm2d's sums
    assert split_reduction((256, 2048), (0, 1)) == (0,)  # a loss over a whole batch
    assert split_reduction((128, 256, 16, 16), (0, 2, 3)) == (0,)
    assert split_reduction((256, 1024), (1,)) == ()  # LayerNorm: many outputs
    assert split_reduction((8, 4), (0, 1)) == ()  # short
    assert split_reduction((1 << 20,), (0,)) == ()  # one axis: nothing to keep
    assert split_reduction((4, 1, 8, 16384), (0, 1, 2, 3)) == (0, 2)  # size-1 axes skipped
    kept = split_reduction((64, 64, 64, 64), (0, 1, 2, 3))
    assert kept == (0, 1) and 64 * 64 >= MIN_REDUCTION_BLOCKS


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", [(), (0, 3), (7,), (33, 65)], ids=str)
def test_gelu_exact_capability_matches_erf(device, dtype, shape):
    """``gelu_exact`` and ``gelu_exact_backward`` (one ``gelu``/``gelu_grad`` instruction on the lazy backends,
    nothing saved; in-place passes on NumPy) and the generic composition, with fusion on and off, against
    ``math.erf``. The forward's input is pending, as a linear layer's output is."""
    from flowgraph.backends import fusion

    be = backend_for(device, dtype)
    rng = np.random.default_rng(len(shape))
    x, b, g = (rng.standard_normal(shape).astype(dtype) * 3 for _ in range(3))
    pre = x + b
    cdf = 0.5 * (1 + np.vectorize(math.erf, otypes=[float])(pre / math.sqrt(2)))
    want_y = pre * cdf
    want_gx = g * (cdf + pre * np.exp(-pre * pre / 2) / math.sqrt(2 * math.pi))
    # float32 to its rounding; float64 to the NumPy backend's erf fit (1e-10 relative)
    tol = dict(rtol=3e-6, atol=3e-6) if np.dtype(dtype) == F32 else dict(rtol=1e-9, atol=1e-10)
    try:
        for fused in (True, False):
            fusion.set_enabled(fused)
            for impl in (type(be), Backend):
                xd = be.add(be.from_host(x), be.from_host(b))
                y, saved = impl.gelu_exact(be, xd)
                gx = impl.gelu_exact_backward(be, be.from_host(g), xd, saved)
                np.testing.assert_allclose(be.to_host(y), want_y, **tol)
                np.testing.assert_allclose(be.to_host(gx), want_gx, **tol)
    finally:
        fusion.set_enabled(True)


@pytest.mark.parametrize("slope", [0.0, 0.2, 1.0, 1.5])
@pytest.mark.parametrize("dtype", [np.float16, F32, F64])
def test_leaky_relu_backward_matches_the_generic_default(device, slope, dtype):
    """``leaky_relu_backward`` (NumPy: ``g`` times a factor built on the bits of ``slope`` and 1, for slopes in
    [0, 1]) bit for bit against the generic select: NaN, signed zeros and infinities in ``y`` and ``g``, a
    permuted layout, a 0-d pair."""
    be = backend_for(device)
    if dtype is F64 and not be.supports_float64:
        pytest.skip("no float64 on this device")
    if dtype is np.float16 and not be.supports_float16:
        pytest.skip(f"{device} has no float16 (cl_khr_fp16)")
    rng = np.random.default_rng(5)
    y = rng.standard_normal((3, 16, 16, 32)).astype(dtype)
    y.flat[::7], y.flat[::11], y.flat[::13], y.flat[::17] = np.nan, -0.0, 0.0, -np.inf
    g = rng.standard_normal(y.shape).astype(dtype)
    g.flat[::5] = np.nan
    cases = [(y, g, None), (y, g, (3, 0, 1, 2)), (y[0, 0, 0, :1].reshape(()), g[0, 0, 0, :1].reshape(()), None)]
    for yh, gh, perm in cases:
        yd, gd = be.from_host(np.ascontiguousarray(yh)), be.from_host(np.ascontiguousarray(gh))
        if perm is not None:
            yd, gd = be.permute(yd, perm), be.permute(gd, perm)
        got = be.to_host(be.leaky_relu_backward(gd, yd, slope))
        want = be.to_host(Backend.leaky_relu_backward(be, gd, yd, slope))
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                      np.ascontiguousarray(want).view(np.uint8))
