"""dtype promotion against torch for every pair of the 7 dtypes, with 0-d tensors and Python scalars; casts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import flowgraph as fg

from .strategies import FG_DTYPES, TORCH_DTYPES, close, skip_unless_dtypes

NAMES = list(FG_DTYPES)


def _pair(device, name, shape):
    fg_t = fg.ones(shape, dtype=FG_DTYPES[name], device=device)
    t_t = torch.ones(shape, dtype=TORCH_DTYPES[name])
    return fg_t, t_t


def _ok(device, *names):
    skip_unless_dtypes(device, *names)


@pytest.mark.parametrize("a,b", list(itertools.product(NAMES, NAMES)))
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((3,), ()), ((), (3,)), ((), ())], ids=["nd-nd", "nd-0d", "0d-nd",
                                                                                          "0d-0d"])
def test_promotion_tensor_tensor(device, a, b, shapes):
    _ok(device, a, b)
    fa, ta = _pair(device, a, shapes[0])
    fb, tb = _pair(device, b, shapes[1])
    expected = (ta * tb).dtype
    assert (fa + fb).dtype.name == str((ta + tb).dtype).removeprefix("torch."), f"{a} + {b}"
    assert (fa * fb).dtype.name == str(expected).removeprefix("torch."), f"{a} * {b}"
    if "bool" not in (a, b):
        assert (fa - fb).dtype.name == str((ta - tb).dtype).removeprefix("torch.")
    assert fg.promote_types(FG_DTYPES[a], FG_DTYPES[b]).name == str(
        torch.promote_types(TORCH_DTYPES[a], TORCH_DTYPES[b])).removeprefix("torch.")
    assert fg.where(fg.ones(3, dtype=fg.bool, device=device), fa, fb).dtype.name == str(
        torch.where(torch.ones(3, dtype=torch.bool), ta, tb).dtype).removeprefix("torch.")
    assert (fa / fb).dtype.name == str((ta / tb).dtype).removeprefix("torch.")


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("scalar", [True, 2, 2.5], ids=["bool", "int", "float"])
@pytest.mark.parametrize("shape", [(3,), ()], ids=["nd", "0d"])
def test_promotion_tensor_scalar(device, a, scalar, shape):
    _ok(device, a)
    fa, ta = _pair(device, a, shape)
    for fn in (lambda x: x + scalar, lambda x: scalar * x, lambda x: x / scalar, lambda x: scalar / x,
               lambda x: x**scalar):
        try:
            ref = fn(ta)
        except (RuntimeError, NotImplementedError):
            continue
        assert fn(fa).dtype.name == str(ref.dtype).removeprefix("torch."), f"{a} with {scalar!r}"
    close(fa * scalar, ta * scalar, rtol=1e-2)


def test_default_dtype_switch(device):
    _ok(device, "float64")
    fg.set_default_dtype(fg.float64)
    try:
        assert fg.tensor([1.0], device=device).dtype is fg.float64
        assert (fg.arange(3, device=device) * 0.5).dtype is fg.float64
        assert fg.zeros(2, device=device).dtype is fg.float64
    finally:
        fg.set_default_dtype(fg.float32)
    assert fg.get_default_dtype() is fg.float32
    with pytest.raises(fg.FlowError):
        fg.set_default_dtype(fg.int32)


@pytest.mark.parametrize("src,dst", list(itertools.product(NAMES, NAMES)))
def test_cast_matches_torch(device, src, dst):
    _ok(device, src, dst)
    values = np.array([-2.7, -1.0, 0.0, 0.5, 1.0, 3.9])
    ts = torch.tensor(values).to(TORCH_DTYPES[src])
    fs = fg.tensor(values, device=device).to(FG_DTYPES[src])
    close(fs, ts)
    close(fs.to(FG_DTYPES[dst]), ts.to(TORCH_DTYPES[dst]))


def test_dtype_objects_and_shortcuts(device):
    skip_unless_dtypes(device, "float16", "bfloat16")
    x = fg.tensor([1.5, -2.5], device=device)
    assert x.double().dtype is fg.float64 if fg.get_backend(device).supports_float64 else True
    assert x.half().dtype is fg.float16 and x.bfloat16().dtype is fg.bfloat16
    assert x.long().dtype is fg.int64 and x.int().dtype is fg.int32 and x.bool().dtype is fg.bool
    assert x.float() is x and x.to(fg.float32) is x
    assert x.type(fg.int64).tolist() == [1, -2]
    assert fg.float is fg.float32 and fg.long is fg.int64 and fg.half is fg.float16
    assert repr(fg.float32) == "flowgraph.float32"
    assert fg.as_dtype("torch.float16") is fg.float16 and fg.as_dtype(np.float32) is fg.float32
    assert fg.as_dtype(torch.int32) is fg.int32 and fg.as_dtype(float) is fg.float32 and fg.as_dtype(bool) is fg.bool
    assert x.is_floating_point() and not x.long().is_floating_point()
    assert x.element_size() == 4 and x.half().element_size() == 2
    with pytest.raises(fg.FlowError):
        fg.as_dtype("complex64")
    with pytest.raises(fg.FlowError):
        fg.tensor(np.array([1 + 2j]), device=device)
