"""The shared row kernels (``flowgraph/backends/row_kernels.py``): LayerNorm and multi-tensor Adam.

Each backend's override is checked against the generic default on every available device (cpu, opencl here;
cuda on the GPU machine, where the CUDA-only tests at the end also run: the pointer-table cache and the
fallback inside CUDA-graph capture). The multi-tensor Adam must equal the per-tensor ``adam_step`` bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowgraph.backends import get_backend, row_kernels
from flowgraph.backends.base import Backend

F32 = np.float32


def _host(be, arrays):
    return [None if a is None else be.to_host(a) for a in arrays]


@pytest.mark.parametrize("rows,cols", [(1, 5), (6, 33), (3, 600), (40, 7), (300, 520), (2100, 40)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("g_sum", [False, True], ids=["g", "g-pending-sum"])
@pytest.mark.parametrize("x_pending", [False, True], ids=["x", "x-pending"])
def test_layer_norm_override_matches_the_generic_default(device, rows, cols, affine, g_sum, x_pending):
    """With ``g_sum`` the output gradient is a sum of two contributions (pending on a lazy backend, where the
    kernel adds them and writes the sum out: it must then hold the sum). With ``x_pending`` the input is a
    linear layer's bias and exact GELU over a matmul result (pending on a lazy backend, where the forward
    kernel computes it, erf included, and writes it out: it must then hold those values)."""
    be = get_backend(device)
    rng = np.random.default_rng(rows * cols)
    x = (rng.standard_normal((rows, cols)) * 2 + 3).astype(F32)
    g = rng.standard_normal((rows, cols)).astype(F32)
    w = rng.standard_normal(cols).astype(F32) if affine else None
    b = rng.standard_normal(cols).astype(F32) if affine else None
    bias = rng.standard_normal(cols).astype(F32)
    results = []
    for impl in (type(be), Backend):
        ops = [None if a is None else be.from_host(a) for a in (x, w, b, g)]
        if g_sum:
            ops[3] = be.add(be.from_host(g * 0.5), be.from_host(g * 0.5))
        if x_pending:
            ops[0] = be.gelu_exact(be.add(be.from_host(x), be.from_host(bias)))[0]
        y, mean, rstd = impl.layer_norm(be, ops[0], ops[1], ops[2], 1e-5)
        assert tuple(mean.shape) == (rows,) and tuple(rstd.shape) == (rows,)
        grads = impl.layer_norm_backward(be, ops[3], ops[0], mean, rstd, ops[1], True, affine, affine)
        results.append(_host(be, [y, mean, rstd, *grads, ops[0]]))
        np.testing.assert_array_equal(be.to_host(ops[3]), g)
    for fast, generic in zip(*results):
        if generic is None:
            assert fast is None
        else:
            np.testing.assert_allclose(fast, generic, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,cols", [(1, 5), (6, 33), (300, 520), (2100, 40), (4, 0)])
@pytest.mark.parametrize("g_pending", [False, True], ids=["g", "g-pending"])
def test_bias_grad_override_matches_the_generic_default(device, rows, cols, g_pending):
    """``bias_grad`` sums the rows; a pending ``g`` (an exact GELU's backward over a broadcast bias) is computed
    by the summing kernel on a lazy backend and must hold its values afterwards."""
    be = get_backend(device)
    rng = np.random.default_rng(rows * 7 + cols)
    g, h = (rng.standard_normal((rows, cols)).astype(F32) for _ in range(2))
    bias = rng.standard_normal(cols).astype(F32)
    results = []
    for impl in (type(be), Backend):
        gd = be.from_host(g)
        if g_pending:
            pre = be.add(be.from_host(h), be.from_host(bias))
            gd = be.gelu_exact_backward(gd, pre, be.gelu_exact(pre)[1])
        sums = impl.bias_grad(be, gd)
        assert tuple(sums.shape) == (cols,)
        results.append(_host(be, [sums, gd]))
    for fast, generic in zip(*results):
        np.testing.assert_allclose(fast, generic, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,cols", [(1, 5), (40, 7), (300, 520)])
@pytest.mark.parametrize("x_pending", [False, True], ids=["x", "x-pending"])
def test_layer_norm_with_a_residual_matches_the_generic_default(device, rows, cols, x_pending):
    """``layer_norm(..., residual)`` is ``residual + y``: written by the forward kernel on CUDA and OpenCL."""
    be = get_backend(device)
    rng = np.random.default_rng(rows + cols)
    x, res = (rng.standard_normal((rows, cols)).astype(F32) for _ in range(2))
    w, b, bias = (rng.standard_normal(cols).astype(F32) for _ in range(3))
    results = []
    for impl in (type(be), Backend):
        xd = be.from_host(x)
        if x_pending:
            xd = be.gelu_exact(be.add(xd, be.from_host(bias)))[0]
        out = impl.layer_norm(be, xd, be.from_host(w), be.from_host(b), 1e-5, be.from_host(res))
        results.append(_host(be, [*out, xd]))
    for fast, generic in zip(*results):
        np.testing.assert_allclose(fast, generic, rtol=2e-5, atol=2e-5)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_computed_inputs_property(device, data):
    """Random shapes (empty ones included) and a pending input over a row-broadcast, a column-broadcast and
    (maybe) a reversed leaf: ``bias_grad`` sums it, ``layer_norm`` (with or without a residual) normalises it,
    both as NumPy does, and the pending input holds its values afterwards."""
    be = get_backend(device)
    rows, cols = data.draw(st.integers(0, 70), label="rows"), data.draw(st.integers(0, 40), label="cols")
    flip = data.draw(st.booleans(), label="flip")
    residual = data.draw(st.booleans(), label="residual")
    rng = np.random.default_rng(rows * 41 + cols)
    a, res = (rng.standard_normal((rows, cols)).astype(F32) for _ in range(2))
    b, c = rng.standard_normal(cols).astype(F32), rng.standard_normal((rows, 1)).astype(F32)
    want = (a + b) * c - np.float32(0.5)

    def pending():
        xa = be.flip(be.from_host(a[:, ::-1].copy()), (1,)) if flip and cols else be.from_host(a)
        return be.sub(be.mul(be.add(xa, be.from_host(b)), be.from_host(c)), 0.5)

    g = pending()
    np.testing.assert_allclose(be.to_host(be.bias_grad(g)), want.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(be.to_host(g), want, rtol=1e-6, atol=1e-6)
    if cols == 0:
        return
    x = pending()
    y, mean, rstd = be.layer_norm(x, None, None, 1e-5, be.from_host(res) if residual else None)
    mu = want.mean(1, keepdims=True)
    r = 1 / np.sqrt(((want - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(be.to_host(y), (want - mu) * r + (res if residual else 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(be.to_host(x), want, rtol=1e-6, atol=1e-6)


def test_layer_norm_param_grads_on_small_work_groups(device, monkeypatch):
    """A device whose work-groups take 4 items runs 4-column strips of one lane: the same gradients."""
    be = get_backend(device)
    if not str(device).startswith("opencl"):
        pytest.skip("the work-group limit is queried per kernel on OpenCL only")
    rng = np.random.default_rng(7)
    x, g = (rng.standard_normal((70, 45)).astype(F32) for _ in range(2))
    w = rng.standard_normal(45).astype(F32)
    ops = [be.from_host(a) for a in (x, g, w)]
    _, mean, rstd = be.layer_norm(ops[0], ops[2], None, 1e-5)
    want = _host(be, Backend.layer_norm_backward(be, ops[1], ops[0], mean, rstd, ops[2], False, True, True))
    monkeypatch.setattr(type(be), "_group_limit", lambda self, kernel, cap=None: 4)
    got = _host(be, be.layer_norm_backward(ops[1], ops[0], mean, rstd, ops[2], False, True, True))
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


# (p, g, m, v) sizes: more than one OpenCL launch (8 tensors each), a tensor over several CUDA chunks, an empty one
SIZES = [(3, 4), (17,), (0,), (row_kernels.ADAM_CHUNK + 5,), (2, 3, 5), (1,), (64,), (9, 9), (33,), (4, 4)]


@pytest.mark.parametrize("kw", [
    dict(),
    dict(l2=0.1, maximize=True),
    dict(decay=0.99),
    dict(amsgrad=True),
], ids=["plain", "l2-maximize", "decoupled", "amsgrad"])
def test_adam_step_multi_equals_adam_step_bit_for_bit(device, kw):
    be = get_backend(device)
    kw = dict(kw)
    amsgrad = kw.pop("amsgrad", False)
    rng = np.random.default_rng(7)
    hosts = [[rng.standard_normal(s).astype(F32) for _ in range(3)] + [np.abs(rng.standard_normal(s)).astype(F32)]
             for s in SIZES]
    if amsgrad:
        for h in hosts:
            h.append(np.abs(rng.standard_normal(h[0].shape)).astype(F32))
    scalars = (0.9, 0.999, 1e-2 * 0.7, 1e-8 * 0.3)

    def arrays():
        return [[be.from_host(a) for a in h] for h in hosts]

    single = []
    for p, g, m, v, *vmax in arrays():
        single.append(_host(be, be.adam_step(p, g, m, v, *scalars, **kw, v_max=vmax[0] if vmax else None)))
    ops = arrays()
    ps, ms, vs, vmaxs = be.adam_step_multi([o[0] for o in ops], [o[1] for o in ops], [o[2] for o in ops],
                                           [o[3] for o in ops], *scalars, **kw,
                                           v_maxs=[o[4] for o in ops] if amsgrad else None)
    assert (vmaxs is None) == (not amsgrad)
    for i, one in enumerate(single):
        multi = _host(be, [ps[i], ms[i], vs[i], None if vmaxs is None else vmaxs[i]])
        for a, b in zip(one, multi):
            if a is None:
                assert b is None
            else:
                _same_update(device, a, b)


def test_adam_step_multi_mixed_dtypes_and_transposed_gradients(device):
    """Small and large tensors of two dtypes in one call, some gradients transposed views: each tensor gets
    what ``adam_step`` gives it (the NumPy backend updates the small ones of each dtype together)."""
    be = get_backend(device)
    if not _has_float64(be):
        pytest.skip(f"{device} has no float64")
    rng = np.random.default_rng(3)
    shapes = [((5, 3), F32), ((7,), np.float64), ((40, 60), F32), ((4, 6), np.float64), ((2,), F32),
              ((3, 5), np.float64)]
    hosts = [[rng.standard_normal(s).astype(dt) for _ in range(3)] + [np.abs(rng.standard_normal(s)).astype(dt)]
             for s, dt in shapes]
    scalars = (0.9, 0.999, 1e-2 * 0.7, 1e-8 * 0.3)

    def arrays():
        out = []
        for p, g, m, v in hosts:
            # a transposed gradient where the shape allows it: a non-contiguous view of the right shape
            gd = be.permute(be.from_host(np.ascontiguousarray(g.T)), (1, 0)) if g.ndim == 2 else be.from_host(g)
            out.append([be.from_host(p), gd, be.from_host(m), be.from_host(v)])
        return out

    single = [_host(be, be.adam_step(p, g, m, v, *scalars, l2=0.05)[:3]) for p, g, m, v in arrays()]
    ops = arrays()
    ps, ms, vs, _ = be.adam_step_multi(*([o[k] for o in ops] for k in range(4)), *scalars, l2=0.05)
    for i, one in enumerate(single):
        for a, b in zip(one, _host(be, [ps[i], ms[i], vs[i]])):
            assert a.dtype == b.dtype
            _same_update(device, a, b)


def _has_float64(be):
    check = getattr(be, "check_dtype", None)  # the device backends say which dtypes they compute
    if check is None:
        return True
    try:
        check(np.dtype(np.float64), "test")
    except Exception:  # noqa: BLE001 - a device without doubles
        return False
    return True


def _same_update(device, a, b):
    """Bit for bit, except on CUDA: NVRTC contracts ``sign * g + l2 * p`` into a fused multiply-add in one kernel
    and not the other (its choice, per kernel), which moves the last bit (seen with L2 decay and maximize)."""
    if str(device).startswith("cuda"):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(a, b)


def test_row_group_and_param_grad_parts():
    assert row_kernels.row_group(5, 256) == 8
    assert row_kernels.row_group(700, 256) == 256
    assert row_kernels.row_group(700, 100) == 64  # a kernel limit that is not a power of two
    assert row_kernels.row_group(1, 256) == 1
    parts, chunk = row_kernels.param_grad_parts(4096, 64)
    assert parts * chunk >= 4096 and (parts - 1) * chunk < 4096 and parts * 8 <= row_kernels.PARAM_TARGET_GROUPS
    assert chunk >= 64  # each of the 8 lanes sums at least 8 rows
    assert row_kernels.param_grad_parts(1, 1000) == (1, 1)
    assert row_kernels.param_grad_parts(256, 1024) == (1, 256)  # LayerNorm(1024) at batch 256: one launch
    assert row_kernels.param_grad_parts(60, 3) == (1, 60)
    assert row_kernels.param_grad_layout(256, 1024, 1024) == (8, 128, 1, 256)
    assert row_kernels.param_grad_layout(256, 1024, 256) == (8, 32, 1, 256)
    assert row_kernels.param_grad_layout(256, 1024, 4)[:2] == (4, 1)  # a device with 4-item work-groups


def test_shared_source_is_dialect_neutral():
    """One body for both backends: the shared module writes macros only, no OpenCL or CUDA keyword."""
    spec = row_kernels.layer_norm_forward(True, True)
    source = row_kernels.render(spec, {"FG_MAX_GROUP": 256})
    for word in ("__kernel", "__global__", "__shared__", "__local", "get_local_id", "threadIdx", "__syncthreads"):
        assert word not in source, word
    for macro in ("FG_KERNEL", "FG_LOCAL", "FG_BARRIER", "FG_LID", "FG_GID"):
        assert macro in source


ALL_SPECS = {
    "layer_norm": row_kernels.layer_norm_forward(True, True),
    "layer_norm_plain": row_kernels.layer_norm_forward(False, False),
    "layer_norm_residual": row_kernels.layer_norm_forward(False, True, None, True),
    "layer_norm_backward": row_kernels.layer_norm_backward(True),
    "layer_norm_backward_plain": row_kernels.layer_norm_backward(False),
    "layer_norm_backward_pair": row_kernels.layer_norm_backward(True, True),
    "gru_cell_bias": row_kernels.gru_cell_forward(True, True),
    "gru_cell_backward_pair": row_kernels.gru_cell_backward(True, True),
    "param_grads": row_kernels.LAYER_NORM_PARAM_GRADS,
    "adam_multi_table": row_kernels.ADAM_MULTI_TABLE,
    "adam_multi_table_device": row_kernels.ADAM_MULTI_TABLE_DEVICE,
    "layer_norm_computed": None,  # made per dtype: _computed_layer_norm
    "column_sum": row_kernels.column_sum(),
    "column_sum_computed": None,  # made per dtype: _computed_column_sum
    "batch_norm_row_moments": row_kernels.BATCH_NORM_ROW_MOMENTS,
    "batch_norm_stats": row_kernels.batch_norm_stats(False, False),
    "batch_norm_stats_w_running": row_kernels.batch_norm_stats(True, True),
    "batch_norm_row_grad_sums": row_kernels.BATCH_NORM_ROW_GRAD_SUMS,
    "batch_norm_grads": row_kernels.batch_norm_grads(False),
    "batch_norm_grads_w": row_kernels.batch_norm_grads(True),
}


@pytest.mark.parametrize("name", sorted(ALL_SPECS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_sources_compile_with_nvcc(tmp_path, name, dtype):
    """The CUDA side of the shared sources, checked where no GPU is: compiled to PTX with nvcc when it is on the
    PATH (the machine that runs cuda compiles them with NVRTC through CuPy)."""
    import shutil
    import subprocess

    from flowgraph.backends.cuda import kernels as cuda_kernels

    made = {"layer_norm_computed": _computed_layer_norm, "column_sum_computed": _computed_column_sum}
    spec = made[name](np.dtype(dtype)) if name in made else ALL_SPECS[name]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH")
    source = tmp_path / f"{name}.cu"
    source.write_text(cuda_kernels.row_kernel_source(spec, np.dtype(dtype)))
    done = subprocess.run([nvcc, "-ptx", "-arch=sm_80", str(source), "-o", str(tmp_path / f"{name}.ptx")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ptx = (tmp_path / f"{name}.ptx").read_text()
    assert f".entry {spec.name}" in ptx  # extern "C": the name CuPy's RawKernel looks up
    if "sqrt" in ptx:  # float32 stays float32 (no promotion to double), as in the per-tensor kernels
        assert ("sqrt.rn.f32" in ptx) == (dtype == "float32")


def _cuda_prologue(dtype: np.dtype) -> row_kernels.Prologue:
    """``erf(matmul + bias) * 0.5`` as a row kernel's computed input (CUDA's emitter)."""
    from types import SimpleNamespace

    from flowgraph.backends.cuda import kernels as cuda_kernels
    from flowgraph.backends.fusion import FusedProgram, Scalar

    leaves = [SimpleNamespace(dtype=dtype), SimpleNamespace(dtype=dtype)]
    instrs = [("add", dtype, (("l", 0), ("l", 1))), ("erf", dtype, (("v", 0),)), ("mul", dtype, (("v", 1), ("s", 0)))]
    program = FusedProgram(leaves, [Scalar(0.5, dtype)], instrs, ("v", 2))
    return row_kernels.prologue(program, cuda_kernels.CudaEmitter())


def _computed_layer_norm(dtype: np.dtype) -> row_kernels.RowKernel:
    return row_kernels.layer_norm_forward(True, True, _cuda_prologue(dtype), True)


def _computed_column_sum(dtype: np.dtype) -> row_kernels.RowKernel:
    return row_kernels.column_sum(_cuda_prologue(dtype))


# ------------------------------------------------------------------------------------- CUDA only
def _cuda_backend():
    be = get_backend("cuda:0") if "cuda:0" in _devices() else None
    if be is None:
        pytest.skip("no cuda device available here")
    return be


def _devices():
    from flowgraph.backends import available_devices

    return available_devices()


def test_cuda_adam_table_is_cached_by_pointers_and_kept_for_good_once_a_graph_records_it():
    be = _cuda_backend()
    rng = np.random.default_rng(1)
    hosts = [[rng.standard_normal(s).astype(F32) for _ in range(3)] + [np.abs(rng.standard_normal(s)).astype(F32)]
             for s in [(5, 3), (row_kernels.ADAM_CHUNK * 2 + 1,)]]
    ops = [[be.from_host(a) for a in h] for h in hosts]
    be._adam_tables.clear()
    kept = len(be._graph_tables)
    lists = [[o[k] for o in ops] for k in range(4)]
    be.adam_step_multi(*lists, 0.9, 0.999, 1e-3, 1e-8)
    be.adam_step_multi(*lists, 0.9, 0.999, 1e-3, 1e-8)
    assert len(be._adam_tables) == 1 and len(be._graph_tables) == kept  # the same addresses: reused
    fresh = [[be.from_host(a) for a in h] for h in hosts]
    be.capturing = True  # as fg.jit sets it while a CUDA graph records: the table is kept for the graph
    try:
        out = be.adam_step_multi(*[[o[k] for o in fresh] for k in range(4)], 0.9, 0.999, 1e-3, 1e-8)
    finally:
        be.capturing = False
    assert len(be._adam_tables) == 2 and len(be._graph_tables) == kept + 1
    expected = [[be.from_host(a) for a in h] for h in hosts]
    for i, (p, g, m, v) in enumerate(expected):
        be.adam_step(p, g, m, v, 0.9, 0.999, 1e-3, 1e-8)
        np.testing.assert_array_equal(be.to_host(out[0][i]), be.to_host(p))


def test_cuda_adam_multi_with_device_step_scalars_equals_the_per_tensor_kernel():
    be = _cuda_backend()
    rng = np.random.default_rng(2)
    hosts = [[rng.standard_normal(s).astype(F32) for _ in range(3)] + [np.abs(rng.standard_normal(s)).astype(F32)]
             for s in [(7, 3), (row_kernels.ADAM_CHUNK + 5,)]]
    step_size, eps_hat = be.from_host(np.array(1e-3, F32)), be.from_host(np.array(1e-8, F32))
    ops = [[be.from_host(a) for a in h] for h in hosts]
    be._adam_tables.clear()
    out = be.adam_step_multi(*[[o[k] for o in ops] for k in range(4)], 0.9, 0.999, step_size, eps_hat)
    assert len(be._adam_tables) == 1  # the table kernel ran, not the generic loop
    expected = [[be.from_host(a) for a in h] for h in hosts]
    for i, (p, g, m, v) in enumerate(expected):
        be.adam_step(p, g, m, v, 0.9, 0.999, step_size, eps_hat)
        for got, want in zip((out[0][i], out[1][i], out[2][i]), (p, m, v)):
            np.testing.assert_array_equal(be.to_host(got), be.to_host(want))


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (5, 4, 33), (1, 2, 40), (300, 3, 6, 6), (3, 2, 2, 2, 9), (4, 3, 5)],
                         ids=str)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "batch-last", "other", "mixed"])
def test_batch_norm_override_matches_the_generic_default(device, shape, affine, running, layout):
    """``batch_norm`` (rows' moments, then the channels' statistics and the running update, on CUDA and
    OpenCL; BLAS sums over per-channel blocks on NumPy) and ``batch_norm_backward`` against the generic
    default: outputs, statistics, the running buffers written in place, and the three gradients. ``(4, 3, 5)``
    has rows too short for the kernels (the default runs there too); ``(300, 3, 6, 6)`` merges more rows per
    channel than a work-group has items. ``batch-last``: ``x`` and ``g`` are ``(C, *S, N)`` arrays seen as
    ``(N, C, *S)`` (a convolution's output on the CPU), whose layout NumPy's result keeps; ``other``: a
    layout neither fast path takes on NumPy (the spatial axes reversed); ``mixed``: ``x`` batch-last and ``g``
    contiguous (a flatten's gradient reaching convnet's last batch norm), which NumPy lays out like ``x`` once."""
    be = get_backend(device)
    rng = np.random.default_rng(sum(shape))
    c = shape[1]
    nd = len(shape)
    if layout in ("batch-last", "mixed"):
        stored, view = (shape[1:] + shape[:1]), (nd - 1,) + tuple(range(nd - 1))
    elif layout == "other":
        stored, view = shape[:2] + shape[2:][::-1], (0, 1) + tuple(range(nd - 1, 1, -1))
    else:
        stored, view = shape, tuple(range(nd))
    x, g = (rng.standard_normal(stored).astype(F32) * 2 + 3 for _ in range(2))
    g_view = view
    if layout == "mixed":
        g, g_view = np.ascontiguousarray(g.transpose(view)), tuple(range(nd))
    w, b, rm, rv = (rng.standard_normal(c).astype(F32) for _ in range(4))
    rv = np.abs(rv) + 0.5
    results = []
    for impl in (type(be), Backend):
        wd, bd = (be.from_host(t) if affine else None for t in (w, b))
        rmd, rvd = (be.from_host(t) if running else None for t in (rm, rv))
        xd, gd = be.permute(be.from_host(x), view), be.permute(be.from_host(g), g_view)
        y, mean, var, rstd = impl.batch_norm(be, xd, wd, bd, 1e-5, rmd, rvd, 0.1)
        grads = impl.batch_norm_backward(be, gd, xd, mean, rstd, wd, True, affine, affine)
        if device == "cpu" and impl is not Backend:
            def strides(a):  # the layout, less the strides of length-1 axes (any value describes those)
                return [st for st, n in zip(a.strides, a.shape) if n > 1]

            assert strides(y) == strides(xd) and strides(grads[0]) == strides(xd)  # the layout is kept
        results.append(_host(be, [y, mean, var, rstd, rmd, rvd, *grads]))
    # The parameter gradients are sums over every element of a channel (10,800 for (300, 3, 6, 6)) of values
    # around 3 whose total cancels to ~100: two float32 summation orders differ by ~1e-4 of the summands'
    # magnitude there (both stay that close to a float64 sum), so their tolerance scales with it.
    summands = np.abs(g).sum() / c
    for n, (fast, generic) in enumerate(zip(*results)):
        if generic is None:
            assert fast is None
        else:
            atol = 1e-6 * summands if n >= 7 else 1e-4
            np.testing.assert_allclose(fast, generic, rtol=1e-4, atol=max(atol, 1e-4))


def test_cuda_adam_multi_checks_parameters_once_and_gradients_every_step():
    """The parameters and state of a multi-tensor Adam step are checked once and found again by identity at the
    next step (``_adam_checked``); the gradients are checked every step (a transposed one is made contiguous),
    a pending expression reading a parameter still runs before it is overwritten, a new parameter array is
    checked anew, and every step equals the per-tensor kernel."""
    be = _cuda_backend()
    rng = np.random.default_rng(4)
    hosts = [[rng.standard_normal(s).astype(F32) for _ in range(3)] + [np.abs(rng.standard_normal(s)).astype(F32)]
             for s in [(6, 4), (5,)]]
    ops = [[be.from_host(a) for a in h] for h in hosts]
    ref = [[be.from_host(a) for a in h] for h in hosts]
    be._adam_static.clear()
    params = [o[0] for o in ops]
    for step in range(3):
        grads = [be.from_host(rng.standard_normal(h[0].shape).astype(F32)) for h in hosts]
        if step == 1:  # a transposed gradient: the kernel takes a contiguous copy
            grads[0] = be.permute(be.from_host(np.ascontiguousarray(be.to_host(grads[0]).T)), (1, 0))
        before = be.mul(params[0], 1.0)  # pending, reads the parameter about to be overwritten
        want_before = be.to_host(ref[0][0])
        out = be.adam_step_multi(params, grads, [o[2] for o in ops], [o[3] for o in ops], 0.9, 0.999, 1e-3, 1e-8)
        np.testing.assert_array_equal(be.to_host(before), want_before)
        for i, (p, _, m, v) in enumerate(ref):
            be.adam_step(p, grads[i], m, v, 0.9, 0.999, 1e-3, 1e-8)
            for got, want in zip((out[0][i], out[1][i], out[2][i]), (p, m, v)):
                np.testing.assert_allclose(be.to_host(got), be.to_host(want), rtol=1e-6, atol=1e-7)
        params = list(out[0])
        assert len(be._adam_static) == 1  # the same arrays: checked once
    params[1] = be.from_host(be.to_host(params[1]))  # a replaced parameter: a new set, checked anew
    be.adam_step_multi(params, grads, [o[2] for o in ops], [o[3] for o in ops], 0.9, 0.999, 1e-3, 1e-8)
    assert len(be._adam_static) == 2
