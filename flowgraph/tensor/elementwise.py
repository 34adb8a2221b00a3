"""Elementwise ops: arithmetic with broadcasting and PyTorch promotion, comparisons, math, activations.

Forward work happens on native arrays through the backend; each backward is written with tensor ops so
every backend differentiates everything (and ``create_graph=True`` gives higher-order gradients).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..autograd.grad_mode import STATE
from ..errors import BackendError, FlowError, ShapeError
from .dtype import from_numpy_dtype, get_default_dtype, promote_types
from .tensor import Tensor, _record, _wrap, check_nonzero_divisor

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
        info = np.iinfo(arr.dtype)
        if not isinstance(scalar, bool) and not info.min <= scalar <= info.max:
            # int8 + 1000: the scalar converts with C's wrap-around, as PyTorch computes it, on every backend
            scalar = int(np.array(scalar).astype(np.int64).astype(arr.dtype))
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


def _needs(at, bt) -> tuple[bool, bool]:
    """Which of a binary op's operands (None for a scalar) need a gradient."""
    return at is not None and at.requires_grad, bt is not None and bt.requires_grad


def _binary_saved(a, b, at, bt):
    """What a binary op whose gradient formulas read both operands saves: its tensor operands, and a function
    ``unpack(saved) -> (a, b)`` that puts the Python scalar operands back in their places."""
    if at is not None and bt is not None:
        return (at, bt), _both
    if at is not None:
        return (at,), lambda sv: (sv[0], b)
    return (bt,), lambda sv: (a, sv[0])


def _both(sv):
    return sv[0], sv[1]


def _grads(ga, gb, sa, sb):
    """Input gradients reduced to the operands' shapes (``None`` for a scalar operand's shape)."""
    return (None if sa is None or ga is None else sum_to(ga, sa),
            None if sb is None or gb is None else sum_to(gb, sb))


def _shape_of(t):
    return None if t is None else t._data.shape


# ---------------------------------------------------------------------- arithmetic
@functools.lru_cache(maxsize=4096)
def _add_backward(sa: tuple | None, sb: tuple | None, subtract: bool = False):
    """The backward of ``add`` (``sub`` with ``subtract``) for operand shapes ``sa``, ``sb`` (None for a scalar
    operand), built once per pair of shapes: a closure made per call is a function, a tuple and cells that the
    cyclic garbage collector tracks, and they live as long as the step's graph (see
    ``nn.linear._linear_rows_backward``)."""

    def bw(g):
        gs = g._data.shape
        gb = -g if subtract and sb is not None else g
        return (None if sa is None else (g if gs == sa else sum_to(g, sa)),
                None if sb is None else (gb if gs == sb else sum_to(gb, sb)))

    return bw


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
        _record(out, "Add", (at, bt), (), _add_backward(_shape_of(at), _shape_of(bt)))
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
        _record(out, "Sub", (at, bt), (), _add_backward(_shape_of(at), _shape_of(bt), True))
    return out


def mul(a, b) -> Tensor:
    """Elementwise product with broadcasting."""
    bk, ad, bd, at, bt = _operands(a, b, "mul")
    try:
        out = _wrap(bk.mul(ad, bd), bk)
    except ValueError as exc:
        raise _shape_error("mul", a, b, exc) from None
    if not STATE.enabled:
        return out
    if at is not None and bt is not None:
        need_a, need_b = at.requires_grad, bt.requires_grad
        if need_a or need_b:
            # Each operand is saved only for the other's gradient (so x.mul_(2) on a graph tensor stays valid).
            _record(out, "Mul", (at, bt), (bt, at) if need_a and need_b else (bt,) if need_a else (at,),
                    _mul_backward(need_a, need_b, at._data.shape, bt._data.shape, out._data.dtype))
    elif (at if at is not None else bt).requires_grad:
        _record(out, "Mul", (at, bt), (), _mul_scalar_backward(b if at is not None else a, at is not None,
                                                               (at if at is not None else bt)._data.shape,
                                                               out._data.dtype))
    return out


@functools.lru_cache(maxsize=4096)
def _mul_backward(need_a: bool, need_b: bool, sa: tuple, sb: tuple, out_dtype):
    """Backward of a tensor-tensor product; ``saved`` is (b, a), (b,) or (a,) after which operands need grad.
    Built once per shapes and dtype (see ``_add_backward``)."""

    def bw(g, *sv):
        tb = sv[0] if need_a else None
        ta = sv[-1] if need_b else None
        gd = g._data
        if STATE.enabled or gd.dtype != out_dtype or out_dtype.kind != "f":
            # create_graph (or an odd dtype): differentiable tensor ops, PyTorch's promotion
            return (sum_to(g * tb, sa) if need_a else None, sum_to(g * ta, sb) if need_b else None)
        # the common case on the arrays directly, in the forward's (promoted) dtype
        bk = g._backend
        ga = gb = None
        if need_a:
            od = tb._data if tb._data.dtype == out_dtype else bk.cast(tb._data, out_dtype)
            ga = bk.mul(gd, od)
            ga = _wrap(ga, bk) if ga.shape == sa else _sum_to_array(bk, ga, sa)
        if need_b:
            od = ta._data if ta._data.dtype == out_dtype else bk.cast(ta._data, out_dtype)
            gb = bk.mul(gd, od)
            gb = _wrap(gb, bk) if gb.shape == sb else _sum_to_array(bk, gb, sb)
        return ga, gb

    return bw


def _mul_scalar_backward(c, tensor_first: bool, shape: tuple, out_dtype):
    """Backward of a tensor times a Python scalar ``c``: nothing saved. Shared between calls with the same
    scalar (of the same type), side, shape and dtype (see ``_add_backward``)."""
    try:
        return _shared_mul_scalar_backward(type(c), c, tensor_first, shape, out_dtype)
    except TypeError:  # an unhashable scalar (a 0-d array): its own closure
        return _make_mul_scalar_backward(c, tensor_first, shape, out_dtype)


@functools.lru_cache(maxsize=4096)
def _shared_mul_scalar_backward(kind: type, c, tensor_first: bool, shape: tuple, out_dtype):
    """``_make_mul_scalar_backward`` once per key (``kind`` keeps 1, 1.0 and True apart)."""
    return _make_mul_scalar_backward(c, tensor_first, shape, out_dtype)


def _make_mul_scalar_backward(c, tensor_first: bool, shape: tuple, out_dtype):
    """The backward closure of ``_mul_scalar_backward``."""

    def bw(g):
        gd = g._data
        if STATE.enabled or gd.dtype != out_dtype or out_dtype.kind != "f":
            gt = sum_to(g * c, shape)
        else:
            bk = g._backend
            gt = _wrap(bk.mul(gd, c), bk)
        return (gt, None) if tensor_first else (None, gt)

    return bw


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
        need_a, need_b = _needs(at, bt)
        sa, sb = _shape_of(at), _shape_of(bt)
        # a's gradient reads b; b's reads a and b (PyTorch saves the same): a / 4 saves nothing
        keep_a, keep_b = need_b and at is not None, (need_a or need_b) and bt is not None
        ca = None if at is not None else a
        cb = None if bt is not None else b
        saved = ((at,) if keep_a else ()) + ((bt,) if keep_b else ())

        def bw(g, *sv):
            fa = sv[0] if keep_a else ca
            fb = sv[-1] if keep_b else cb
            ga = g / fb if need_a else None
            gb = -g * fa / (fb * fb) if need_b else None
            return _grads(ga, gb, sa, sb)

        _record(out, "Div", (at, bt), saved, bw)
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
        need_a, need_b = _needs(at, bt)
        sa, sb = _shape_of(at), _shape_of(bt)
        operands, unpack = _binary_saved(a, b, at, bt)

        def bw(g, *sv):
            ca, cb = unpack(sv[:-1] if need_b else sv)
            ga = gb = None
            if need_a:
                if isinstance(cb, _SCALAR_TYPES):
                    ga = g * cb * ca ** (cb - 1) if cb != 0 else g * 0.0
                else:
                    ga = g * cb * ca ** (cb - 1)
                    ga = where(cb == 0, 0.0, ga)
            if need_b:
                y = sv[-1]
                base = ca if isinstance(ca, Tensor) else _wrap(g._backend.full((), ca, y._data.dtype), g._backend)
                gb = g * y * where(base > 0, base, 1.0).log()
                # base < 0: NaN (as torch); a NaN constant, not gb * nan, keeps double backward NaN-free
                gb = where(base > 0, gb, where(base == 0, 0.0, float("nan")).to(gb.dtype))
            return _grads(ga, gb, sa, sb)

        _record(out, "Pow", (at, bt), operands + ((out,) if need_b else ()), bw)
    return out


def neg(a: Tensor) -> Tensor:
    """``-a``."""
    bk = a._backend
    if a._data.dtype.kind == "b":
        raise FlowError("neg: negation of a bool tensor is not supported (as in PyTorch); use ~mask or logical_not()")
    out = _wrap(bk.neg(a._data), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Neg", (a,), (), _neg_backward)
    return out


def _neg_backward(g):
    return (-g,)


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
            sa, sb = _shape_of(at), _shape_of(bt)
            operands, unpack = _binary_saved(a, b, at, bt)

            def bw(g, *sv):
                ca, cb = unpack(sv)
                pick_a = (ca > cb) if prim == "maximum" else (ca < cb)
                tie = ca == cb
                wa = where(pick_a, 1.0, where(tie, 0.5, 0.0)).to(g.dtype)
                return _grads(g * wa, g * (1.0 - wa), sa, sb)

            _record(out, name.capitalize(), (at, bt), operands, bw)
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
        sa, sb = _shape_of(at), _shape_of(bt)
        operands, unpack = _binary_saved(a, b, at, bt)

        def bw(g, *sv):
            ca, cb = unpack(sv)
            den = ca * ca + cb * cb
            return _grads(g * cb / den, -g * ca / den, sa, sb)

        _record(out, "Atan2", (at, bt), operands, bw)
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
def floor_divide(a, b) -> Tensor:
    """Elementwise floor division (no gradient); an integer division by zero raises ``ZeroDivisionError``."""
    _check_int_divisor(a, b, "floor_divide")
    return _binary_nograd("floor_divide", a, b, "floor_divide")


def _check_int_divisor(a, b, where: str) -> None:
    ints = all(not isinstance(x, float) and (not isinstance(x, Tensor) or x._data.dtype.kind in "iub")
               for x in (a, b))
    if ints:
        check_nonzero_divisor(b, where)


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
    """Python-style modulus (sign of the divisor); gradient 1 for ``a``, ``-floor(a/b)`` for ``b``. An integer
    remainder by zero raises ``ZeroDivisionError``, as in PyTorch."""
    _check_int_divisor(a, b, "remainder")
    bk, ad, bd, at, bt = _operands(a, b, "remainder")
    out = _wrap(bk.remainder(ad, bd), bk)
    if STATE.enabled and ((at is not None and at.requires_grad) or (bt is not None and bt.requires_grad)):
        need_a, need_b = _needs(at, bt)
        sa, sb = _shape_of(at), _shape_of(bt)
        # b's gradient -floor(a / b) reads both (PyTorch saves both); a's gradient is g alone
        operands, unpack = _binary_saved(a, b, at, bt) if need_b else ((), None)

        def bw(g, *sv):
            gb = None
            if need_b:
                ca, cb = unpack(sv)
                gb = -g * (ca / cb).floor()
            return _grads(g if need_a else None, gb, sa, sb)

        _record(out, "Remainder", (at, bt), operands, bw)
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
            # what the formula reads: the output (exp, tanh, sqrt ...) or the input; under create_graph the
            # saved output comes back carrying this node, so the gradient stays differentiable
            _record(out, name, (a,), (out,) if save_out else (a,), bw_out if save_out else bw_in)
        return out

    def bw_out(g, y):
        return (grad(g, None, y),)

    def bw_in(g, x):
        return (grad(g, x, None),)

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
        _record(out, "Sigmoid", (a,), (out,), _sigmoid_backward)
    return out


def _sigmoid_backward(g, y):
    return (g * y * (1.0 - y),)


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)``; gradient 0 at 0 as in PyTorch."""
    bk = a._backend
    out = _wrap(bk.maximum(a._data, 0), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Relu", (a,), (out,), _relu_backward)
    return out


def _relu_backward(g, y):
    if STATE.enabled:  # create_graph: differentiable in g
        return (g * (y > 0),)
    gbk = g._backend
    gd = g._data if g._data.dtype == y._data.dtype else gbk.cast(g._data, y._data.dtype)
    # where(y > 0, g, 0): two pending instructions (the tensor form adds a cast of the mask), and 0 where y <= 0
    # even for a NaN gradient, as PyTorch's threshold_backward
    return (_wrap(gbk.where(gbk.gt(y._data, 0), gd, 0), gbk),)


_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit: exact (``"none"``, erf-based) or the ``"tanh"`` approximation."""
    bk = a._backend
    x = _float_data(a)
    if approximate == "none":
        grad = a.requires_grad and STATE.enabled
        y, saved = bk.gelu_exact(x, grad)
        out = _wrap(y, bk)
        if grad:
            _record(out, "Gelu", (a,), (a,) if saved is None else (a, _wrap(saved, bk)), _gelu_exact_backward)
        return out
    if approximate != "tanh":
        raise FlowError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    inner = bk.mul(bk.add(x, bk.mul(bk.mul(bk.mul(x, x), x), 0.044715)), _SQRT_2_OVER_PI)
    th = bk.tanh(inner)
    out = _wrap(bk.mul(bk.mul(x, bk.add(th, 1.0)), 0.5), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Gelu", (a,), (a, _wrap(th, bk)), _gelu_tanh_backward)
    return out


def _gelu_exact_backward(g, xc, *rest):
    """Exact GELU's backward from its input ``xc`` (and what ``Backend.gelu_exact`` saved, where it saved
    something); under ``create_graph`` the composed formula, differentiable in ``x``. One function for every
    call: a closure per call is garbage the cyclic collector tracks."""
    if not STATE.enabled:
        gbk = g._backend
        saved_d = rest[0]._data if rest else None
        return (_wrap(gbk.gelu_exact_backward(g._data, _float_data(xc), saved_d), gbk),)
    cdf_t = ((xc * (1.0 / _SQRT_2)).erf() + 1.0) * 0.5
    pdf = (xc * xc * -0.5).exp() * _INV_SQRT_2PI
    return (g * (cdf_t + xc * pdf),)


def _gelu_tanh_backward(g, xc, th_saved):
    th_t = th_saved if not STATE.enabled else ((xc + xc * xc * xc * 0.044715) * _SQRT_2_OVER_PI).tanh()
    dinner = (xc * xc * (3 * 0.044715) + 1.0) * _SQRT_2_OVER_PI
    return (g * (0.5 * (th_t + 1.0) + 0.5 * xc * (1.0 - th_t * th_t) * dinner),)


def silu(a: Tensor) -> Tensor:
    """``a * sigmoid(a)``."""
    bk = a._backend
    d = _float_data(a)
    s = bk.reciprocal(bk.add(bk.exp(bk.neg(d)), 1.0))
    out = _wrap(bk.mul(d, s), bk)
    if a.requires_grad and STATE.enabled:
        _record(out, "Silu", (a,), (a, _wrap(s, bk)), _silu_backward)
    return out


def _silu_backward(g, a, s_saved):
    st = s_saved if not STATE.enabled else sigmoid(a)
    return (g * st * (1.0 + a * (1.0 - st)),)


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
        sa, sb = _shape_of(at), _shape_of(bt)

        def bw(g, c):
            zero = g * 0.0
            return _grads(where(c, g, zero) if sa is not None else None,
                          where(c, zero, g) if sb is not None else None, sa, sb)

        _record(out, "Where", (at, bt), (_wrap(cd, bk),), bw)
    return out


def lerp(a: Tensor, b: Tensor, weight) -> Tensor:
    """``a + weight * (b - a)``."""
    return a + (b - a) * weight
