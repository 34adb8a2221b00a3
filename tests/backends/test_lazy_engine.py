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
    baked = [k for k in be._kernels if isinstance(k, tuple) and k[0] == "ew" and k[-1] is not None]
    assert any(len(k[-1]) > 1 for k in baked)


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
