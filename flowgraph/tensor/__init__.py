"""The tensor layer: ``Tensor``, dtypes and every functional op, installed as methods and operators."""
# ruff: noqa: F401 - this module re-exports the functional API; ``__all__`` is computed at the bottom

from __future__ import annotations

from ..autograd.grad_mode import STATE
from . import creation, elementwise, extra, indexing, linalg, reduction, shape
from .amp import autocast, is_autocast_enabled
from .creation import (
    arange,
    as_tensor,
    bernoulli,
    empty,
    empty_like,
    eye,
    from_dlpack,
    from_numpy,
    full,
    full_like,
    get_rng_state,
    linspace,
    manual_seed,
    normal,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    set_rng_state,
    tensor,
    zeros,
    zeros_like,
)
from .dtype import (
    ALL_DTYPES,
    DType,
    as_dtype,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from .elementwise import (
    abs,
    add,
    atan2,
    broadcast_shapes,
    ceil,
    clamp,
    cos,
    div,
    eq,
    erf,
    exp,
    expm1,
    floor,
    floor_divide,
    fmod,
    ge,
    gelu,
    gt,
    isfinite,
    isinf,
    isnan,
    le,
    lerp,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    reciprocal,
    relu,
    remainder,
    round,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softplus,
    sqrt,
    square,
    sub,
    sum_to,
    tan,
    tanh,
    trunc,
    where,
)
from .extra import (
    addcdiv,
    addcmul,
    allclose,
    argsort,
    diag,
    diagonal,
    equal,
    inference_mode,
    isclose,
    nan_to_num,
    sort,
    topk,
    trace,
    tril,
    triu,
    unique,
)
from .indexing import (
    apply_inplace,
    gather,
    getitem,
    index_add,
    index_select,
    masked_fill,
    masked_select,
    nonzero,
    scatter,
    scatter_add,
    setitem,
    take_along_dim,
)
from .linalg import bmm, dot, einsum, matmul, mm, outer
from .reduction import (
    all,
    amax,
    amin,
    any,
    argmax,
    argmin,
    count_nonzero,
    cumprod,
    cumsum,
    log_softmax,
    logsumexp,
    max,
    mean,
    min,
    norm,
    prod,
    softmax,
    std,
    sum,
    var,
    var_mean,
)
from .sampling import multinomial
from .shape import (
    broadcast_tensors,
    broadcast_to,
    cat,
    chunk,
    clone,
    concat,
    contiguous,
    expand,
    expand_as,
    flatten,
    flip,
    movedim,
    narrow,
    pad,
    permute,
    repeat,
    repeat_interleave,
    reshape,
    roll,
    split,
    squeeze,
    stack,
    t,
    transpose,
    unbind,
    unflatten,
    unsqueeze,
    view,
)
from .tensor import Tensor


def _install() -> None:
    """Attach the functional ops to ``Tensor`` as methods, operators and in-place variants."""
    T = Tensor
    methods = {
        # elementwise
        "add": add, "sub": sub, "mul": mul, "div": div, "pow": pow, "neg": neg, "exp": exp, "log": log,
        "log1p": log1p, "expm1": expm1, "sqrt": sqrt, "rsqrt": rsqrt, "sin": sin, "cos": cos, "tan": tan,
        "tanh": tanh, "erf": erf, "abs": abs, "sign": sign, "floor": floor, "ceil": ceil, "round": round,
        "trunc": trunc, "reciprocal": reciprocal, "square": square, "sigmoid": sigmoid, "relu": relu,
        "gelu": gelu, "silu": silu, "softplus": softplus, "clamp": clamp, "clip": clamp, "maximum": maximum,
        "minimum": minimum, "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge, "isnan": isnan,
        "isinf": isinf, "isfinite": isfinite, "logical_and": logical_and, "logical_or": logical_or,
        "logical_xor": logical_xor, "logical_not": logical_not, "remainder": remainder, "fmod": fmod,
        "floor_divide": floor_divide, "atan2": atan2, "lerp": lerp, "where": lambda self, cond, other: where(
            cond, self, other),
        # reductions
        "sum": sum, "mean": mean, "var": var, "std": std, "max": max, "min": min, "amax": amax, "amin": amin,
        "argmax": argmax, "argmin": argmin, "prod": prod, "cumsum": cumsum, "cumprod": cumprod,
        "logsumexp": logsumexp, "softmax": softmax, "log_softmax": log_softmax, "norm": norm, "any": any,
        "all": all, "count_nonzero": count_nonzero,
        # shape
        "reshape": reshape, "view": view, "permute": permute, "transpose": transpose, "t": t,
        "squeeze": squeeze, "unsqueeze": unsqueeze, "flatten": flatten, "unflatten": unflatten,
        "expand": expand, "expand_as": expand_as, "broadcast_to": broadcast_to, "repeat": repeat,
        "repeat_interleave": repeat_interleave, "split": split, "chunk": chunk, "unbind": unbind, "flip": flip,
        "roll": roll, "narrow": narrow, "movedim": movedim, "contiguous": contiguous, "clone": clone,
        "to": shape.to,
        # indexing
        "gather": gather, "scatter": scatter, "scatter_add": scatter_add, "index_select": index_select,
        "index_add": index_add, "masked_fill": masked_fill, "masked_select": masked_select,
        "take_along_dim": take_along_dim, "nonzero": nonzero,
        # linalg
        "matmul": matmul, "mm": mm, "bmm": bmm, "dot": dot, "outer": outer,
    }
    for name, fn in methods.items():
        setattr(T, name, fn)

    T.__getitem__ = getitem
    T.__setitem__ = setitem
    T.__add__ = add
    T.__radd__ = lambda self, other: add(other, self)
    T.__sub__ = sub
    T.__rsub__ = lambda self, other: sub(other, self)
    T.__mul__ = mul
    T.__rmul__ = lambda self, other: mul(other, self)
    T.__truediv__ = div
    T.__rtruediv__ = lambda self, other: div(other, self)
    T.__floordiv__ = floor_divide
    T.__rfloordiv__ = lambda self, other: floor_divide(other, self)
    T.__mod__ = remainder
    T.__rmod__ = lambda self, other: remainder(other, self)
    T.__pow__ = pow
    T.__rpow__ = lambda self, other: pow(other, self)
    T.__matmul__ = matmul
    T.__rmatmul__ = lambda self, other: matmul(other, self)
    T.__neg__ = neg
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__eq__ = eq
    T.__ne__ = ne
    T.__lt__ = lt
    T.__le__ = le
    T.__gt__ = gt
    T.__ge__ = ge
    T.__and__ = logical_and
    T.__or__ = logical_or
    T.__xor__ = logical_xor
    T.__invert__ = logical_not
    T.__hash__ = object.__hash__  # identity, in C (assigning __eq__ above leaves it as it was; kept explicit)

    # dtype shortcuts
    T.float = lambda self: shape.to(self, float32)
    T.double = lambda self: shape.to(self, float64)
    T.half = lambda self: shape.to(self, float16)
    T.bfloat16 = lambda self: shape.to(self, bfloat16)
    T.long = lambda self: shape.to(self, int64)
    T.int = lambda self: shape.to(self, int32)
    T.bool = lambda self: shape.to(self, bool_)
    T.type = lambda self, dtype: shape.to(self, dtype)
    T.cpu = lambda self: shape.to(self, "cpu")
    T.cuda = lambda self, index=None: shape.to(self, "cuda" if index is None else f"cuda:{index}")
    T.is_floating_point = lambda self: self.dtype.is_floating_point
    T.element_size = lambda self: self.dtype.itemsize
    def _size(size) -> tuple:
        """``new_zeros(2, 5)`` and ``new_zeros((2, 5))`` alike."""
        return tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)

    T.new_zeros = lambda self, *size, dtype=None: zeros(*_size(size), dtype=dtype or self.dtype, device=self.device)
    T.new_ones = lambda self, *size, dtype=None: ones(*_size(size), dtype=dtype or self.dtype, device=self.device)
    T.new_empty = lambda self, *size, dtype=None: zeros(*_size(size), dtype=dtype or self.dtype, device=self.device)
    T.new_full = lambda self, size, value, dtype=None: full(tuple(size) if not isinstance(size, int) else (size,),
                                                            value, dtype=dtype or self.dtype, device=self.device)
    T.new_tensor = lambda self, data, dtype=None: tensor(data, dtype=dtype or self.dtype, device=self.device)
    T.clamp_min = lambda self, m: clamp(self, min=m)
    T.clamp_max = lambda self, m: clamp(self, max=m)

    # in-place variants: compute out of place, write into this tensor's storage, rebase autograd
    def make_inplace(name, fn):
        def method(self, *args, **kwargs):
            return apply_inplace(self, lambda s: fn(s, *args, **kwargs), name + "_",
                                 *[a for a in args if isinstance(a, Tensor)])

        method.__name__ = name + "_"
        method.__doc__ = f"In-place ``{name}``: writes the result into this tensor and returns it."
        return method

    for name in ("add", "sub", "mul", "div", "pow", "clamp", "exp", "log", "sqrt", "neg", "abs", "relu",
                 "sigmoid", "tanh", "masked_fill", "floor", "ceil", "round", "reciprocal", "lerp", "clamp_min",
                 "clamp_max", "scatter", "scatter_add", "index_add", "fmod", "remainder", "sign", "square"):
        setattr(T, name + "_", make_inplace(name, getattr(T, name)))

    T.__iadd__ = T.add_
    T.__isub__ = T.sub_
    T.__imul__ = T.mul_
    T.__itruediv__ = T.div_

    def zero_(self):
        """Fill with zeros in place."""
        return fill_(self, 0)

    def _overwrite(s, new):
        """``new`` with a zero-gradient path to ``s`` when autograd records (an in-place overwrite keeps ``s`` in
        the graph). A mask, not ``new + s * 0``: an inf/NaN in the old values must not leak into the result."""
        if STATE.enabled and (s.requires_grad or new.requires_grad):
            return where(zeros(s.shape, dtype=bool_, device=s.device), s, new)
        return new

    def fill_(self, value):
        """Fill with ``value`` in place."""
        return apply_inplace(self, lambda s: full_like(s, value.item() if isinstance(value, Tensor) else value)
                             if not isinstance(value, Tensor) or not value.requires_grad
                             else _overwrite(s, value.to(s.dtype).expand(s.shape)), "fill_")

    def copy_(self, src):
        """Copy ``src`` (broadcast, cast, moved across devices) into this tensor in place."""
        if not isinstance(src, Tensor):
            src = tensor(src, dtype=self.dtype, device=self.device)
        return apply_inplace(self, lambda s: _overwrite(s, shape.to(src, self.device, self.dtype).expand(s.shape)),
                             "copy_", src)

    def uniform_(self, a: float = 0.0, b: float = 1.0):
        """Fill with uniform samples in [a, b)."""
        return apply_inplace(self, lambda s: rand_like(s) * (b - a) + a, "uniform_")

    def normal_(self, mean: float = 0.0, std: float = 1.0):
        """Fill with normal samples."""
        return apply_inplace(self, lambda s: randn_like(s) * std + mean, "normal_")

    T.zero_ = zero_
    T.fill_ = fill_
    T.copy_ = copy_
    T.uniform_ = uniform_
    T.normal_ = normal_


_install()
extra.install(Tensor)

__all__ = [name for name in dir() if not name.startswith("_")]
