"""NumPy's multi-pass elementwise chains (erf, exact GELU's forward with its derivative) run block by block on
large contiguous float32 arrays (``NumpyBackend._EW_BLOCK``, so the passes stay in cache): the same operations in the
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
    y, d = be.gelu_exact(x)
    want_y, want_d = (np.empty_like(x) for _ in range(2))
    NumpyBackend._gelu32_into(x, want_y, want_d, *(np.empty_like(x) for _ in range(3)))
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(d, want_d)
    assert be.gelu_exact(x, grad=False)[1] is None
    np.testing.assert_array_equal(be.gelu_exact(x, grad=False)[0], want_y)
    np.testing.assert_array_equal(be.gelu_exact_backward(g, x, d), g * want_d)


def test_float32_gelu_fit_against_float64():
    """The float32 GELU fit (``_GELU32_A``) and its derivative within 6e-7 of float64 GELU over the whole
    range, where float32 PyTorch's own error is 1.1e-6; infinities and NaN as the formula gives them."""
    be = get_backend("cpu")
    x64 = np.concatenate([np.linspace(-14, 14, 280001), [0.0, -0.0, 1e-30, -1e-30]])
    x = x64.astype(np.float32)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
    want_y = x * cdf
    want_d = cdf + x * np.exp(-x.astype(np.float64) ** 2 / 2) / math.sqrt(2 * math.pi)
    y, d = be.gelu_exact(x)
    np.testing.assert_allclose(y, want_y, rtol=0, atol=6e-7)
    np.testing.assert_allclose(d, want_d, rtol=0, atol=6e-7)
    y, d = be.gelu_exact(np.array([np.inf, np.nan, 40.0, -40.0], np.float32))
    assert y[0] == np.inf and np.isnan(y[1]) and y[2] == 40.0 and y[3] == 0.0
    assert np.isnan(d[1]) and d[2] == 1.0 and d[3] == 0.0


def test_non_contiguous_and_other_dtypes_take_the_whole_array_path():
    be = get_backend("cpu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2 * BLOCK + 3, 2)).astype(np.float32)
    t = x.T  # not C-contiguous
    np.testing.assert_array_equal(be.erf(t), ArrayBackend.erf(be, t))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(be.gelu_exact(x64)[0], x64 * 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2))),
                               rtol=2e-7, atol=1e-12)  # the float64 erfc fit: relative error < 1.2e-7
