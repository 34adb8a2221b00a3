"""Reductions with ``dim`` and ``keepdim``: sum, mean, var, std, max, min, argmax, prod, logsumexp,
softmax, log_softmax, cumsum, norm, any, all."""

from __future__ import annotations

import math
from collections import namedtuple

from ..autograd.grad_mode import STATE
from ..errors import FlowError
from .amp import full_precision_input
from .dtype import as_dtype
from .elementwise import _is_float, where
from .tensor import Tensor, _norm_dim, _norm_dims, _record, _wrap

MinMax = namedtuple("MinMax", ["values", "indices"])
MinMax.__doc__ = "``(values, indices)`` returned by ``max(dim)``/``min(dim)``, like PyTorch's."


def _kept_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand_back(g: Tensor, shape, axes, keepdim: bool) -> Tensor:
    if not keepdim and axes:
        g = g.reshape(_kept_shape(shape, axes))
    return g.expand(shape)


def sum(a: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (an int, a tuple, or None for all); integer and bool inputs sum as int64."""
    if STATE.autocast is not None:
        a = full_precision_input(a)
    bk = a._backend
    d = a._data
    if dtype is not None:
        d = bk.cast(d, as_dtype(dtype).np)
    elif d.dtype.kind in "biu":
        d = bk.cast(d, as_dtype("int64").np)
    shape = d.shape
    axes = _norm_dims(dim, len(shape), "sum")
    out = _wrap(bk.sum(d, axes, keepdim), bk)
    if a.requires_grad and STATE.enabled:
        in_dtype = a.dtype

        def bw(g):
            g = _expand_back(g, shape, axes, keepdim)
            return (g if g.dtype is in_dtype else g.to(in_dtype),)

        _record(out, "Sum", (a,), (), bw)
    return out


def mean(a: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Arithmetic mean over ``dim``; NaN for an empty reduction, as in PyTorch."""
    if not _is_float(a._data) and dtype is None:
        raise FlowError(
            f"mean: input dtype {a.dtype} is not floating; pass dtype=fg.float32 or convert with .float()"
        )
    axes = _norm_dims(dim, a.ndim, "mean")
    n = 1
    for ax in axes:
        n *= a.shape[ax]
    s = sum(a, axes, keepdim, dtype)
    return s / n if n else s * float("nan")


def var(a: Tensor, dim=None, keepdim: bool = False, unbiased: bool | None = None, correction=None) -> Tensor:
    """Variance over ``dim`` with Bessel's ``correction`` (default 1; ``unbiased=False`` means 0)."""
    if correction is None:
        correction = 0 if unbiased is False else 1
    axes = _norm_dims(dim, a.ndim, "var")
    n = 1
    for ax in axes:
        n *= a.shape[ax]
    centered = a - mean(a, axes, keepdim=True)
    s = sum(centered * centered, axes, keepdim)
    return s / (n - correction) if n - correction > 0 else s * float("nan")


def var_mean(input: Tensor, dim=None, *, correction=1, keepdim: bool = False):  # noqa: A002 - PyTorch's name
    """``(var, mean)`` over ``dim`` (all dims when None) from one centring pass; ``var`` divides by
    ``N - correction``. Both are differentiable."""
    axes = _norm_dims(dim, input.ndim, "var_mean")
    n = 1
    for ax in axes:
        n *= input.shape[ax]
    m = mean(input, axes, keepdim=True)
    centered = input - m
    s = sum(centered * centered, axes, keepdim)
    v = s / (n - correction) if n - correction > 0 else s * float("nan")
    if not keepdim:
        m = m.reshape(v.shape)
    return v, m


def std(a: Tensor, dim=None, keepdim: bool = False, unbiased: bool | None = None, correction=None) -> Tensor:
    """Standard deviation (``sqrt(var)``)."""
    return var(a, dim, keepdim, unbiased, correction).sqrt()


def _extreme_all_backward(g, x, y):
    mask = (x == y.detach()).to(g.dtype)
    return (mask * (g / mask.sum()),)


def _extreme(prim: str, argprim: str, name: str):
    def op(a: Tensor, dim=None, keepdim: bool = False):
        bk = a._backend
        shape = a.shape
        if dim is None:
            if a.numel() == 0:
                raise FlowError(f"{name}() of an empty tensor has no identity; pass dim= or check the input")
            axes = tuple(range(len(shape)))
            out = _wrap(bk.__getattribute__(prim)(a._data, axes, False), bk)
            if a.requires_grad and STATE.enabled:
                _record(out, name.capitalize(), (a,), (a, out), _extreme_all_backward)
            return out
        if isinstance(dim, Tensor):  # max(a, b) spelled as a.max(b)
            from .elementwise import maximum, minimum

            return maximum(a, dim) if prim == "max" else minimum(a, dim)
        ax = _norm_dim(dim, len(shape), name)
        if shape and shape[ax] == 0:
            raise FlowError(f"{name}(dim={dim}) over an empty dimension of shape {shape}")
        idx = _wrap(bk.__getattribute__(argprim)(a._data, ax, True), bk) if shape else _wrap(
            bk.full((), 0, as_dtype("int64").np), bk)
        values = a.gather(ax, idx) if shape else a * 1
        if not keepdim and shape:
            values = values.squeeze(ax)
            idx = idx.squeeze(ax)
        return MinMax(values, idx)

    op.__name__ = name
    op.__doc__ = (f"``{name}()`` over all elements, or ``{name}(dim)`` -> (values, indices); "
                  f"``{name}(other)`` is the elementwise {name}imum.")
    return op


max = _extreme("max", "argmax", "max")  # noqa: A001
min = _extreme("min", "argmin", "min")  # noqa: A001


def amax(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Maximum over ``dim`` (ties share the gradient evenly)."""
    return _amaxmin(a, dim, keepdim, "max")


def amin(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Minimum over ``dim`` (ties share the gradient evenly)."""
    return _amaxmin(a, dim, keepdim, "min")


def _amaxmin(a: Tensor, dim, keepdim: bool, prim: str) -> Tensor:
    bk = a._backend
    shape = a.shape
    axes = _norm_dims(dim, len(shape), "a" + prim)
    out = _wrap(getattr(bk, prim)(a._data, axes, keepdim), bk)
    if a.requires_grad and STATE.enabled:

        def bw(g, x, y):
            yk = _expand_back(y.detach(), shape, axes, keepdim)
            mask = (x == yk).to(g.dtype)
            count = mask.sum(axes, keepdim=True)
            return (mask * _expand_back(g, shape, axes, keepdim) / count,)

        _record(out, "A" + prim, (a,), (a, out), bw)
    return out


def argmax(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the first maximum (over the flattened tensor when ``dim`` is None)."""
    return _arg_extreme(a, dim, keepdim, "argmax")


def _arg_extreme(a: Tensor, dim, keepdim: bool, prim: str) -> Tensor:
    bk = a._backend
    if dim is not None:
        ax = _norm_dim(dim, a.ndim, prim)
    if a.ndim == 0:  # a 0-d tensor has no axis to search: its only element is at index 0
        return _wrap(bk.full((), 0, as_dtype("int64").np), bk)
    if dim is None:
        if a.numel() == 0:
            raise FlowError(f"{prim}() of an empty tensor has no result; check the input")
        return _wrap(getattr(bk, prim)(bk.reshape(bk.contiguous(a._data), (a.numel(),)), 0, False), bk)
    if a.shape[ax] == 0:
        raise FlowError(f"{prim}(dim={dim}) over an empty dimension of shape {a.shape}")
    return _wrap(getattr(bk, prim)(a._data, ax, keepdim), bk)


def argmin(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the first minimum (over the flattened tensor when ``dim`` is None)."""
    return _arg_extreme(a, dim, keepdim, "argmin")


def prod(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Product over ``dim`` (one dim or all); gradient exact also where inputs are zero."""
    bk = a._backend
    shape = a.shape
    axes = _norm_dims(dim, len(shape), "prod")
    out = _wrap(bk.prod(a._data, axes, keepdim), bk)
    if a.requires_grad and STATE.enabled:

        def bw(g, x):
            # product of all the other elements: exclusive cumulative products from both sides.
            flat_axes = axes
            moved = x.permute([i for i in range(len(shape)) if i not in flat_axes] + list(flat_axes))
            keep = moved.shape[: len(shape) - len(flat_axes)]
            m = moved.reshape(keep + (math.prod(moved.shape[len(keep):]),))
            ones = m[..., :1] * 0 + 1
            left = cumprod(m[..., :-1], -1) if m.shape[-1] > 1 else ones[..., :0]
            left = _cat_front(ones, left)
            right = cumprod(m.flip(-1)[..., :-1], -1).flip(-1) if m.shape[-1] > 1 else ones[..., :0]
            right = _cat_back(right, ones)
            others = (left * right).reshape(moved.shape)
            inv = [0] * len(shape)
            for pos, src in enumerate([i for i in range(len(shape)) if i not in flat_axes] + list(flat_axes)):
                inv[src] = pos
            others = others.permute(inv)
            return (_expand_back(g, shape, axes, keepdim) * others,)

        _record(out, "Prod", (a,), (a,), bw)
    return out


def _cat_front(first: Tensor, rest: Tensor) -> Tensor:
    from .shape import cat

    return cat([first, rest], -1)


def _cat_back(rest: Tensor, last: Tensor) -> Tensor:
    from .shape import cat

    return cat([rest, last], -1)


def cumsum(a: Tensor, dim: int) -> Tensor:
    """Inclusive prefix sum along ``dim``."""
    bk = a._backend
    ax = _norm_dim(dim, a.ndim, "cumsum")
    d = a._data if a._data.dtype.kind not in "biu" else bk.cast(a._data, as_dtype("int64").np)
    out = _wrap(bk.cumsum(d, ax) if a.ndim else d, bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Cumsum", (a,), (), lambda g: (cumsum(g.flip(ax), ax).flip(ax) if g.ndim else g,))
    return out


def cumprod(a: Tensor, dim: int) -> Tensor:
    """Inclusive prefix product along ``dim`` (composed from exp/log-free tensor ops)."""
    ax = _norm_dim(dim, a.ndim, "cumprod")
    n = a.shape[ax] if a.ndim else 1
    if n == 0 or a.ndim == 0:
        return a * 1
    parts = [a.narrow(ax, 0, 1)]
    for i in range(1, n):
        parts.append(parts[-1] * a.narrow(ax, i, 1))
    from .shape import cat

    return cat(parts, ax)


def logsumexp(a: Tensor, dim, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(a)))`` over ``dim``, computed stably."""
    if a.numel() == 0:  # no maximum to shift by; the sum over nothing gives log(0) = -inf
        out = a.exp().sum(dim, keepdim=True).log()
        return out if keepdim else out.squeeze(dim if isinstance(dim, int) else tuple(dim))
    m = amax(a, dim, keepdim=True).detach()
    m = where(m.isfinite(), m, 0.0)
    out = (a - m).exp().sum(dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(dim if isinstance(dim, int) else tuple(dim))


def softmax(a: Tensor, dim: int, dtype=None) -> Tensor:
    """``exp(a) / sum(exp(a))`` along ``dim`` (one fused node: backward ``y * (g - sum(g*y))``)."""
    if STATE.autocast is not None:
        a = full_precision_input(a)
    if dtype is not None:
        a = a.to(dtype)
    bk = a._backend
    ax = _norm_dim(dim, a.ndim, "softmax")
    d = a._data
    if a.ndim and a.numel():
        e = bk.exp(bk.sub(d, bk.max(d, (ax,), True)))
    else:  # 0-d: exp(0); empty: nothing to shift
        e = bk.exp(bk.sub(d, d))
    out = _wrap(bk.div(e, bk.sum(e, (ax,) if a.ndim else (), True)), bk)
    if a.requires_grad and STATE.enabled:

        def bw(g, y):  # under create_graph y carries this node: the gradient stays differentiable
            return (y * (g - (g * y).sum(ax, keepdim=True)),)

        _record(out, "Softmax", (a,), (out,), bw)
    return out


def log_softmax(a: Tensor, dim: int, dtype=None) -> Tensor:
    """``a - logsumexp(a)`` along ``dim`` (one node: backward ``g - exp(y) * sum(g)``)."""
    if STATE.autocast is not None:
        a = full_precision_input(a)
    if dtype is not None:
        a = a.to(dtype)
    bk = a._backend
    ax = _norm_dim(dim, a.ndim, "log_softmax")
    d = a._data
    axes = (ax,) if a.ndim else ()
    shifted = bk.sub(d, bk.max(d, axes, True)) if a.numel() else d
    out = _wrap(bk.sub(shifted, bk.log(bk.sum(bk.exp(shifted), axes, True))), bk)
    if a.requires_grad and STATE.enabled:

        def bw(g, y):
            return (g - y.exp() * g.sum(ax, keepdim=True),)

        _record(out, "LogSoftmax", (a,), (out,), bw)
    return out


def norm(a: Tensor, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """Vector p-norm over ``dim`` (``p`` a number, ``inf``, or ``"fro"``)."""
    if p == "fro":
        p = 2
    if p == math.inf:
        return amax(a.abs(), dim, keepdim)
    if p == -math.inf:
        return amin(a.abs(), dim, keepdim)
    if p == 1:
        return a.abs().sum(dim, keepdim)
    if p == 2:
        sq = (a * a).sum(dim, keepdim)
        return _safe_sqrt(sq)
    if p == 0:
        return (a != 0).to(a.dtype).sum(dim, keepdim)
    return (a.abs() ** p).sum(dim, keepdim) ** (1.0 / p)


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt whose gradient at 0 is 0 (the subgradient PyTorch's norm uses) instead of inf."""
    bk = x._backend
    out = _wrap(bk.sqrt(x._data), bk)
    if x.requires_grad and STATE.enabled:
        _record(out, "Norm", (x,), (out,), _safe_sqrt_backward)
    return out


def _safe_sqrt_backward(g, y):
    return (where(y > 0, g / (y * 2.0), 0.0),)


def any(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where any element over ``dim`` is nonzero."""
    bk = a._backend
    d = a._data if a._data.dtype.kind == "b" else bk.ne(a._data, 0)
    return _wrap(bk.any(d, _norm_dims(dim, a.ndim, "any"), keepdim), bk)


def all(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where every element over ``dim`` is nonzero."""
    bk = a._backend
    d = a._data if a._data.dtype.kind == "b" else bk.ne(a._data, 0)
    return _wrap(bk.all(d, _norm_dims(dim, a.ndim, "all"), keepdim), bk)


def count_nonzero(a: Tensor, dim=None) -> Tensor:
    """Number of nonzero elements over ``dim``."""
    return (a != 0).sum(dim)

