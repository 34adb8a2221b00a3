"""Data types and PyTorch's type-promotion rules.

A ``DType`` names a numpy dtype (the lingua franca of every backend's arrays; bfloat16 comes from
``ml_dtypes``). Promotion follows PyTorch: categories bool < integer < floating; within a category the
wider type wins; a 0-d tensor or a Python scalar only matters when its category is higher than the
other operand's (so ``float16_tensor * 2.5`` stays float16 and ``int_tensor * 2.5`` becomes the default
float dtype).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import FlowError


class DType:
    """A flowgraph data type (``fg.float32`` ...). Compare with ``==``; ``np`` is the numpy dtype."""

    __slots__ = ("name", "np", "itemsize", "is_floating_point", "is_signed", "category", "rank")

    def __init__(self, name: str, np_dtype, category: int, rank: int):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.category = category  # 0 bool, 1 integer, 2 floating
        self.rank = rank  # order within the category
        self.is_floating_point = category == 2
        self.is_signed = category == 2 or self.np.kind == "i"

    def __repr__(self) -> str:
        return f"flowgraph.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


bool_ = DType("bool", np.bool_, 0, 0)
uint8 = DType("uint8", np.uint8, 1, 0)
int8 = DType("int8", np.int8, 1, 1)
int16 = DType("int16", np.int16, 1, 2)
int32 = DType("int32", np.int32, 1, 3)
int64 = DType("int64", np.int64, 1, 4)
float16 = DType("float16", np.float16, 2, 0)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16, 2, 1)
float32 = DType("float32", np.float32, 2, 2)
float64 = DType("float64", np.float64, 2, 3)

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
_FROM_NP: dict[np.dtype, DType] = {d.np: d for d in ALL_DTYPES}
_NAMES = {d.name: d for d in ALL_DTYPES}
_NAMES.update({"float": float32, "double": float64, "half": float16, "long": int64, "int": int32})

_DEFAULT_FLOAT = [float32]


def _by_name(name: str) -> DType:
    return _NAMES[name]


def get_default_dtype() -> DType:
    """The dtype of floating tensors made from Python floats (``float32`` unless changed)."""
    return _DEFAULT_FLOAT[0]


def set_default_dtype(dtype: DType) -> None:
    """Change the default floating dtype (``float32`` or ``float64``), like ``torch.set_default_dtype``."""
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point:
        raise FlowError(f"set_default_dtype: expected a floating dtype, got {dtype}")
    _DEFAULT_FLOAT[0] = dtype


def from_numpy_dtype(np_dtype) -> DType:
    """The flowgraph dtype for a numpy dtype; raises FlowError for unsupported ones (complex, strings)."""
    try:
        return _FROM_NP[np_dtype]
    except KeyError:
        try:
            return _FROM_NP[np.dtype(np_dtype)]
        except (KeyError, TypeError):
            raise FlowError(
                f"unsupported dtype {np_dtype!r}; flowgraph supports {', '.join(d.name for d in ALL_DTYPES)}"
            ) from None


def as_dtype(dtype) -> DType:
    """Accept a DType, a name (``"float32"``), a numpy dtype or a torch dtype and return the DType."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        found = _NAMES.get(dtype.removeprefix("torch.").removeprefix("flowgraph."))
        if found is None:
            raise FlowError(f"unknown dtype name {dtype!r}; expected one of {sorted(_NAMES)}")
        return found
    if dtype is bool:
        return bool_
    if dtype is int:
        return int64
    if dtype is float:
        return get_default_dtype()
    text = str(dtype)
    if text.startswith("torch."):
        return as_dtype(text)
    return from_numpy_dtype(dtype)


def promote_types(a: DType, b: DType) -> DType:
    """The result dtype of combining two tensors of these dtypes (PyTorch's ``promote_types``)."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 2 and {a.name, b.name} == {"float16", "bfloat16"}:
        return float32
    if a.category == 1 and "uint8" in (a.name, b.name):
        other = b if a.name == "uint8" else a
        return int16 if other.name == "int8" else other
    return a if a.rank >= b.rank else b


def scalar_category(value) -> int:
    """Category of a Python scalar: 0 bool, 1 int, 2 float."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 1
    return 2
