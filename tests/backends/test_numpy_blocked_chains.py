"""NumPy's multi-pass elementwise chains (erf, exact GELU forward and backward) run block by block on large
contiguous float32 arrays (``NumpyBackend._EW_BLOCK``, so the passes stay in cache): the same operations in the
same order as the whole-array path, so the same bits, at and across block boundaries and for odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowgraph.backends import get_backend
from flowgraph.backends.array_backend import ArrayBackend, NumpyBackend

BLOCK = NumpyBackend._EW_BLOCK


@pytest.mark.parametrize("shape", [(BLOCK + 1,), (3, BLOCK // 2 + 7), (2, 2 * BLOCK), (BLOCK,), (7, 5)], ids=str)
def test_blocked_chains_equal_the_whole_array_path_bit_for_bit(shape):
    be = get_backend("cpu")
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = (0.0, 5.0, -9.0)  # zero and both clamped ends
    g = rng.standard_normal(shape).astype(np.float32)

    np.testing.assert_array_equal(be.erf(x), ArrayBackend.erf(be, x))
    y, cdf = be.gelu_exact(x)
    want_cdf = ArrayBackend.erf(be, np.multiply(x, 1.0 / math.sqrt(2.0)))
    want_cdf += 1.0
    want_cdf *= 0.5
    np.testing.assert_array_equal(cdf, want_cdf)
    np.testing.assert_array_equal(y, np.multiply(x, want_cdf))
    want_gx = np.empty_like(x)
    NumpyBackend._gelu_grad_into(want_gx, g, x, cdf)
    np.testing.assert_array_equal(be.gelu_exact_backward(g, x, cdf), want_gx)


def test_non_contiguous_and_other_dtypes_take_the_whole_array_path():
    be = get_backend("cpu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2 * BLOCK + 3, 2)).astype(np.float32)
    t = x.T  # not C-contiguous
    np.testing.assert_array_equal(be.erf(t), ArrayBackend.erf(be, t))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(be.gelu_exact(x64)[0], x64 * 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2))),
                               rtol=2e-7, atol=1e-12)  # the float64 erfc fit: relative error < 1.2e-7
