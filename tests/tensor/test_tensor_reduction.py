"""Reductions with dim and keepdim, against torch CPU and NumPy float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import flowgraph as fg

from .strategies import SETTINGS, close, data, fgt, host, int_data, nonempty_shapes, seeds, shapes, tt


@st.composite
def shape_and_dim(draw, base=shapes, allow_none=True, allow_tuple=True):
    """A shape and a valid ``dim`` for it: None, an int (maybe negative) or a tuple of distinct ints."""
    shape = draw(base)
    nd = len(shape)
    options = []
    if allow_none:
        options.append(st.none())
    if nd:
        options.append(st.integers(-nd, nd - 1))
        if allow_tuple:
            options.append(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True).map(tuple))
    else:
        options.append(st.sampled_from([0, -1]))
    dim = draw(st.one_of(*options))
    return shape, dim


def _torch_dim(dim):
    return dim


# name -> (flowgraph fn(x, dim, keepdim), torch fn, numpy fn(x64, axis, keepdims) or None, needs non-empty)
REDUCTIONS = {
    "sum": (lambda x, d, k: x.sum(d, keepdim=k), lambda x, d, k: x.sum(d, keepdim=k) if d is not None
            else (x.sum().reshape([1] * x.ndim) if k else x.sum()), np.sum, False),
    "mean": (lambda x, d, k: x.mean(d, keepdim=k), lambda x, d, k: x.mean(d, keepdim=k) if d is not None
             else (x.mean().reshape([1] * x.ndim) if k else x.mean()), None, False),
    "amax": (lambda x, d, k: x.amax(d, keepdim=k), lambda x, d, k: x.amax(() if d is None else d, keepdim=k),
             np.max, True),
    "amin": (lambda x, d, k: x.amin(d, keepdim=k), lambda x, d, k: x.amin(() if d is None else d, keepdim=k),
             np.min, True),
    "logsumexp": (lambda x, d, k: x.logsumexp(tuple(range(x.ndim)) if d is None else d, keepdim=k),
                  lambda x, d, k: x.logsumexp(tuple(range(x.ndim)) if d is None else d, keepdim=k), None, False),
    "norm": (lambda x, d, k: x.norm(dim=d, keepdim=k), lambda x, d, k: torch.linalg.vector_norm(x, dim=d, keepdim=k),
             None, False),
    "norm1": (lambda x, d, k: x.norm(p=1, dim=d, keepdim=k),
              lambda x, d, k: torch.linalg.vector_norm(x, ord=1, dim=d, keepdim=k), None, False),
    "norm3": (lambda x, d, k: x.norm(p=3, dim=d, keepdim=k),
              lambda x, d, k: torch.linalg.vector_norm(x, ord=3, dim=d, keepdim=k), None, False),
    "norm_inf": (lambda x, d, k: x.norm(p=math.inf, dim=d, keepdim=k),
                 lambda x, d, k: torch.linalg.vector_norm(x, ord=math.inf, dim=d, keepdim=k), None, True),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("keepdim", [False, True])
@SETTINGS
@given(sd=shape_and_dim(), seed=seeds)
def test_reduction(device, name, keepdim, sd, seed):
    shape, dim = sd
    fg_fn, torch_fn, np_fn, nonempty = REDUCTIONS[name]
    if nonempty:
        axes = range(len(shape)) if dim is None else ((dim,) if isinstance(dim, int) else dim)
        assume(all(shape[a] > 0 for a in axes) if shape else True)
        assume(math.prod(shape) > 0 or dim is not None)
    x = data(shape, seed)
    out = fg_fn(fgt(x, device), dim, keepdim)
    close(out, torch_fn(tt(x), dim, keepdim), rtol=1e-5, atol=1e-5)
    if np_fn is not None and (dim is None or shape):
        axis = dim if dim is not None else None
        ref = np_fn(x.astype(np.float64), axis=axis, keepdims=keepdim)
        close(out, ref, rtol=1e-5, atol=1e-5, check_dtype=False)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("correction", [0, 1])
@SETTINGS
@given(sd=shape_and_dim(base=nonempty_shapes), seed=seeds, keepdim=st.booleans())
def test_var_std(device, name, correction, sd, seed, keepdim):
    shape, dim = sd
    x = data(shape, seed)
    out = getattr(fg, name)(fgt(x, device), dim, keepdim=keepdim, correction=correction)
    ref = getattr(torch, name)(tt(x), dim, keepdim=keepdim, correction=correction)
    close(out, ref, rtol=1e-4, atol=1e-5)
    unbiased = getattr(fgt(x, device), name)(dim, keepdim=keepdim, unbiased=bool(correction))
    close(unbiased, ref, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(shape=nonempty_shapes, seed=seeds)
def test_prod(device, shape, seed):
    x = data(shape, seed, 0.5, 1.5)
    x.reshape(-1)[:: 3] = 0.0 if x.size > 4 else x.reshape(-1)[:: 3]
    close(fg.prod(fgt(x, device)), torch.prod(tt(x)), rtol=1e-5, atol=1e-6)
    for d in range(-len(shape), len(shape)):
        close(fg.prod(fgt(x, device), d, keepdim=True), torch.prod(tt(x), d, keepdim=True), rtol=1e-5, atol=1e-6)
        close(fgt(x, device).prod(d), tt(x).prod(d), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@SETTINGS
@given(sd=shape_and_dim(base=nonempty_shapes, allow_tuple=False), seed=seeds, keepdim=st.booleans())
def test_argmax_argmin(device, name, sd, seed, keepdim):
    shape, dim = sd
    x = int_data(shape, seed, -3, 3).astype(np.float32)  # ties: the first index wins, as in torch
    if dim is None:
        close(getattr(fg, name)(fgt(x, device)), getattr(torch, name)(tt(x)))
    else:
        close(getattr(fg, name)(fgt(x, device), dim, keepdim=keepdim),
              getattr(torch, name)(tt(x), dim, keepdim=keepdim))


@pytest.mark.parametrize("name", ["max", "min"])
@SETTINGS
@given(sd=shape_and_dim(base=nonempty_shapes, allow_none=False, allow_tuple=False), seed=seeds,
       keepdim=st.booleans())
def test_max_min_with_dim(device, name, sd, seed, keepdim):
    shape, dim = sd
    x = data(shape, seed)
    values, indices = getattr(fgt(x, device), name)(dim, keepdim=keepdim)
    ref = getattr(tt(x), name)(dim, keepdim=keepdim)
    close(values, ref.values)
    close(indices, ref.indices)
    out = getattr(fgt(x, device), name)(dim, keepdim)
    close(out.values, ref.values)
    close(getattr(fg, name)(fgt(x, device)), getattr(torch, name)(tt(x)))


def test_max_of_empty_is_an_error(device):
    with pytest.raises(fg.FlowError, match="empty"):
        fg.zeros(0, 3, device=device).max()
    with pytest.raises(fg.FlowError, match="empty"):
        fg.zeros(0, 3, device=device).max(0)
    close(fg.zeros(0, 3, device=device).max(1).values, torch.zeros(0, 3).max(1).values)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cumsum"])
@SETTINGS
@given(sd=shape_and_dim(allow_none=False, allow_tuple=False), seed=seeds)
def test_along_dim(device, name, sd, seed):
    shape, dim = sd
    x = data(shape, seed, -10, 10)
    out = getattr(fg, name)(fgt(x, device), dim)
    close(out, getattr(torch, name)(tt(x), dim), rtol=1e-5, atol=1e-5)
    close(getattr(fgt(x, device), name)(dim), getattr(tt(x), name)(dim), rtol=1e-5, atol=1e-5)


def test_softmax_is_stable_and_sums_to_one(device):
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, 1.0]], dtype=np.float32)
    out = fg.softmax(fgt(x, device), -1)
    close(out, torch.softmax(tt(x), -1))
    np.testing.assert_allclose(host(out).sum(-1), 1.0, rtol=1e-6)
    close(fg.log_softmax(fgt(x, device), 1), torch.log_softmax(tt(x), 1))
    close(fg.logsumexp(fgt(x, device), 1), torch.logsumexp(tt(x), 1))


def test_integer_and_bool_reductions(device):
    xi = int_data((3, 4), 0)
    xb = xi > 0
    close(fgt(xi, device).sum(), tt(xi).sum())
    close(fgt(xb, device).sum(0), tt(xb).sum(0))
    close(fgt(xi.astype(np.int32), device).sum(1), tt(xi.astype(np.int32)).sum(1))
    close(fgt(xi, device).cumsum(1), tt(xi).cumsum(1))
    close(fgt(xb, device).cumsum(0), tt(xb).cumsum(0))
    close(fgt(xi, device).amax(1), tt(xi).amax(1))
    close(fgt(xi, device).prod(0), tt(xi).prod(0))
    close(fgt(xb, device).any(1), tt(xb).any(1))
    close(fgt(xb, device).all(0, keepdim=True), tt(xb).all(0, keepdim=True))
    close(fgt(xi, device).any(), tt(xi).any())
    close(fg.count_nonzero(fgt(xi, device), 1), torch.count_nonzero(tt(xi), 1))
    close(fgt(xi, device).sum(dtype=fg.float32), tt(xi).sum(dtype=torch.float32))
    close(fgt(xi, device).mean(dtype=fg.float32), tt(xi).mean(dtype=torch.float32))


def test_mean_of_int_tensor_is_an_error(device):
    with pytest.raises(fg.FlowError, match="mean.*float"):
        fg.arange(5, device=device).mean()


def test_empty_reductions(device):
    x = np.zeros((0, 3), np.float32)
    close(fgt(x, device).sum(), tt(x).sum())
    close(fgt(x, device).sum(0), tt(x).sum(0))
    close(fgt(x, device).mean(), tt(x).mean())
    close(fgt(x, device).mean(0), tt(x).mean(0))
    close(fgt(x, device).prod(0), tt(x).prod(0))
    close(fgt(x, device).logsumexp(0), tt(x).logsumexp(0))
    close(fgt(x, device).cumsum(0), tt(x).cumsum(0))
    close(fgt(x, device).softmax(0), tt(x).softmax(0))


def test_dim_out_of_range_is_an_error(device):
    x = fg.zeros(2, 3, device=device)
    for fn in (lambda: x.sum(2), lambda: x.mean(-3), lambda: x.softmax(5), lambda: x.argmax(2),
               lambda: x.cumsum(3)):
        with pytest.raises(fg.FlowError, match="out of range"):
            fn()


def test_cumprod(device):
    x = data((3, 4), 0)
    close(fgt(x, device).cumprod(1), tt(x).cumprod(1), rtol=1e-5)
    close(fgt(x, device).cumprod(-2), tt(x).cumprod(-2), rtol=1e-5)
