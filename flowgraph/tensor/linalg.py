"""Matrix products: matmul (with PyTorch's 1-d and batch-broadcast rules), mm, bmm, dot, outer, einsum."""

from __future__ import annotations

import math

from ..autograd.grad_mode import STATE
from ..errors import BackendError, FlowError, ShapeError
from .amp import low_precision_inputs
from .elementwise import _promote_pair, broadcast_shapes, sum_to
from .tensor import Tensor, _record, _wrap


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product: 1-d operands are promoted and squeezed back; batch dims broadcast."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise FlowError(f"matmul: both operands must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: both arguments need at least 1 dimension; use * for scalars")
    if a.ndim == 1 or b.ndim == 1:
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        out = matmul(a2, b2)
        if a.ndim == 1:
            out = out.squeeze(-2)
        if b.ndim == 1:
            out = out.squeeze(-1)
        return out
    if STATE.autocast is not None and a.dtype is not STATE.autocast:
        a, b = low_precision_inputs(a, b)
    sa, sb = a.shape, b.shape
    if sa[-1] != sb[-2]:
        raise ShapeError(
            f"matmul: shapes {sa} and {sb} are incompatible: the last dim of the first ({sa[-1]}) "
            f"must equal the second-to-last of the second ({sb[-2]})"
        )
    broadcast_shapes(sa[:-2], sb[:-2])
    if len(sa) > 2 and len(sb) == 2 and a._backend is b._backend:
        # (..., m, k) @ (k, n): one 2-d GEMM over the folded leading dims instead of a batched one.
        lead = sa[:-1]
        return matmul(a.reshape(math.prod(lead), sa[-1]), b).reshape(lead + (sb[-1],))
    bk = a._backend
    if b._backend is not bk:
        raise BackendError(
            f"matmul: tensors on different devices ({a.device} and {b.device}); move one with .to('{a.device}')"
        )
    ad, bd = a._data, b._data
    if ad.dtype != bd.dtype:
        ad, bd = _promote_pair(a, b)
    out = _wrap(bk.matmul(ad, bd), bk)
    if STATE.enabled and (a.requires_grad or b.requires_grad):
        need_a, need_b = a.requires_grad, b.requires_grad
        # a's gradient reads b, b's reads a
        saved = ((b,) if need_a else ()) + ((a,) if need_b else ())

        def bw(g, *sv):
            ga = sum_to(matmul(g, sv[0].transpose(-1, -2)), sa) if need_a else None
            gb = sum_to(matmul(sv[-1].transpose(-1, -2), g), sb) if need_b else None
            return ga, gb

        _record(out, "Matmul", (a, b), saved, bw)
    return out


def mm(a: Tensor, b: Tensor) -> Tensor:
    """2-d matrix product."""
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"mm: expected 2-d tensors, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product of 3-d tensors with equal batch size."""
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(f"bmm: expected 3-d tensors with one batch size, got {a.shape} and {b.shape}")
    return matmul(a, b)


def dot(a: Tensor, b: Tensor) -> Tensor:
    """Inner product of two 1-d tensors."""
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"dot: expected 1-d tensors, got {a.shape} and {b.shape}")
    return matmul(a, b)


def outer(a: Tensor, b: Tensor) -> Tensor:
    """Outer product of two 1-d tensors."""
    return a.reshape(-1, 1) * b.reshape(1, -1)


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation, lowered to permute/reshape/sum and batched matmul (pairwise, left to right)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out_spec = eq.split("->")
    else:
        lhs = eq
        counts: dict[str, int] = {}
        for ch in lhs.replace(",", ""):
            counts[ch] = counts.get(ch, 0) + 1
        out_spec = "".join(sorted(c for c, n in counts.items() if n == 1))
    specs = lhs.split(",")
    if len(specs) != len(operands):
        raise FlowError(f"einsum: equation {equation!r} names {len(specs)} operands, got {len(operands)}")
    if "." in eq:
        raise FlowError("einsum: ellipsis ('...') is not supported; name every dimension")
    for spec, op in zip(specs, operands):
        if len(spec) != op.ndim:
            raise ShapeError(f"einsum: operand spec {spec!r} has {len(spec)} letters but the tensor has {op.ndim} dims")
        if len(set(spec)) != len(spec):
            raise FlowError(f"einsum: repeated index in one operand ({spec!r}, a diagonal) is not supported")
    terms = list(zip(specs, operands))
    spec, cur = terms[0]
    for pos in range(1, len(terms)):
        nspec, nxt = terms[pos]
        later = set(out_spec).union(*(set(s) for s, _ in terms[pos + 1:]))
        spec, cur = _contract(spec, cur, nspec, nxt, later)
    # reduce what is left and order as requested
    drop = [i for i, c in enumerate(spec) if c not in out_spec]
    if drop:
        cur = cur.sum(tuple(drop))
        spec = "".join(c for c in spec if c in out_spec)
    if set(spec) != set(out_spec):
        raise FlowError(f"einsum: output index in {out_spec!r} does not appear in the inputs")
    return cur.permute([spec.index(c) for c in out_spec]) if spec != out_spec else cur


def _contract(sa: str, a: Tensor, sb: str, b: Tensor, keep: set[str]):
    """Contract two operands: indices in both and kept are batch, in both and not kept are summed."""
    for c in set(sa) & set(sb):
        if a.shape[sa.index(c)] != b.shape[sb.index(c)] and 1 not in (a.shape[sa.index(c)], b.shape[sb.index(c)]):
            raise ShapeError(f"einsum: index {c!r} has size {a.shape[sa.index(c)]} and {b.shape[sb.index(c)]}")
    # sum out indices private to one operand that are not needed later
    for spec_name in ("a", "b"):
        s, t, other = (sa, a, sb) if spec_name == "a" else (sb, b, sa)
        private = [i for i, c in enumerate(s) if c not in other and c not in keep]
        if private:
            t = t.sum(tuple(private))
            s = "".join(c for i, c in enumerate(s) if i not in private)
        if spec_name == "a":
            sa, a = s, t
        else:
            sb, b = s, t
    batch = [c for c in sa if c in sb and c in keep]
    contracted = [c for c in sa if c in sb and c not in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    size = {**{c: a.shape[sa.index(c)] for c in sa}, **{c: b.shape[sb.index(c)] for c in sb}}
    for c in batch + contracted:
        size[c] = max(a.shape[sa.index(c)], b.shape[sb.index(c)])
    pa = a.permute([sa.index(c) for c in batch + left + contracted])
    pb = b.permute([sb.index(c) for c in batch + contracted + right])

    def prod(cs):
        n = 1
        for c in cs:
            n *= size[c]
        return n

    bs = tuple(size[c] for c in batch)
    pa = pa.expand(bs + tuple(size[c] for c in left + contracted)) if batch else pa
    pb = pb.expand(bs + tuple(size[c] for c in contracted + right)) if batch else pb
    ma = pa.reshape(bs + (prod(left), prod(contracted)))
    mb = pb.reshape(bs + (prod(contracted), prod(right)))
    out = matmul(ma, mb).reshape(bs + tuple(size[c] for c in left + right))
    return "".join(batch + left + right), out
