"""Shape and movement ops against torch CPU, on hypothesis-generated shapes where the op allows it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import flowgraph as fg

from .strategies import SETTINGS, close, data, fgt, nonempty_shapes, seeds, shapes, tt


@st.composite
def shape_and_perm(draw):
    shape = draw(shapes)
    perm = draw(st.permutations(range(len(shape))))
    return shape, tuple(perm)


@SETTINGS
@given(sp=shape_and_perm(), seed=seeds)
def test_permute_transpose(device, sp, seed):
    shape, perm = sp
    x = data(shape, seed)
    close(fgt(x, device).permute(perm), tt(x).permute(perm))
    close(fg.permute(fgt(x, device), *perm) if perm else fg.permute(fgt(x, device), perm), tt(x).permute(perm))
    if len(shape) >= 2:
        close(fgt(x, device).transpose(0, -1), tt(x).transpose(0, -1))
    close(fg.movedim(fgt(x, device), 0, -1) if shape else fgt(x, device), torch.movedim(tt(x), 0, -1)
          if shape else tt(x))


@SETTINGS
@given(shape=shapes, seed=seeds, data_=st.data())
def test_reshape_view_flatten(device, shape, seed, data_):
    x = data(shape, seed)
    n = x.size
    new = data_.draw(st.sampled_from([(n,), (1, n), (n, 1), (-1,), (1, -1, 1)] + ([(2, n // 2)] if n % 2 == 0 else [])))
    if 0 in new or (n == 0 and -1 in new):
        new = (n,)
    close(fgt(x, device).reshape(new), tt(x).reshape(new))
    close(fgt(x, device).view(*new), tt(x).view(*new))
    close(fgt(x, device).flatten(), tt(x).flatten())
    if len(shape) >= 2:
        close(fgt(x, device).flatten(1), tt(x).flatten(1))
        close(fgt(x, device).flatten(0, -2), tt(x).flatten(0, -2))
        close(fgt(x, device).unflatten(0, (shape[0], 1)), tt(x).unflatten(0, (shape[0], 1)))


@SETTINGS
@given(shape=shapes, seed=seeds)
def test_squeeze_unsqueeze(device, shape, seed):
    x = data(shape, seed)
    close(fgt(x, device).squeeze(), tt(x).squeeze())
    for d in range(-len(shape), len(shape)):
        close(fgt(x, device).squeeze(d), tt(x).squeeze(d))
    for d in range(-len(shape) - 1, len(shape) + 1):
        close(fgt(x, device).unsqueeze(d), tt(x).unsqueeze(d))
    with pytest.raises(fg.FlowError):
        fgt(x, device).unsqueeze(len(shape) + 2)


@SETTINGS
@given(shapes_=st.sampled_from([((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 2)), ((2, 1, 3), (2, 4, 3)),
                                ((1, 0), (3, 0))]), seed=seeds)
def test_expand_broadcast_to(device, shapes_, seed):
    small, big = shapes_
    x = data(small, seed)
    close(fgt(x, device).expand(big), tt(x).expand(big))
    close(fgt(x, device).expand(*big), tt(x).expand(*big))
    close(fg.broadcast_to(fgt(x, device), big), torch.broadcast_to(tt(x), big))
    close(fgt(x, device).expand_as(fg.zeros(big, device=device)), tt(x).expand_as(torch.zeros(big)))
    if small:
        keep = (-1,) * len(small)
        close(fgt(x, device).expand(*keep), tt(x).expand(*keep))
    with pytest.raises(fg.ShapeError):
        fgt(data((2, 3), 0), device).expand(4, 3)


@SETTINGS
@given(shape=nonempty_shapes, seed=seeds, reps=st.lists(st.integers(1, 3), min_size=4, max_size=5))
def test_repeat_and_interleave(device, shape, seed, reps):
    x = data(shape, seed)
    reps = tuple(reps[: max(len(shape), 1) + (len(reps) % 2)])
    if len(reps) < len(shape):
        reps = reps + (1,) * (len(shape) - len(reps))
    close(fgt(x, device).repeat(reps), tt(x).repeat(reps))
    close(fgt(x, device).repeat_interleave(2), tt(x).repeat_interleave(2))
    if shape:
        close(fgt(x, device).repeat_interleave(3, dim=-1), tt(x).repeat_interleave(3, dim=-1))


@SETTINGS
@given(shape=nonempty_shapes.filter(lambda s: len(s) >= 1), seed=seeds, n=st.integers(1, 3))
def test_cat_stack(device, shape, seed, n):
    xs = [data(shape, seed + i) for i in range(n)]
    for d in range(-len(shape), len(shape)):
        close(fg.cat([fgt(x, device) for x in xs], d), torch.cat([tt(x) for x in xs], d))
    for d in range(-len(shape) - 1, len(shape) + 1):
        close(fg.stack([fgt(x, device) for x in xs], d), torch.stack([tt(x) for x in xs], d))


def test_cat_promotes_and_skips_empty(device):
    a, b = np.ones((2, 2), np.float32), np.arange(4).reshape(2, 2)
    close(fg.cat([fgt(a, device), fgt(b, device)], 1), torch.cat([tt(a), tt(b)], 1))
    e = np.zeros((0,), np.float32)
    close(fg.cat([fgt(e, device), fgt(a, device)]), torch.cat([tt(e), tt(a)]))
    close(fg.concat([fgt(a, device), fgt(a, device)], 0), torch.concat([tt(a), tt(a)], 0))
    with pytest.raises(fg.ShapeError, match="tensor 1"):
        fg.cat([fg.zeros(2, 3, device=device), fg.zeros(2, 4, device=device)], 0)
    with pytest.raises(fg.ShapeError):
        fg.stack([fg.zeros(2, device=device), fg.zeros(3, device=device)])
    with pytest.raises(fg.FlowError):
        fg.cat([])


@SETTINGS
@given(shape=nonempty_shapes.filter(lambda s: len(s) >= 1), seed=seeds, size=st.integers(1, 5))
def test_split_chunk_unbind(device, shape, seed, size):
    x = data(shape, seed)
    for d in range(len(shape)):
        for a, b in zip(fgt(x, device).split(size, d), tt(x).split(size, d), strict=True):
            close(a, b)
        for a, b in zip(fgt(x, device).chunk(size, d), tt(x).chunk(size, d), strict=True):
            close(a, b)
        for a, b in zip(fgt(x, device).unbind(d), tt(x).unbind(d), strict=True):
            close(a, b)
    sections = [1, shape[0] - 1] if shape[0] > 1 else [1]
    for a, b in zip(fg.split(fgt(x, device), sections), torch.split(tt(x), sections), strict=True):
        close(a, b)
    with pytest.raises(fg.ShapeError):
        fg.split(fgt(x, device), [shape[0] + 1])


@SETTINGS
@given(shape=shapes, seed=seeds, data_=st.data())
def test_flip_roll(device, shape, seed, data_):
    x = data(shape, seed)
    if shape:
        dims = tuple(data_.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                                         unique_by=lambda d: d % len(shape))))
        close(fgt(x, device).flip(dims), tt(x).flip(dims))
        shifts = tuple(data_.draw(st.integers(-7, 7)) for _ in dims)
        close(fgt(x, device).roll(shifts, dims), tt(x).roll(shifts, dims))
    close(fgt(x, device).roll(3), tt(x).roll(3))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("widths", [(1, 2), (0, 1, 2, 0), (2, 1, 1, 1), (-1, 1)])
def test_pad(device, mode, widths):
    x = data((2, 3, 4), 0)
    if mode != "constant" and any(w < 0 for w in widths):
        pytest.skip("negative widths crop; torch only allows them for constant padding here")
    kwargs = {"value": 1.5} if mode == "constant" else {}
    close(fg.pad(fgt(x, device), widths, mode=mode, **kwargs), F.pad(tt(x), widths, mode=mode, **kwargs))


def test_narrow_t_contiguous_clone(device):
    x = data((3, 4), 0)
    close(fgt(x, device).narrow(1, 1, 2), tt(x).narrow(1, 1, 2))
    close(fgt(x, device).t(), tt(x).t())
    close(fgt(x, device).t().contiguous(), tt(x).t().contiguous())
    src = fgt(x, device)
    c = src.clone()
    c[0, 0] = 100.0
    assert c[0, 0].item() == 100.0 and src[0, 0].item() == x[0, 0]
    v = fg.zeros(3, device=device)
    assert v.t() is v
    close(fg.broadcast_tensors(fg.zeros(3, 1, device=device), fg.zeros(4, device=device))[1],
          torch.broadcast_tensors(torch.zeros(3, 1), torch.zeros(4))[1])


def test_shape_errors(device):
    x = fg.zeros(2, 3, device=device)
    with pytest.raises(fg.ShapeError, match=r"\(2, 3\).*\(4,"):
        x.reshape(4, 2)
    with pytest.raises(fg.ShapeError):
        x.reshape(-1, -1)
    with pytest.raises(fg.ShapeError):
        x.permute(0)
    with pytest.raises(fg.ShapeError):
        x.permute(0, 0)
    with pytest.raises(fg.ShapeError):
        fg.zeros(2, 2, 2, device=device).t()
    with pytest.raises(fg.FlowError, match="out of range"):
        x.transpose(0, 2)
    with pytest.raises(fg.ShapeError):
        x.repeat(2)
    with pytest.raises(fg.ShapeError):
        fg.cat([fg.zeros((), device=device), fg.zeros((), device=device)])


def test_views_share_storage_and_version(device):
    x = fg.arange(6.0, device=device)
    v = x.view(2, 3)
    v[0, 1] = 10.0
    assert x[1].item() == 10.0
    assert x._version == v._version > 0


@pytest.mark.parametrize("fn", ["split", "chunk", "unbind"])
def test_split_second_derivative_with_a_constant_piece_gradient(device, fn):
    """Under create_graph the pieces' gradients may mix constants (a piece the loss is linear in) and
    differentiable ones; the backward's concatenation stays differentiable in all of them (it had looked at the
    first piece only, and dropped the others' history), so second derivatives match torch."""
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    x0 = np.random.default_rng(0).standard_normal((4, 3))
    c0 = np.random.default_rng(1).standard_normal((2, 3))

    def pieces(mod, t):
        if fn == "split":
            return t.split(2, 0)
        if fn == "chunk":
            return t.chunk(2, 0)
        return mod.stack(t.unbind(0)[:2]), mod.stack(t.unbind(0)[2:])

    results = []
    for mod, make in ((fg, lambda a: fg.tensor(a, dtype=fg.float64, device=device, requires_grad=True)),
                      (torch, lambda a: torch.tensor(a, requires_grad=True))):
        x = make(x0)
        c = fg.tensor(c0, dtype=fg.float64, device=device) if mod is fg else torch.tensor(c0)
        y = x * x
        a, b = pieces(mod, y)
        loss = (a * c).sum() + (b * b * b).sum()
        (gx,) = mod.autograd.grad(loss, [x], create_graph=True)
        (ggx,) = mod.autograd.grad((gx * gx).sum(), [x])
        results.append(ggx.detach().cpu().numpy() if mod is torch else ggx.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-10, atol=1e-12)
