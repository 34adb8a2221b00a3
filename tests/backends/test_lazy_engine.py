"""The lazy engine (``flowgraph.backends.lazy``) on every backend that uses it: CUDA and OpenCL.

One set of tests for the deferred-evaluation rules both device backends now share: when a chain runs, what
runs before a buffer is overwritten, in-place writes of a pending value, staging of a source that reads its
destination in another layout, and broadcasting of pending operands.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowgraph.backends import fusion, get_backend
from flowgraph.backends.lazy import BROADCAST_RECOMPUTE_NODES, LazyEngine, flatten
from flowgraph.errors import BackendError

F32 = np.float32


@pytest.fixture
def be(device):
    backend = get_backend(device)
    if not isinstance(backend, LazyEngine):
        pytest.skip(f"{device} computes eagerly (no lazy engine)")
    return backend


def host(be, a):
    return be.to_host(a)


def test_elementwise_chain_is_pending_until_read(be):
    x = be.from_host(np.arange(6, dtype=F32))
    y = be.mul(be.add(x, 1.0), 2.0)
    assert y.lazy is not None
    key, leaves, scalars = flatten(y)
    assert [op for op, _, _ in key[0]] == ["add", "mul"] and len(leaves) == 1 and len(scalars) == 2
    np.testing.assert_array_equal(host(be, y), (np.arange(6) + 1) * 2)
    assert y.lazy is None


def test_pending_readers_run_before_their_input_is_overwritten(be):
    p = be.from_host(np.arange(6, dtype=F32))
    g = be.from_host(np.ones(6, F32))
    old = be.mul(p, 1.0)  # pending, reads p
    twice = be.add(old, old)  # pending, reads p through ``old``
    upd = be.sub(p, be.mul(g, 0.5))
    out = be.assign(p, upd)
    np.testing.assert_allclose(host(be, out), np.arange(6) - 0.5)
    np.testing.assert_allclose(host(be, old), np.arange(6))
    np.testing.assert_allclose(host(be, twice), 2 * np.arange(6))
    np.testing.assert_allclose(host(be, upd), np.arange(6) - 0.5)


def test_in_place_source_shares_the_destination_until_it_is_written_again(be):
    x = be.from_host(np.arange(4, dtype=F32))
    y = be.add(x, 10.0)  # pending, reads x
    be.assign(x, y)  # x = x + 10 in one kernel; y now shares x's storage
    assert y.lazy is None
    later = be.mul(y, 2.0)  # pending reader of the shared storage
    be.assign(x, 0.0)  # y gets its own copy first; ``later`` runs first
    np.testing.assert_array_equal(host(be, x), np.zeros(4))
    np.testing.assert_array_equal(host(be, y), np.arange(4) + 10)
    np.testing.assert_array_equal(host(be, later), 2 * (np.arange(4) + 10))


def test_a_source_reading_its_destination_in_another_layout_is_staged(be):
    data = np.arange(9, dtype=F32).reshape(3, 3)
    x = be.from_host(data)
    swapped = be.add(be.permute(x, (1, 0)), 0.5)  # reads x transposed
    be.assign(x, swapped)
    np.testing.assert_array_equal(host(be, x), data.T + 0.5)


def test_assign_converts_and_broadcasts(be):
    x = be.from_host(np.zeros((2, 3), F32))
    be.assign(x, be.from_host(np.arange(3, dtype=np.int32)))
    np.testing.assert_array_equal(host(be, x), np.tile(np.arange(3, dtype=F32), (2, 1)))
    be.assign(x, 7)
    np.testing.assert_array_equal(host(be, x), np.full((2, 3), 7, F32))


def test_small_pending_operands_broadcast_without_a_kernel_large_ones_are_realized(be):
    col = be.from_host(np.arange(3, dtype=F32).reshape(3, 1))
    wide = be.from_host(np.ones((3, 4), F32))
    small = be.add(col, 1.0)
    out = be.mul(wide, small)
    assert small.lazy is not None, "a small pending operand is recomputed per element, not realized"
    big = col
    for _ in range(BROADCAST_RECOMPUTE_NODES + 1):
        big = be.add(big, 1.0)
    out_big = be.mul(wide, big)
    assert big.lazy is None, "a large pending operand runs once before it is broadcast"
    np.testing.assert_array_equal(host(be, out), np.tile(np.arange(3, dtype=F32).reshape(3, 1) + 1, (1, 4)))
    expected = np.arange(3, dtype=F32).reshape(3, 1) + BROADCAST_RECOMPUTE_NODES + 1
    np.testing.assert_array_equal(host(be, out_big), np.tile(expected, (1, 4)))


def test_fusion_off_realizes_every_op(be):
    x = be.from_host(np.arange(4, dtype=F32))
    fusion.set_enabled(False)
    try:
        y = be.where(be.gt(x, 1.0), x, 0.0)
        assert getattr(y, "lazy", None) is None
    finally:
        fusion.set_enabled(True)
    np.testing.assert_array_equal(host(be, y), np.where(np.arange(4) > 1, np.arange(4), 0))


@pytest.mark.parametrize("shape, pshape", [((3, 5, 7, 2), (1, 5, 1, 1)), ((4, 6, 9), (4, 1, 9)), ((7, 3), (7, 1))])
def test_kernels_with_dims_baked_in_match_the_general_kernel(be, monkeypatch, shape, pshape):
    """A large launch has its collapsed dims written into the kernel source as constants
    (``fusion.BAKE_DIMS_MIN``); lowered to 1 here, small broadcast and strided operations take that path and
    give the same values as the general kernel, and the baked kernel is cached per shape."""
    import sys

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(shape).astype(F32), rng.standard_normal(pshape).astype(F32)
    expected = np.maximum((x - w) * w + 1.5, 0)
    expected_t = np.swapaxes(x, 0, -1) * 2  # a transposed (strided) read
    module = sys.modules[type(be).__module__]
    got = []
    for limit in (1 << 62, 1):
        monkeypatch.setattr(module, "BAKE_DIMS_MIN", limit)
        getattr(be, "_ew_plans", {}).clear()  # CUDA keeps a launch plan per layout
        xa, wa = be.from_host(x), be.from_host(w)
        y = be.maximum(be.add(be.mul(be.sub(xa, wa), wa), 1.5), 0.0)
        t = be.mul(be.permute(xa, tuple(range(len(shape)))[::-1][:1] + tuple(range(1, len(shape) - 1)) + (0,)),
                   2.0)
        got.append((host(be, y), host(be, t)))
    for y, t in got:
        np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(t, expected_t, rtol=1e-6)
    # elementwise kernel keys end (..., outputs, baked dims or None, index type) on both backends
    baked = [k for k in be._kernels if isinstance(k, tuple) and k[0] == "ew" and k[-2] is not None]
    assert any(len(k[-2]) > 1 for k in baked)


def test_reader_registry_drops_freed_allocations_and_keeps_live_hazards(be, monkeypatch):
    """Entries of freed allocations leave the registry as it grows (``READER_ENTRIES``), so its weak references
    die young; a live pending reader of a live allocation is still realized before that allocation is written.
    The registry starts empty here: live readers that earlier tests in the same process left behind would
    otherwise raise its limit (a pytest-xdist worker read 853 entries)."""
    from flowgraph.backends.lazy import READER_ENTRIES

    monkeypatch.setattr(be, "_readers", {})
    monkeypatch.setattr(be, "_readers_limit", READER_ENTRIES)
    kept = be.from_host(np.arange(4, dtype=F32))
    reader = be.mul(kept, 3.0)  # pending reader of ``kept``, alive throughout
    for i in range(20 * READER_ENTRIES):
        tmp = be.from_host(np.full(4, i, F32))
        be.to_host(be.add(tmp, 1.0))  # a pending reader of a fresh allocation, then both freed
    assert len(be._readers) <= 2 * READER_ENTRIES + 2
    be.assign(kept, 0.0)
    np.testing.assert_array_equal(host(be, reader), 3 * np.arange(4))


def test_a_registry_sweep_while_a_node_registers_keeps_its_other_inputs_hazards(be, monkeypatch):
    """A pending node whose first input sweeps the reader registry (its allocation is new and the registry over
    its limit) still registers as a reader of its second input, whose entry the sweep dropped (its earlier
    readers were freed): a write into that input runs the node first. (The registration used to go into the
    registry the sweep replaced.)"""
    from flowgraph.backends.lazy import READER_ENTRIES

    monkeypatch.setattr(be, "_readers", {})
    monkeypatch.setattr(be, "_readers_limit", READER_ENTRIES)
    b = be.from_host(np.arange(4, dtype=F32))
    gone = be.add(b, 1.0)  # b's allocation gets an entry; its only reader is freed at once
    del gone
    kept = []  # alive, so no allocation's identity is reused by a later one
    for i in range(READER_ENTRIES):  # the registry at its limit plus one: entries whose readers are gone
        tmp = be.from_host(np.full(4, i, F32))
        kept.append(tmp)
        be.to_host(be.add(tmp, 1.0))
    assert len(be._readers) == READER_ENTRIES + 1
    a = be.from_host(np.full(4, 10.0, F32))
    out = be.add(a, b)  # registering ``a`` sweeps; ``b``'s entry goes with it
    assert out.lazy is not None
    be.assign(b, 0.0)
    np.testing.assert_array_equal(host(be, out), 10 + np.arange(4))


# ---------------------------------------------------------------------- values needed again: extra outputs
def _count_launches(be, monkeypatch) -> list:
    """Record ``(outputs, number of extras)`` of every fused elementwise launch of ``be`` from now on."""
    calls: list = []
    launch = be._launch_fused

    def counted(flat, root, out, outputs=(), extras=()):
        calls.append((outputs, len(extras)))
        return launch(flat, root, out, outputs, extras)

    monkeypatch.setattr(be, "_launch_fused", counted)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_a_saved_value_is_written_by_the_kernel_that_computes_it(be, monkeypatch, dtype):
    """A pending value autograd saved (``mark_saved``) inside a larger tree is stored by that tree's kernel, in
    its own dtype (a bool mask here too), and is realized from then on: nothing recomputes it."""
    if (dtype == np.float16 and not be.supports_float16) or (dtype == np.float64 and not be.supports_float64):
        pytest.skip(f"{be.device} does not compute {np.dtype(dtype)}")
    rng = np.random.default_rng(3)
    x, w = (rng.standard_normal((5, 7)).astype(dtype) for _ in range(2))
    xa, wa = be.from_host(x), be.from_host(w)
    calls = _count_launches(be, monkeypatch)
    prod = be.mul(xa, wa)
    mask = be.gt(prod, 0.0)
    be.mark_saved(prod)
    be.mark_saved(mask)
    out = be.add(be.where(mask, prod, be.mul(prod, 0.1)), 1.0)
    result = host(be, out)
    assert calls == [((0, 1), 2)]  # one kernel wrote the result, the product and the mask
    assert not be.is_pending(prod) and not be.is_pending(mask)
    want = (x * w).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(result, np.where(want > 0, want, want * dtype(0.1)) + 1, rtol=tol, atol=tol)
    np.testing.assert_allclose(host(be, prod), want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(host(be, mask), want > 0)
    assert calls == [((0, 1), 2)]  # reading them back ran no kernel


def test_a_value_another_pending_tree_reads_is_computed_once(be, monkeypatch):
    """Realizing one of two pending trees that share a value writes the shared value out; the other tree then
    reads it as a leaf. A value nothing else needs stays inside its kernel."""
    x = be.from_host(np.linspace(-1, 1, 12, dtype=F32))
    calls = _count_launches(be, monkeypatch)
    shared = be.exp(x)
    only_here = be.add(shared, 1.0)
    first = be.mul(only_here, 2.0)
    second = be.sub(shared, 3.0)
    np.testing.assert_allclose(host(be, first), (np.exp(np.linspace(-1, 1, 12)) + 1) * 2, rtol=1e-6)
    assert calls == [((0,), 1)]
    assert not be.is_pending(shared) and be.is_pending(only_here)
    assert flatten(second)[1] == [shared]  # the second tree reads the written value
    np.testing.assert_allclose(host(be, second), np.exp(np.linspace(-1, 1, 12)) - 3, rtol=1e-6)


def test_extra_outputs_are_capped_and_the_rest_recomputed_correctly(be, monkeypatch):
    """At most ``fusion.MAX_OUTPUTS`` interior values are written by one kernel; the others stay pending and
    give the same values when read."""
    x = be.from_host(np.arange(8, dtype=F32))
    calls = _count_launches(be, monkeypatch)
    steps = [x]
    for _ in range(fusion.MAX_OUTPUTS + 3):
        steps.append(be.add(be.mul(steps[-1], 0.5), 1.0))
        be.mark_saved(steps[-1])
    host(be, steps[-1])
    assert len(calls) == 1 and calls[0][1] == fusion.MAX_OUTPUTS
    assert sum(be.is_pending(s) for s in steps[1:-1]) == len(steps) - 2 - fusion.MAX_OUTPUTS
    want = np.arange(8, dtype=np.float64)
    for s in steps[1:]:
        want = want * 0.5 + 1
        np.testing.assert_allclose(host(be, s), want, rtol=1e-6)


def test_extra_outputs_of_a_strided_write(be):
    """A pending source written into a strided view (``assign`` to a transposed slice) stores its saved interior
    values contiguously, with the right values."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6)).astype(F32)
    dst_host = np.zeros((6, 4), F32)
    xa, dst = be.from_host(x), be.from_host(dst_host)
    inner = be.tanh(xa)
    be.mark_saved(inner)
    view = be.permute(dst, (1, 0))
    be.assign(view, be.mul(inner, 2.0))
    assert not be.is_pending(inner)
    np.testing.assert_allclose(host(be, inner), np.tanh(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(host(be, dst), (2 * np.tanh(x)).T, rtol=1e-6, atol=1e-6)


def test_autograd_saves_are_not_recomputed_in_backward(be, monkeypatch):
    """A product saved by the op that reads it is stored by the forward kernel: the backward's kernels read it
    instead of recomputing it, and the gradients equal NumPy's."""
    import flowgraph as fg

    rng = np.random.default_rng(7)
    x_h, w_h, v_h = (rng.standard_normal(16).astype(F32) for _ in range(3))
    x = fg.tensor(x_h, device=be.device)
    w = fg.tensor(w_h, device=be.device, requires_grad=True)
    v = fg.tensor(v_h, device=be.device, requires_grad=True)
    hidden = x * w  # saved by the next mul (for v's gradient)
    out = (hidden * v + 1.0) * v
    be.contiguous(out._data)
    assert not be.is_pending(hidden._data)
    out.backward(fg.ones_like(out))
    np.testing.assert_allclose(w.grad.numpy(), x_h * v_h * v_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), 2 * x_h * w_h * v_h + 1, rtol=1e-5, atol=1e-6)


def test_concatenate_writes_pending_pieces_into_their_slices(be, monkeypatch):
    """``concatenate`` is the lazy engine's on every lazy backend (not a wrapper that realizes each piece and
    copies it again): a pending piece is computed by one kernel straight into its slice and stays pending."""
    x = be.from_host(np.arange(6, dtype=F32).reshape(2, 3))
    y = be.from_host(np.ones((1, 3), F32))
    calls = _count_launches(be, monkeypatch)
    first, second = be.mul(x, 2.0), be.add(y, 1.0)
    out = be.concatenate([first, second, y], 0)
    assert len(calls) == 3 and be.is_pending(first) and be.is_pending(second)
    np.testing.assert_array_equal(host(be, out), np.concatenate([np.arange(6).reshape(2, 3) * 2,
                                                                 np.full((1, 3), 2), np.ones((1, 3))]))


def test_size_caps_count_distinct_leaves_and_exact_chains(be):
    """A chain reading one weight at every op counts it as one leaf (it stays one kernel up to MAX_NODES ops,
    then the next op runs it); a tree with shared nodes counts each once when its bound passes the cap."""
    # realized arrays of the lazy type (a CUDA from_host array is wrapped anew by each op that reads it)
    x = be._as_leaf(be.from_host(np.arange(6, dtype=F32)))
    w = be._as_leaf(be.from_host(np.full(6, 0.5, F32)))
    h = x
    for i in range(fusion.MAX_NODES):
        h = be.add(h, w) if i % 2 else be.mul(h, w)
        assert h.lazy is not None and h.lazy.leaves == 2 and h.lazy.path and h.lazy.nodes == i + 1
    key, leaves, _ = flatten(h)
    assert len(key[0]) == fusion.MAX_NODES and len(leaves) == 2
    longer = be.mul(h, w)  # past the cap: h runs first, the new node reads it as a leaf
    assert h.lazy is None and longer.lazy.nodes == 1
    expect = np.arange(6, dtype=F32)
    for i in range(fusion.MAX_NODES):
        expect = expect + F32(0.5) if i % 2 else expect * F32(0.5)
    np.testing.assert_allclose(host(be, longer), expect * 0.5, rtol=1e-6)

    # a diamond: every level reads the one below twice, so the bound doubles (past the cap at the fourth
    # level) while the tree grows by three nodes a level: it stays one pending tree, counted exactly
    d = be.add(x, 1.0)
    for _ in range(6):
        d = be.mul(be.add(d, w), be.sub(d, w))
        assert d.lazy is not None and not d.lazy.path
    assert d.lazy.nodes == len(flatten(d)[0][0]) == 19


def test_too_many_distinct_leaves_run_the_tree_first(be):
    arrays = [be._as_leaf(be.from_host(np.full(3, i, F32))) for i in range(fusion.MAX_LEAVES + 1)]
    s = arrays[0]
    for a in arrays[1:fusion.MAX_LEAVES]:
        s = be.add(s, a)
    assert s.lazy is not None and s.lazy.leaves == fusion.MAX_LEAVES
    t = be.add(s, arrays[fusion.MAX_LEAVES])
    assert s.lazy is None and t.lazy.leaves == 2
    np.testing.assert_allclose(host(be, t), np.full(3, sum(range(fusion.MAX_LEAVES + 1)), F32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_output_and_input_gradient_are_one_pending_instruction_each(be, dtype):
    rng = np.random.default_rng(3)
    n, c, h, w = 2, 3, 4, 5
    x_h = rng.standard_normal((n, c, h, w)).astype(dtype) * 2 + 1
    g_h = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt_h, b_h = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    x, g, wt, b = (be.from_host(a) for a in (x_h, g_h, wt_h, b_h))
    tol = 1e-5 if dtype == np.float32 else 1e-12

    for bias in (b, None):
        y, mean, _, rstd = be.batch_norm(x, wt, bias, 1e-5)
        assert y.lazy is not None
        assert [op for op, _, _ in flatten(y)[0][0]] == ["norm_scale" if bias is None else "norm_affine"]
        relu = be.maximum(y, 0.0)  # the instruction fuses with what reads it: one kernel
        assert [op for op, _, _ in flatten(relu)[0][0]][0].startswith("norm_")
        m = x_h.mean(axis=(0, 2, 3), keepdims=True)
        xhat = (x_h - m) / np.sqrt(x_h.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
        expect = xhat * wt_h.reshape(1, c, 1, 1) + (0 if bias is None else b_h.reshape(1, c, 1, 1))
        np.testing.assert_allclose(host(be, relu), np.maximum(expect, 0), rtol=tol, atol=tol)

    gx, gw, gb = be.batch_norm_backward(g, x, mean, rstd, wt, True, True, True)
    assert [op for op, _, _ in flatten(gx)[0][0]] == ["norm_input_grad"]
    count = n * h * w
    gxhat = g_h * wt_h.reshape(1, c, 1, 1)
    expect = (gxhat - gxhat.mean(axis=(0, 2, 3), keepdims=True)
              - xhat * (gxhat * xhat).sum(axis=(0, 2, 3), keepdims=True) / count) / np.sqrt(
        x_h.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(host(be, gx), expect, rtol=10 * tol, atol=10 * tol)
    np.testing.assert_allclose(host(be, gb), g_h.sum(axis=(0, 2, 3)), rtol=tol, atol=10 * tol)
    np.testing.assert_allclose(host(be, gw), (g_h * xhat).sum(axis=(0, 2, 3)), rtol=tol, atol=10 * tol)


def test_the_normalization_instructions_take_float_operands_only():
    emitter = fusion.CEmitter()
    emitter.CTYPES = {np.dtype(np.int32): "int", np.dtype(np.float32): "float"}
    i32, f32 = np.dtype(np.int32), np.dtype(np.float32)
    assert emitter.apply("norm_scale", [("x", f32), ("m", f32), ("s", f32)], f32) == "((x - m) * s)"
    with pytest.raises(BackendError, match="norm_scale.*3 float operands"):
        emitter.apply("norm_scale", [("x", i32), ("m", i32), ("s", i32)], i32)
    with pytest.raises(BackendError, match="norm_affine.*4 float operands, got 3"):
        emitter.apply("norm_affine", [("x", f32), ("m", f32), ("s", f32)], f32)
