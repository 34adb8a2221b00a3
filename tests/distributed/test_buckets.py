"""assign_buckets: cap respected, reverse registration order, frozen parameters excluded; given orders, units kept
together, a smaller first bucket."""

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.distributed import assign_buckets
from flowgraph.errors import FlowError


def _params(sizes, frozen=()):
    ps = [nn.Parameter(fg.zeros(n)) for n in sizes]
    for i in frozen:
        ps[i].requires_grad = False
    return ps


def test_cap_and_reverse_order():
    sizes = [100, 50, 300, 10, 200, 60]  # float32: 4 bytes each
    ps = _params(sizes)
    cap_mb = 1200 / (1024 * 1024)  # 1200 bytes = 300 floats
    buckets = assign_buckets(ps, cap_mb)
    flat = [i for b in buckets for i in b]
    assert flat == list(reversed(range(len(sizes))))
    assert buckets == [[5, 4, 3], [2], [1, 0]]
    for b in buckets:
        total = sum(sizes[i] * 4 for i in b)
        assert total <= 1200 or len(b) == 1


def test_oversized_parameter_gets_its_own_bucket():
    ps = _params([10, 1000, 10])
    assert assign_buckets(ps, 100 / (1024 * 1024)) == [[2], [1], [0]]


def test_frozen_excluded_and_dtype_split():
    ps = _params([4, 4, 4, 4], frozen=(1,))
    ps[3] = nn.Parameter(fg.zeros(4, dtype=fg.float64))
    buckets = assign_buckets(ps, 25)
    assert buckets == [[3], [2, 0]]
    assert all(1 not in b for b in buckets)


def test_default_cap_one_bucket_and_bad_cap():
    ps = _params([1000] * 5)
    assert assign_buckets(ps) == [[4, 3, 2, 1, 0]]
    with pytest.raises(FlowError, match="bucket_cap_mb and first_bucket_mb must be positive"):
        assign_buckets(ps, 0)


def test_given_order_units_together_and_small_first_bucket():
    sizes = [100, 10, 300, 10, 200, 10]  # (weight, bias) of three layers; float32: 4 bytes each
    ps = _params(sizes)
    units = ["a", "a", "b", "b", "c", "c"]
    order = [5, 4, 3, 2, 1, 0]  # backward: the last layer first
    cap_mb = 1300 / (1024 * 1024)  # 325 floats
    # without units the cap splits a layer: its bias waits in one bucket, its weight in the next
    assert assign_buckets(ps, cap_mb, order=order) == [[5, 4, 3], [2, 1], [0]]
    # with them a layer's weight and bias share a bucket, closed before the next layer would overflow it
    assert assign_buckets(ps, cap_mb, order=order, units=units) == [[5, 4], [3, 2], [1, 0]]
    # an order other than reverse registration is followed as given
    assert assign_buckets(ps, 25, order=[1, 0, 5, 4, 3, 2], units=units) == [[1, 0, 5, 4, 3, 2]]
    # the first bucket's own cap (at most the others'): the first unit alone, the rest together
    first_mb = 100 / (1024 * 1024)
    assert assign_buckets(ps, 25, order=order, units=units, first_bucket_mb=first_mb) == [[5, 4], [3, 2, 1, 0]]
    assert assign_buckets(ps, first_mb, order=order, units=units, first_bucket_mb=25) == [[5, 4], [3, 2], [1, 0]]
    with pytest.raises(FlowError, match="must be positive"):
        assign_buckets(ps, 25, first_bucket_mb=0)
