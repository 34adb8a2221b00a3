"""matmul (1-d rules, batch broadcasting), mm, bmm, dot, outer and einsum against torch CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import flowgraph as fg

from .strategies import SETTINGS, close, data, fgt, int_data, seeds, tt, unsupported_dtype


@st.composite
def matmul_shapes(draw):
    """Two shapes valid for matmul: 1-d or n-d, batch dims broadcasting, sizes 0..4."""
    m, k, n = draw(st.integers(0, 4)), draw(st.integers(1, 4)), draw(st.integers(0, 4))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [b if draw(st.booleans()) else 1 for b in batch]
    b_batch = [b if draw(st.booleans()) else 1 for b in batch][draw(st.integers(0, len(batch))):]
    a = (k,) if draw(st.integers(0, 4)) == 0 else tuple(a_batch) + (m, k)
    b = (k,) if draw(st.integers(0, 4)) == 0 else tuple(b_batch) + (k, n)
    return a, b


@SETTINGS
@given(shapes=matmul_shapes(), seed=seeds)
def test_matmul(device, shapes, seed):
    sa, sb = shapes
    a, b = data(sa, seed), data(sb, seed + 1)
    out = fgt(a, device) @ fgt(b, device)
    close(out, tt(a) @ tt(b), rtol=1e-5, atol=1e-5)
    close(fg.matmul(fgt(a, device), fgt(b, device)), np.matmul(a.astype(np.float64), b.astype(np.float64)),
          rtol=1e-5, atol=1e-5, check_dtype=False)


def test_mm_bmm_dot_outer(device):
    a, b = data((3, 4), 0), data((4, 5), 1)
    close(fg.mm(fgt(a, device), fgt(b, device)), torch.mm(tt(a), tt(b)), rtol=1e-5)
    ba, bb = data((2, 3, 4), 2), data((2, 4, 5), 3)
    close(fg.bmm(fgt(ba, device), fgt(bb, device)), torch.bmm(tt(ba), tt(bb)), rtol=1e-5)
    u, v = data((4,), 4), data((4,), 5)
    close(fg.dot(fgt(u, device), fgt(v, device)), torch.dot(tt(u), tt(v)), rtol=1e-5)
    close(fg.outer(fgt(u, device), fgt(v, device)), torch.outer(tt(u), tt(v)), rtol=1e-5)
    close(fgt(a, device).matmul(fgt(b, device)), tt(a).matmul(tt(b)), rtol=1e-5)
    ai, bi = int_data((2, 3), 0), int_data((3, 2), 1)
    close(fgt(ai, device) @ fgt(bi, device), tt(ai) @ tt(bi))
    if unsupported_dtype(device, "float16") is None:
        close(fgt(a, device) @ fgt(b.astype(np.float16), device), tt(a) @ tt(b.astype(np.float16)).float(),
              rtol=1e-3)


def test_matmul_errors(device):
    with pytest.raises(fg.ShapeError, match=r"\(3, 4\).*\(5, 2\)"):
        fg.zeros(3, 4, device=device) @ fg.zeros(5, 2, device=device)
    with pytest.raises(fg.ShapeError):
        fg.zeros((), device=device) @ fg.zeros(3, device=device)
    with pytest.raises(fg.ShapeError):
        fg.zeros(2, 3, 4, device=device) @ fg.zeros(3, 4, 5, device=device)
    with pytest.raises(fg.ShapeError):
        fg.bmm(fg.zeros(2, 3, 4, device=device), fg.zeros(3, 4, 5, device=device))
    with pytest.raises(fg.ShapeError):
        fg.mm(fg.zeros(3, device=device), fg.zeros(3, 4, device=device))
    with pytest.raises(fg.ShapeError):
        fg.dot(fg.zeros(3, 1, device=device), fg.zeros(3, device=device))


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("i j , j k -> i k", [(3, 4), (4, 5)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum(device, eq, shapes):
    xs = [data(s, i) for i, s in enumerate(shapes)]
    close(fg.einsum(eq, *[fgt(x, device) for x in xs]), torch.einsum(eq, *[tt(x) for x in xs]), rtol=1e-5, atol=1e-5)
    close(fg.einsum(eq, [fgt(x, device) for x in xs]), torch.einsum(eq, *[tt(x) for x in xs]), rtol=1e-5, atol=1e-5)


def test_einsum_errors(device):
    with pytest.raises(fg.FlowError):
        fg.einsum("ij,jk->ik", fg.zeros(2, 3, device=device))
    with pytest.raises(fg.ShapeError):
        fg.einsum("ijk->i", fg.zeros(2, 3, device=device))
    with pytest.raises(fg.ShapeError):
        fg.einsum("ij,jk->ik", fg.zeros(2, 3, device=device), fg.zeros(4, 5, device=device))
    with pytest.raises(fg.FlowError):
        fg.einsum("ii->i", fg.zeros(3, 3, device=device))


_LAYOUTS = {  # name: (shape of a, shape of b, the views multiplied; t transposes)
    "contiguous": ((5, 3), (3, 4), lambda a, b, t: (a, b)),
    "a_transposed": ((3, 5), (3, 4), lambda a, b, t: (t(a), b)),
    "b_transposed": ((5, 3), (4, 3), lambda a, b, t: (a, t(b))),
    "both_transposed": ((3, 5), (4, 3), lambda a, b, t: (t(a), t(b))),
    "column_slice": ((5, 7), (3, 4), lambda a, b, t: (a[:, 2:5], b)),  # leading dimension 7 for width 3
    "row_vector": ((1, 3), (3, 4), lambda a, b, t: (a, b)),
    "inner_one": ((5, 1), (1, 4), lambda a, b, t: (a, b)),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_repeated_matmul_of_one_layout_reads_each_calls_operands(device, layout):
    """A training loop multiplies arrays of the same layout every step: the second and later calls (on CUDA,
    through the layout kept from the first, ``_gemm_plan``) must read that call's operands, for transposed
    views and column slices (leading dimension above the width) as for contiguous arrays."""
    import flowgraph as fg

    rng = np.random.default_rng(7)
    sa, sb, view = _LAYOUTS[layout]
    for _ in range(3):
        an, bn = (rng.standard_normal(s).astype(np.float32) for s in (sa, sb))
        a, b = view(fg.tensor(an, device=device), fg.tensor(bn, device=device), lambda x: x.t())
        na, nb = view(an, bn, lambda x: x.T)
        np.testing.assert_allclose(a.matmul(b).cpu().numpy(), na @ nb, rtol=1e-5, atol=1e-5)
