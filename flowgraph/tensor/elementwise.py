"""Elementwise ops: arithmetic with broadcasting and PyTorch promotion, comparisons, math, activations.

Forward work happens on native arrays through the backend; each backward is written with tensor ops so
every backend differentiates everything (and ``create_graph=True`` gives higher-order gradients).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd.grad_mode import STATE
from ..errors import BackendError, FlowError, ShapeError
from .dtype import from_numpy_dtype, get_default_dtype, promote_types
from .tensor import Tensor, _alias, _attach, _wrap

_SCALAR_TYPES = (int, float, bool)
_FLOAT_KINDS = "fV"  # "V": ml_dtypes' bfloat16 reports kind 'V'


def _is_float(arr) -> bool:
    return arr.dtype.kind == "f" or arr.dtype.name == "bfloat16"


def _float_data(a: Tensor):
    """``a``'s array, cast to the default float dtype when it is an integer or bool array (as torch does)."""
    d = a._data
    return d if _is_float(d) else a._backend.cast(d, get_default_dtype().np)


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    """The NumPy/PyTorch broadcast of several shapes; ShapeError naming both when they do not fit."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, ndim - len(s)):
            o = out[i]
            if d != o:
                if o == 1:
                    out[i] = d
                elif d != 1:
                    raise ShapeError(
                        f"shapes {' and '.join(str(tuple(x)) for x in shapes)} cannot be broadcast together: "
                        f"dimension {i - ndim} is {o} in one and {d} in the other (sizes must match or be 1)"
                    )
    return tuple(out)


def _shape_error(name: str, a, b, exc: ValueError | None = None) -> FlowError:
    """The error for a ValueError the backend raised: ShapeError when the shapes do not broadcast,
    otherwise a FlowError carrying the backend's message (e.g. integers to negative integer powers)."""
    sa = a.shape if isinstance(a, Tensor) else ()
    sb = b.shape if isinstance(b, Tensor) else ()
    try:
        broadcast_shapes(sa, sb)
    except ShapeError as shape_exc:
        return ShapeError(f"{name}: {shape_exc}")
    return FlowError(f"{name}: {exc}" if exc is not None else f"{name}: invalid operands of shapes {sa} and {sb}")


def sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Reduce a broadcast gradient back to ``shape`` (the adjoint of broadcasting)."""
    gshape = g._data.shape
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(shape) if s == 1 and gshape[i + lead] != 1
    )
    if axes:
        g = g.sum(axes, keepdim=True)
    if lead:
        g = g.reshape(shape)
    return g


def _sum_to_array(bk, g, shape: tuple[int, ...]) -> Tensor:
    """``sum_to`` on a native gradient array, wrapped as a tensor (backward without create_graph)."""
    gshape = g.shape
    if gshape == shape:
        return _wrap(g, bk)
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and gshape[i + lead] != 1)
    if axes:
        g = bk.sum(g, axes, True)
    if lead:
        g = bk.reshape(g, shape)
    return _wrap(g, bk)


def _to_tensor_like(value, like: Tensor) -> Tensor:
    from .creation import tensor

    return tensor(value, device=like._backend)


def _promote_pair(a: Tensor, b: Tensor):
    """Cast two tensors' arrays to their PyTorch result dtype."""
    da, db = from_numpy_dtype(a._data.dtype), from_numpy_dtype(b._data.dtype)
    a0, b0 = a._data.ndim == 0, b._data.ndim == 0
    if a0 != b0:
        zero, dim = (da, db) if a0 else (db, da)
        target = zero if zero.category > dim.category else dim
    else:
        target = promote_types(da, db)
    bk = a._backend
    ad = a._data if da is target else bk.cast(a._data, target.np)
    bd = b._data if db is target else bk.cast(b._data, target.np)
    return ad, bd


def _scalar_promote(arr, scalar, bk):
    """(array, scalar) for a tensor-scalar op with PyTorch's result dtype.

    A scalar only changes the dtype when its category is higher (bool < int < float). A float scalar with
    a bfloat16 array becomes a 0-d bfloat16 array: NumPy (ml_dtypes) would otherwise compute in float32.
    """
    kind = arr.dtype.kind
    if kind == "b":
        if isinstance(scalar, bool):
            return arr, scalar
        return bk.cast(arr, (get_default_dtype() if isinstance(scalar, float) else from_numpy_dtype(np.int64)).np), \
            scalar
    if kind in "iu":
        if isinstance(scalar, float):
            return bk.cast(arr, get_default_dtype().np), scalar
        return arr, scalar
    if kind == "V" and not isinstance(scalar, bool):
        return arr, bk.full((), scalar, arr.dtype)
    return arr, scalar


def _operands(a, b, name: str):
    """Normalise (a, b) to (backend, a_array_or_scalar, b_array_or_scalar, a_tensor_or_None, b_tensor_or_None)."""
    if isinstance(a, Tensor):
        bk = a._backend
        if isinstance(b, Tensor):
            if b._backend is not bk:
                raise BackendError(
                    f"{name}: tensors on different devices ({a.device} and {b.device}); "
                    f"move one with .to('{a.device}')"
                )
            ad, bd = a._data, b._data
            if ad.dtype != bd.dtype:
                ad, bd = _promote_pair(a, b)
            return bk, ad, bd, a, b
        if isinstance(b, _SCALAR_TYPES):
            ad = a._data
            if ad.dtype.kind == "f":  # the common case: float tensor, any scalar
                return bk, ad, b, a, None
            ad, b = _scalar_promote(ad, b, bk)
            return bk, ad, b, a, None
        return _operands(a, _to_tensor_like(b, a), name)
    if isinstance(b, Tensor):
        if isinstance(a, _SCALAR_TYPES):
            bk = b._backend
            bd, a = _scalar_promote(b._data, a, bk)
            return bk, a, bd, None, b
        return _operands(_to_tensor_like(a, b), b, name)
    raise FlowError(f"{name}: expected at least one Tensor operand, got {type(a).__name__} and {type(b).__name__}")


def _saved_pair(at, bt) -> tuple:
    """The tensors among an op's two operands (either may be None for a scalar), for version checks."""
    if at is None:
        return (bt,)
    if bt is None:
        return (at,)
    return (at, bt)


def _grads(ga, gb, at, bt):
    return (None if at is None or ga is None else sum_to(ga, at._data.shape),
            None if bt is None or gb is None else sum_to(gb, bt._data.shape))


def _record(out, bw, at, bt, name, saved=()):
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        _attach(out, bw, (at, bt), name, saved)
    return out


# ---------------------------------------------------------------------- arithmetic
def add(a, b, alpha: float = 1) -> Tensor:
    """``a + alpha * b`` with broadcasting."""
    if alpha != 1:
        b = mul(b, alpha)
    bk, ad, bd, at, bt = _operands(a, b, "add")
    try:
        out = _wrap(bk.add(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("add", a, b, exc) from None
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        sa = None if at is None else at._data.shape
        sb = None if bt is None else bt._data.shape

        def bw(g):
            gs = g._data.shape
            return (None if sa is None else (g if gs == sa else sum_to(g, sa)),
                    None if sb is None else (g if gs == sb else sum_to(g, sb)))

        _attach(out, bw, (at, bt), "Add")
    return out


def sub(a, b, alpha: float = 1) -> Tensor:
    """``a - alpha * b`` with broadcasting."""
    if alpha != 1:
        b = mul(b, alpha)
    if _is_bool_operand(a) or _is_bool_operand(b):
        raise FlowError(
            "sub: subtraction with a bool tensor or a bool scalar is not supported (as in PyTorch); "
            "use ~mask or logical_not() to invert a mask, or convert with .int()/.float() first"
        )
    bk, ad, bd, at, bt = _operands(a, b, "sub")
    try:
        out = _wrap(bk.sub(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("sub", a, b, exc) from None
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        sa = None if at is None else at._data.shape
        sb = None if bt is None else bt._data.shape

        def bw(g):
            gs = g._data.shape
            return (None if sa is None else (g if gs == sa else sum_to(g, sa)),
                    None if sb is None else (-g if gs == sb else sum_to(-g, sb)))

        _attach(out, bw, (at, bt), "Sub")
    return out


def mul(a, b) -> Tensor:
    """Elementwise product with broadcasting."""
    bk, ad, bd, at, bt = _operands(a, b, "mul")
    try:
        out = _wrap(bk.mul(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("mul", a, b, exc) from None
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        need_a = at is not None and at.requires_grad
        need_b = bt is not None and bt.requires_grad
        out_dtype = out._data.dtype

        def bw(g):
            gd = g._data
            if STATE.enabled or gd.dtype != out_dtype:  # create_graph (or an odd dtype): differentiable tensor ops
                return (sum_to(g * b, at._data.shape) if need_a else None,
                        sum_to(g * a, bt._data.shape) if need_b else None)
            # the common case on the arrays directly: the forward's (promoted) operands times g
            ga = gb = None
            if need_a:
                ga = bk.mul(gd, bd)
                ga = _wrap(ga, bk) if ga.shape == at._data.shape else _sum_to_array(bk, ga, at._data.shape)
            if need_b:
                gb = bk.mul(gd, ad)
                gb = _wrap(gb, bk) if gb.shape == bt._data.shape else _sum_to_array(bk, gb, bt._data.shape)
            return ga, gb

        # Each operand is needed only for the other's gradient (so x.mul_(2) on a graph tensor stays valid).
        keep_a = need_b and at is not None
        if bt is not None and need_a:
            saved = (bt, at) if keep_a else (bt,)
        else:
            saved = (at,) if keep_a else ()
        _attach(out, bw, (at, bt), "Mul", saved)
    return out


def div(a, b, rounding_mode: str | None = None) -> Tensor:
    """True division (``rounding_mode=None``), or ``"floor"``/``"trunc"`` rounded division (no gradient)."""
    if rounding_mode is not None:
        q = _binary_nograd("div", a, b, "div")
        if not _is_float(q._data):
            q = q.to(get_default_dtype())
        q = q.floor() if rounding_mode == "floor" else q.trunc()
        ref = a if isinstance(a, Tensor) else b
        return q.to(ref.dtype) if not ref.dtype.is_floating_point and not isinstance(b, float) else q
    bk, ad, bd, at, bt = _operands(a, b, "div")
    if not _is_float_operand(ad) and not _is_float_operand(bd):
        dt = get_default_dtype().np
        ad = bk.cast(ad, dt) if not isinstance(ad, _SCALAR_TYPES) else ad
        bd = bk.cast(bd, dt) if not isinstance(bd, _SCALAR_TYPES) else bd
    try:
        out = _wrap(bk.div(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("div", a, b, exc) from None
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        ca, cb = a, b

        def bw(g):
            ga = g / cb if at is not None and at.requires_grad else None
            gb = -g * ca / (cb * cb) if bt is not None and bt.requires_grad else None
            return _grads(ga, gb, at, bt)

        _attach(out, bw, (at, bt), "Div", _saved_pair(at, bt))
    return out


def _is_bool_operand(x) -> bool:
    return isinstance(x, bool) or (isinstance(x, Tensor) and x._data.dtype.kind == "b")


def _is_float_operand(x) -> bool:
    return isinstance(x, float) or (not isinstance(x, _SCALAR_TYPES) and _is_float(x))


def pow(a, b) -> Tensor:  # noqa: A001 - PyTorch's name
    """``a ** b`` elementwise."""
    if type(b) is int and b < 0 and isinstance(a, Tensor) and a._data.dtype.kind in "iu":
        raise FlowError(f"pow: integers to negative integer powers are not allowed ({a.dtype} ** {b}); "
                        "convert the base with .float() first")
    if _is_bool_operand(a) and _is_bool_operand(b):  # bool ** bool stays bool, as in torch: a or not b
        return logical_or(a, logical_not(b) if isinstance(b, Tensor) else not b)
    bk, ad, bd, at, bt = _operands(a, b, "pow")
    try:
        out = _wrap(bk.pow(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("pow", a, b, exc) from None
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        ca, cb = a, b
        y = _alias(out)

        def bw(g):
            ga = gb = None
            if at is not None and at.requires_grad:
                if isinstance(cb, _SCALAR_TYPES):
                    ga = g * cb * ca ** (cb - 1) if cb != 0 else g * 0.0
                else:
                    ga = g * cb * ca ** (cb - 1)
                    ga = where(cb == 0, 0.0, ga)
            if bt is not None and bt.requires_grad:
                base = ca if isinstance(ca, Tensor) else _wrap(bk.full((), ca, y._data.dtype), bk)
                yy = y if not STATE.enabled else ca**cb  # create_graph: the output with its graph
                gb = g * yy * where(base > 0, base, 1.0).log()
                # base < 0: NaN (as torch); a NaN constant, not gb * nan, keeps double backward NaN-free
                gb = where(base > 0, gb, where(base == 0, 0.0, float("nan")).to(gb.dtype))
            return _grads(ga, gb, at, bt)

        _attach(out, bw, (at, bt), "Pow", _saved_pair(at, bt) + (out,))
    return out


def neg(a: Tensor) -> Tensor:
    """``-a``."""
    bk = a._backend
    if a._data.dtype.kind == "b":
        raise FlowError("neg: negation of a bool tensor is not supported (as in PyTorch); use ~mask or logical_not()")
    out = _wrap(bk.neg(a._data), bk)
    if a.requires_grad and STATE.enabled:
        _attach(out, lambda g: (-g,), (a,), "Neg")
    return out


def _binary_nograd(prim: str, a, b, name: str) -> Tensor:
    bk, ad, bd, _, _ = _operands(a, b, name)
    try:
        return _wrap(getattr(bk, prim)(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error(name, a, b, exc) from None


def _minmax(prim: str, name: str):
    def op(a, b) -> Tensor:
        bk, ad, bd, at, bt = _operands(a, b, name)
        try:
            out = _wrap(getattr(bk, prim)(ad, bd), bk)
        except ValueError as exc:
            raise _shape_error(name, a, b, exc) from None
        if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
            ca, cb = a, b

            def bw(g):
                pick_a = (ca > cb) if prim == "maximum" else (ca < cb)
                tie = ca == cb
                wa = where(pick_a, 1.0, where(tie, 0.5, 0.0)).to(g.dtype)
                return _grads(g * wa, g * (1.0 - wa), at, bt)

            _attach(out, bw, (at, bt), name.capitalize(), _saved_pair(at, bt))
        return out

    op.__name__ = name
    op.__doc__ = f"Elementwise {name} with broadcasting (ties split the gradient evenly, as PyTorch does)."
    return op


maximum = _minmax("maximum", "maximum")
minimum = _minmax("minimum", "minimum")


def atan2(a, b) -> Tensor:
    """Elementwise ``atan2(a, b)``."""
    bk, ad, bd, at, bt = _operands(a, b, "atan2")
    out = _wrap(bk.atan2(ad, bd), bk)
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        ca, cb = a, b

        def bw(g):
            den = ca * ca + cb * cb
            return _grads(g * cb / den, -g * ca / den, at, bt)

        _attach(out, bw, (at, bt), "Atan2", _saved_pair(at, bt))
    return out


def _nograd_binary(prim: str, name: str, doc: str):
    def op(a, b) -> Tensor:
        return _binary_nograd(prim, a, b, name)

    op.__name__ = name
    op.__doc__ = doc
    return op


eq = _nograd_binary("eq", "eq", "Elementwise ``a == b`` (bool).")
ne = _nograd_binary("ne", "ne", "Elementwise ``a != b`` (bool).")
lt = _nograd_binary("lt", "lt", "Elementwise ``a < b`` (bool).")
le = _nograd_binary("le", "le", "Elementwise ``a <= b`` (bool).")
gt = _nograd_binary("gt", "gt", "Elementwise ``a > b`` (bool).")
ge = _nograd_binary("ge", "ge", "Elementwise ``a >= b`` (bool).")
floor_divide = _nograd_binary("floor_divide", "floor_divide", "Elementwise floor division (no gradient).")


def _logical(prim: str, name: str):
    def op(a, b) -> Tensor:
        bk, ad, bd, _, _ = _operands(a, b, name)
        ad = ad if isinstance(ad, _SCALAR_TYPES) or ad.dtype.kind == "b" else bk.ne(ad, 0)
        bd = bd if isinstance(bd, _SCALAR_TYPES) or bd.dtype.kind == "b" else bk.ne(bd, 0)
        ad = bool(ad) if isinstance(ad, _SCALAR_TYPES) else ad
        bd = bool(bd) if isinstance(bd, _SCALAR_TYPES) else bd
        return _wrap(getattr(bk, prim)(ad, bd), bk)

    op.__name__ = name
    op.__doc__ = f"Elementwise ``{name}`` (bool); nonzero counts as true."
    return op


logical_and = _logical("logical_and", "logical_and")
logical_or = _logical("logical_or", "logical_or")
logical_xor = _logical("logical_xor", "logical_xor")


def logical_not(a: Tensor) -> Tensor:
    """Elementwise logical not (bool)."""
    bk = a._backend
    d = a._data if a._data.dtype.kind == "b" else bk.ne(a._data, 0)
    return _wrap(bk.logical_not(d), bk)


def remainder(a, b) -> Tensor:
    """Python-style modulus (sign of the divisor); gradient 1 for ``a``, ``-floor(a/b)`` for ``b``."""
    bk, ad, bd, at, bt = _operands(a, b, "remainder")
    out = _wrap(bk.remainder(ad, bd), bk)
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        ca, cb = a, b

        def bw(g):
            return _grads(g, -g * (ca / cb).floor() if bt is not None else None, at, bt)

        _attach(out, bw, (at, bt), "Remainder")
    return out


def fmod(a, b) -> Tensor:
    """C-style remainder (sign of the dividend)."""
    return a - (a / b).trunc() * b


# ---------------------------------------------------------------------- unary math
def _unary(prim: str, name: str, grad, save_out: bool = False, float_only: bool = True, doc: str = ""):
    """Build a unary op. ``grad(g, x, y)`` returns the input gradient from tensors (x input, y output)."""

    def op(a: Tensor) -> Tensor:
        bk = a._backend
        d = a._data
        if float_only and not _is_float(d):
            d = bk.cast(d, get_default_dtype().np)
        out = _wrap(getattr(bk, prim)(d), bk)
        if a.requires_grad and STATE.enabled:
            y = _alias(out) if save_out else None

            def bw(g):
                if STATE.enabled:  # create_graph: use values that carry their graph (recompute the output)
                    return (grad(g, a, op(a) if save_out else None),)
                return (grad(g, a, y),)

            _attach(out, bw, (a,), name, (out,) if save_out else (a,))
        return out

    op.__name__ = prim
    op.__doc__ = doc or f"Elementwise ``{prim}``."
    return op


exp = _unary("exp", "Exp", lambda g, x, y: g * y, save_out=True)
log = _unary("log", "Log", lambda g, x, y: g / x)
log1p = _unary("log1p", "Log1p", lambda g, x, y: g / (x + 1.0))
expm1 = _unary("expm1", "Expm1", lambda g, x, y: g * (y + 1.0), save_out=True)
sqrt = _unary("sqrt", "Sqrt", lambda g, x, y: g / (y * 2.0), save_out=True)
sin = _unary("sin", "Sin", lambda g, x, y: g * x.cos())
cos = _unary("cos", "Cos", lambda g, x, y: -g * x.sin())
tanh = _unary("tanh", "Tanh", lambda g, x, y: g * (1.0 - y * y), save_out=True)
erf = _unary("erf", "Erf", lambda g, x, y: g * (2.0 / math.sqrt(math.pi)) * (-(x * x)).exp())
reciprocal = _unary("reciprocal", "Reciprocal", lambda g, x, y: -g * y * y, save_out=True)
abs = _unary("abs", "Abs", lambda g, x, y: g * x.sign(), float_only=False)  # noqa: A001
sign = _unary("sign", "Sign", lambda g, x, y: g * 0.0, float_only=False)
floor = _unary("floor", "Floor", lambda g, x, y: g * 0.0, float_only=False)
ceil = _unary("ceil", "Ceil", lambda g, x, y: g * 0.0, float_only=False)
round = _unary("round", "Round", lambda g, x, y: g * 0.0, float_only=False)  # noqa: A001


def trunc(a: Tensor) -> Tensor:
    """Round toward zero."""
    return where(a >= 0, a.floor(), a.ceil())


def isnan(a: Tensor) -> Tensor:
    """Elementwise NaN test (bool)."""
    return _wrap(a._backend.isnan(a._data), a._backend)


def isinf(a: Tensor) -> Tensor:
    """Elementwise infinity test (bool)."""
    return _wrap(a._backend.isinf(a._data), a._backend)


def isfinite(a: Tensor) -> Tensor:
    """Elementwise finiteness test (bool)."""
    bk = a._backend
    if not _is_float(a._data):
        return _wrap(bk.full(a.shape, True, np.bool_), bk)
    return _wrap(bk.logical_not(bk.logical_or(bk.isnan(a._data), bk.isinf(a._data))), bk)


def rsqrt(a: Tensor) -> Tensor:
    """``1 / sqrt(a)``."""
    return sqrt(a).reciprocal()


def square(a: Tensor) -> Tensor:
    """``a * a``."""
    return mul(a, a)


def tan(a: Tensor) -> Tensor:
    """Elementwise tangent."""
    return sin(a) / cos(a)


def sigmoid(a: Tensor) -> Tensor:
    """Logistic function ``1 / (1 + exp(-a))``."""
    bk = a._backend
    d = _float_data(a)
    out = _wrap(bk.reciprocal(bk.add(bk.exp(bk.neg(d)), 1.0)), bk)
    if a.requires_grad and STATE.enabled:
        y = _alias(out)

        def bw(g):
            yy = y if not STATE.enabled else sigmoid(a)
            return (g * yy * (1.0 - yy),)

        _attach(out, bw, (a,), "Sigmoid", (out,))
    return out


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)``; gradient 0 at 0 as in PyTorch."""
    bk = a._backend
    out = _wrap(bk.maximum(a._data, 0), bk)
    if a.requires_grad and STATE.enabled:
        y = _alias(out)
        _attach(out, lambda g: (g * (y > 0),), (a,), "Relu", (out,))
    return out


_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit: exact (``"none"``, erf-based) or the ``"tanh"`` approximation."""
    bk = a._backend
    x = _float_data(a)
    if approximate == "none":
        fused = getattr(bk, "gelu_exact", None)
        parts = None if fused is None else fused(x)
        if parts is not None:
            y, cdf = parts
        else:
            cdf = bk.mul(bk.add(bk.erf(bk.mul(x, 1.0 / _SQRT_2)), 1.0), 0.5)
            y = bk.mul(x, cdf)
        out = _wrap(y, bk)
        if a.requires_grad and STATE.enabled:
            xc = a
            cdf_saved = _wrap(cdf, bk)
            fused_bw = getattr(bk, "gelu_exact_backward", None) if parts is not None else None

            def bw(g):
                if fused_bw is not None and not STATE.enabled:
                    gx = fused_bw(g._data, x, cdf)
                    if gx is not None:
                        return (_wrap(gx, bk),)
                cdf_t = cdf_saved if not STATE.enabled else ((xc * (1.0 / _SQRT_2)).erf() + 1.0) * 0.5
                pdf = (xc * xc * -0.5).exp() * _INV_SQRT_2PI
                return (g * (cdf_t + xc * pdf),)

            _attach(out, bw, (a,), "Gelu", (a,))
        return out
    if approximate != "tanh":
        raise FlowError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    inner = bk.mul(bk.add(x, bk.mul(bk.mul(bk.mul(x, x), x), 0.044715)), _SQRT_2_OVER_PI)
    th = bk.tanh(inner)
    out = _wrap(bk.mul(bk.mul(x, bk.add(th, 1.0)), 0.5), bk)
    if a.requires_grad and STATE.enabled:
        xc = a
        th_saved = _wrap(th, bk)

        def bw_tanh(g):
            th_t = th_saved if not STATE.enabled else ((xc + xc * xc * xc * 0.044715) * _SQRT_2_OVER_PI).tanh()
            dinner = (xc * xc * (3 * 0.044715) + 1.0) * _SQRT_2_OVER_PI
            return (g * (0.5 * (th_t + 1.0) + 0.5 * xc * (1.0 - th_t * th_t) * dinner),)

        _attach(out, bw_tanh, (a,), "Gelu", (a,))
    return out


def silu(a: Tensor) -> Tensor:
    """``a * sigmoid(a)``."""
    bk = a._backend
    d = _float_data(a)
    s = bk.reciprocal(bk.add(bk.exp(bk.neg(d)), 1.0))
    out = _wrap(bk.mul(d, s), bk)
    if a.requires_grad and STATE.enabled:
        s_saved = _wrap(s, bk)

        def bw(g):
            st = s_saved if not STATE.enabled else sigmoid(a)
            return (g * st * (1.0 + a * (1.0 - st)),)

        _attach(out, bw, (a,), "Silu", (a,))
    return out


def softplus(a: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * a)) / beta``, linear above ``threshold`` (PyTorch's definition)."""
    z = a * beta
    soft = (z.clamp(max=threshold).exp()).log1p() / beta
    return where(z > threshold, a, soft)


def clamp(a: Tensor, min=None, max=None) -> Tensor:  # noqa: A002 - PyTorch's names
    """Limit values to ``[min, max]`` (either may be None or a tensor); gradient 1 inside the range."""
    if min is None and max is None:
        raise FlowError("clamp: at least one of min and max must be given")
    out = a
    if min is not None:
        out = where(out < min, min, out) if not isinstance(min, Tensor) else maximum(out, min)
    if max is not None:
        out = where(out > max, max, out) if not isinstance(max, Tensor) else minimum(out, max)
    return out


def where(cond, a, b) -> Tensor:
    """``a`` where ``cond`` is true, else ``b`` (broadcasting; scalars allowed)."""
    ref = cond if isinstance(cond, Tensor) else (a if isinstance(a, Tensor) else b)
    if not isinstance(ref, Tensor):
        raise FlowError("where: expected a Tensor among cond, a and b")
    bk = ref._backend
    if not isinstance(cond, Tensor):
        cond = _to_tensor_like(cond, ref)
    cd = cond._data if cond._data.dtype.kind == "b" else bk.ne(cond._data, 0)
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        _, ad, bd, at, bt = _operands(a, b, "where")
    elif isinstance(a, Tensor):
        _, ad, bd, at, bt = _operands(a, b, "where")
    elif isinstance(b, Tensor):
        _, ad, bd, at, bt = _operands(a, b, "where")
    else:
        dt = get_default_dtype() if isinstance(a, float) or isinstance(b, float) else from_numpy_dtype(np.int64)
        ad, bd, at, bt = bk.full((), a, dt.np), b, None, None
    for t in (at, bt):
        if t is not None and t._backend is not bk:
            raise BackendError(f"where: condition on {ref.device} but a value on {t.device}")
    out = _wrap(bk.where(cd, ad, bd), bk)
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        c = _wrap(cd, bk)

        def bw(g):
            zero = g * 0.0
            return _grads(where(c, g, zero) if at is not None else None,
                          where(c, zero, g) if bt is not None else None, at, bt)

        _attach(out, bw, (at, bt), "Where")
    return out


def lerp(a: Tensor, b: Tensor, weight) -> Tensor:
    """``a + weight * (b - a)``."""
    return a + (b - a) * weight
