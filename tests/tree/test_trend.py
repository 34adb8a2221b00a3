"""Trend queries against numpy.polyfit and numpy.var."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowgraph.errors import FlowError
from flowgraph.tree import Trend, TrendGroup

values = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(values, st.integers(0, 45))
def test_slope_matches_polyfit(vals, n):
    t = Trend(vals)
    window = vals[-n:] if n > 0 else vals
    expected = np.polyfit(np.arange(len(window)), window, 1)[0] if len(window) >= 2 else 0.0
    assert t.slope(n) == pytest.approx(expected, rel=1e-6, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(values, st.integers(0, 45))
def test_variance_mean_min_max_match_numpy(vals, n):
    t = Trend(vals)
    window = vals[-n:] if n > 0 else vals
    if not window:
        assert math.isnan(t.variance(n)) and math.isnan(t.mean(n))
        return
    assert t.variance(n) == pytest.approx(np.var(window), rel=1e-6, abs=1e-6)
    assert t.mean(n) == pytest.approx(np.mean(window), rel=1e-9, abs=1e-9)
    assert t.min(n) == min(window) and t.max(n) == max(window)
    assert t.last(n) == window
    assert t.latest == vals[-1]


def test_improving_respects_mode():
    down = Trend([5, 4, 3, 2])
    up = Trend([1, 2, 3, 4], mode="max")
    assert down.improving() and not Trend([5, 4, 3, 2], mode="max").improving()
    assert up.improving() and not Trend([1, 2, 3, 4]).improving()
    assert down.best() == 2 and up.best() == 4


def test_stalled_and_converged_absolute_and_relative():
    flat = Trend([1.0, 1.0001, 0.9999, 1.0])
    assert flat.stalled(0, tol=1e-3)
    assert not Trend([1, 2, 3, 4]).stalled(0, tol=1e-3)
    assert flat.converged(0, tol=1e-6)
    big = Trend([1000.0, 1000.5, 999.5, 1000.0])
    assert not big.stalled(0, tol=1e-3)
    assert big.stalled(0, tol=1e-3, relative=True)
    assert big.converged(0, tol=1e-6, relative=True) and not big.converged(0, tol=1e-6)
    assert not Trend([1.0]).stalled() and not Trend([1.0]).converged()


def test_last_n_window():
    t = Trend([10, 9, 8, 1, 2, 3])
    assert t.improving(0) and not t.improving(3)
    assert t.slope(3) == pytest.approx(1.0)


def test_group_queries():
    g = TrendGroup([Trend([3, 2, 1]), Trend([1, 2, 3], mode="max"), Trend([1, 1, 1])])
    assert not g.all_improving() and g.any_improving()
    assert g.any_stalled(tol=1e-9) and not g.all_stalled(tol=1e-9)
    assert g.any_converged() and not g.all_converged()
    assert g.mean_slope() == pytest.approx(0.0)
    assert len(g) == 3 and g[0].latest == 1


def test_bad_mode_is_a_clear_error():
    with pytest.raises(FlowError, match="mode must be 'min'"):
        Trend([1, 2], mode="up")
