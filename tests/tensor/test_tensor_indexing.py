"""Indexing against torch CPU: basic and advanced ``__getitem__``/``__setitem__``, gather, scatter,
index_select, masked_fill, where, take_along_dim, nonzero."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import flowgraph as fg

from .strategies import SETTINGS, close, data, fgt, int_data, seeds, tt

X_SHAPE = (4, 5, 3)


class T:
    """Marks an index array that becomes a tensor (flowgraph or torch) in the key."""

    def __init__(self, array):
        self.array = np.asarray(array)


def _keys():
    """Index expressions for a 4x5x3 tensor: name -> (key with T markers, whether torch accepts it)."""
    mask = np.random.default_rng(0).integers(0, 2, size=(4, 5)).astype(bool)
    mask1 = np.array([True, False, True, True])
    idx = np.array([0, 2, -1])
    idx2 = np.array([[1, 0], [3, 3]])
    return {
        "int": (1, True),
        "neg_int": (-1, True),
        "slice": (slice(1, 3), True),
        "slice_step": (slice(None, None, 2), True),
        "neg_step": (slice(None, None, -1), False),  # torch has no negative steps: NumPy is the oracle
        "neg_step_tuple": ((slice(None), slice(4, 0, -2)), False),
        "tuple": ((1, slice(None), 2), True),
        "ellipsis": ((Ellipsis, 0), True),
        "none": ((None, 1, None), True),
        "empty_slice": (slice(3, 1), True),
        "list": ([0, 2, 3], True),
        "tensor_idx": (T(idx), True),
        "tensor_idx2d": (T(idx2), True),
        "two_adv": ((T(idx), T(idx)), True),
        "adv_middle": ((slice(None), T(idx2)), True),
        "adv_split": ((T(idx), slice(None), T([0, 1, 2])), True),
        "adv_last": ((Ellipsis, T([2, 0])), True),
        "mask": (T(mask), True),
        "mask1": (T(mask1), True),
        "mask_then_slice": ((T(mask1), slice(1, 3)), True),
        "int_tensor_0d": (T(np.array(2)), True),
        "all": (slice(None), True),
        "out_of_range_slice": (slice(2, 100), True),
        "int_and_slice": ((-2, slice(1, None)), True),
    }


def _build(key, kind: str, device=None):
    """Replace T markers by flowgraph tensors, torch tensors or NumPy arrays."""
    def conv(item):
        if not isinstance(item, T):
            return item
        if kind == "fg":
            return fgt(item.array, device)
        if kind == "torch":
            return torch.tensor(item.array)
        return item.array

    if isinstance(key, tuple):
        return tuple(conv(k) for k in key)
    return conv(key)


KEYS = _keys()


@pytest.mark.parametrize("name", sorted(KEYS))
def test_getitem(device, name):
    x = data(X_SHAPE, 0)
    key, torch_ok = KEYS[name]
    out = fgt(x, device)[_build(key, "fg", device)]
    close(out, x[_build(key, "np")], check_dtype=False)
    if torch_ok:
        close(out, tt(x)[_build(key, "torch")])


@pytest.mark.parametrize("name", sorted(KEYS))
def test_setitem(device, name):
    x = data(X_SHAPE, 0)
    key, _ = KEYS[name]
    np_key = _build(key, "np")
    ref = x.copy()
    target_shape = ref[np_key].shape
    value = data(target_shape, 1)
    ref[np_key] = value
    out = fgt(x, device)
    out[_build(key, "fg", device)] = fgt(value, device)
    close(out, ref, check_dtype=False)
    # scalar assignment broadcasts
    ref2 = x.copy()
    ref2[np_key] = -7.0
    out2 = fgt(x, device)
    out2[_build(key, "fg", device)] = -7.0
    close(out2, ref2, check_dtype=False)


def test_getitem_errors(device):
    x = fg.zeros(2, 3, device=device)
    with pytest.raises(fg.FlowError, match="out of bounds"):
        x[2]
    # an out-of-range index tensor raises IndexError on every backend: at once on the cpu, at the next host
    # read on a device (checked there without a synchronisation)
    with pytest.raises(fg.IndexOutOfRangeError, match="out of range"):
        x[fg.tensor([0, 5], device=device)].tolist()
    with pytest.raises(IndexError):
        x.gather(1, fg.tensor([[0, 3], [1, 1]], device=device)).numpy()
    with pytest.raises(IndexError):
        fg.nn.Embedding(3, 2).to(device)(fg.tensor([[-1, 0]], device=device)).sum().item()
    assert x[fg.tensor([-1], device=device)].shape == (1, 3)  # negative advanced indices stay valid
    with pytest.raises(fg.FlowError, match="too many"):
        x[0, 0, 0]
    with pytest.raises(fg.FlowError):
        x[..., ...]
    with pytest.raises(fg.ShapeError):
        x[fg.tensor([True, False, True], device=device)]
    with pytest.raises(fg.FlowError):
        x[fg.tensor([0.5], device=device)]


def test_setitem_through_view_and_version(device):
    x = fg.zeros(3, 4, device=device)
    row = x[1]
    row[2] = 5.0
    assert x[1, 2].item() == 5.0
    v0 = x._version
    x[:, 0] = fg.tensor([1.0, 2.0, 3.0], device=device)
    assert x._version > v0
    close(x[:, 0], torch.tensor([1.0, 2.0, 3.0]))
    x[x > 2] = 0.0
    assert float(x.sum().item()) == 3.0
    xi = fg.zeros(4, dtype=fg.int64, device=device)
    xi[1:3] = 2.7  # cast to the target dtype, as torch does
    close(xi, torch.tensor([0, 2, 2, 0]))


@SETTINGS
@given(seed=seeds, dim=st.integers(-3, 2), small=st.booleans())
def test_gather_scatter(device, seed, dim, small):
    x = data((3, 4, 5), seed)
    d = dim % 3
    ishape = [2, 3, 4] if small else [3, 4, 5]
    idx = int_data(ishape, seed, 0, x.shape[d])
    src = data(ishape, seed + 1)
    close(fg.gather(fgt(x, device), dim, fgt(idx, device)), torch.gather(tt(x), dim, tt(idx)))
    close(fgt(x, device).gather(dim, fgt(idx, device)), tt(x).gather(dim, tt(idx)))
    close(fg.scatter_add(fgt(x, device), dim, fgt(idx, device), fgt(src, device)),
          torch.scatter_add(tt(x), dim, tt(idx), tt(src)), rtol=1e-5, atol=1e-6)
    # scatter with duplicate targets is order-dependent in torch: use a permutation along dim
    perm = np.argsort(np.random.default_rng(seed).random((3, 4, 5)), axis=d)
    close(fg.scatter(fgt(x, device), dim, fgt(perm, device), fgt(data((3, 4, 5), 2), device)),
          torch.scatter(tt(x), dim, tt(perm), tt(data((3, 4, 5), 2))))
    close(fg.scatter(fgt(x, device), dim, fgt(perm, device), 1.5), torch.scatter(tt(x), dim, tt(perm), 1.5))
    if not small:  # take_along_dim broadcasts index and input: (2, 3, 4) does not fit (3, 4, 5)
        close(fg.take_along_dim(fgt(x, device), fgt(idx, device), dim),
              torch.take_along_dim(tt(x), tt(idx), dim))


def test_take_along_dim_broadcasts(device):
    x = data((3, 4), 0)
    idx = np.array([[0], [3], [1]])
    close(fg.take_along_dim(fgt(x, device), fgt(idx, device), 1), torch.take_along_dim(tt(x), tt(idx), 1))
    am = fgt(x, device).argmax(1, keepdim=True)
    close(fg.take_along_dim(fgt(x, device), am, 1), tt(x).amax(1, keepdim=True))


@SETTINGS
@given(seed=seeds, dim=st.integers(-2, 1), n=st.integers(0, 6))
def test_index_select_and_index_add(device, seed, dim, n):
    x = data((4, 5), seed)
    idx = int_data((n,), seed, 0, x.shape[dim])
    close(fg.index_select(fgt(x, device), dim, fgt(idx, device)), torch.index_select(tt(x), dim, tt(idx)))
    shape = list(x.shape)
    shape[dim] = n
    src = data(tuple(shape), seed + 1)
    close(fg.index_add(fgt(x, device), dim, fgt(idx, device), fgt(src, device)),
          torch.index_add(tt(x), dim, tt(idx), tt(src)), rtol=1e-5, atol=1e-6)
    close(fgt(x, device).index_add(dim, fgt(idx, device), fgt(src, device), alpha=2.0),
          tt(x).index_add(dim, tt(idx), tt(src), alpha=2.0), rtol=1e-5, atol=1e-6)


def test_masked_fill_select_nonzero(device):
    x = data((3, 4), 0)
    m = x > 0
    close(fg.masked_fill(fgt(x, device), fgt(m, device), -1.0), tt(x).masked_fill(tt(m), -1.0))
    close(fgt(x, device).masked_fill(fgt(m[0], device), 2.0), tt(x).masked_fill(tt(m[0]), 2.0))
    close(fgt(x, device).masked_fill(fgt(m, device), fg.tensor(3.0, device=device)),
          tt(x).masked_fill(tt(m), torch.tensor(3.0)))
    close(fg.masked_select(fgt(x, device), fgt(m, device)), torch.masked_select(tt(x), tt(m)))
    close(fg.nonzero(fgt(m, device)), torch.nonzero(tt(m)))
    for a, b in zip(fg.nonzero(fgt(m, device), as_tuple=True), torch.nonzero(tt(m), as_tuple=True), strict=True):
        close(a, b)
    close(fgt(m, device).nonzero(), tt(m).nonzero())


def test_index_dtype_errors(device):
    x = fg.zeros(3, 4, device=device)
    with pytest.raises(fg.ShapeError):
        fg.gather(x, 0, fg.zeros(3, dtype=fg.int64, device=device))
    with pytest.raises(fg.ShapeError):
        fg.index_select(x, 0, fg.zeros(2, 2, dtype=fg.int64, device=device))
