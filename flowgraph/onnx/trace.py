"""Recording a forward pass as ONNX nodes: the backend's primitives are intercepted while the model runs.

flowgraph's tensor layer reaches arrays only through its backend's primitives (about 60 operations, see
``docs/architecture.md``), so a forward pass *is* a sequence of primitive calls. During an export the CPU
backend's primitives are wrapped: each top-level call appends the ONNX node(s) computing the same thing,
with value names keyed by the identity of the native arrays. The model still computes real values, which
give every traced shape and constant.

Declared capabilities (``standardize``, ``gelu_exact``, ``max_pool_blocks``, ``add_into``) are replaced by
their generic defaults from ``Backend`` for the duration, so they too decompose into recorded primitives.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import Backend
from ..errors import FlowError

#: Primitives recorded one to one (the elementwise ones are mapped in ``_UNARY`` / ``_BINARY``).
_UNARY = {
    "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos", "tanh": "Tanh",
    "abs": "Abs", "sign": "Sign", "reciprocal": "Reciprocal", "floor": "Floor", "ceil": "Ceil",
    "round": "Round", "logical_not": "Not", "isnan": "IsNaN", "isinf": "IsInf", "erf": "Erf",
}
_BINARY = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max", "minimum": "Min",
    "eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
    "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
}
_OTHER = (
    "log1p", "expm1", "ne", "floor_divide", "remainder", "atan2", "where", "cast", "sum", "prod", "max", "min",
    "any", "all", "argmax", "argmin", "cumsum", "reshape", "permute", "expand", "slice", "flip", "pad",
    "concatenate", "contiguous", "assign", "matmul", "argsort", "gather", "scatter_add", "scatter", "full",
    "arange", "from_host", "uniform", "normal", "randint", "native",
)
#: Capabilities run as their generic default (written in primitives) while tracing.
_GENERIC = ("gelu_exact", "standardize", "batch_norm", "max_pool_blocks", "add_into")


@dataclass
class Scope:
    """One ONNX graph under construction: the main graph or a ``Loop`` body."""

    name: str
    parent: Scope | None = None
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    keep: list = field(default_factory=list)  # the arrays named here, so their ids stay unique

    def lookup(self, array: Any) -> str | None:
        """The value name of ``array`` here or in an enclosing scope (ONNX subgraphs see outer values)."""
        scope: Scope | None = self
        key = id(array)
        while scope is not None:
            name = scope.names.get(key)
            if name is not None:
                return name
            scope = scope.parent
        return None


class Recorder:
    """Builds ONNX nodes for primitive calls; ``path`` names the module or graph node being exported."""

    def __init__(self, opset: int, params: dict[int, tuple[str, Any]]):
        import onnx  # noqa: F401 - checked by the caller; imported here for the helpers below
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.opset = opset
        self.main = Scope("main")
        self.scope = self.main
        self.params = params  # id(native array) -> (initializer name, array)
        self.recording = True
        self.depth = 0
        self.path: list[tuple[str, bool]] = []
        self.dynamic_batch = False
        self.host_reads: set[str] = set()  # where a traced forward read a tensor value on the host
        self._count = 0

    # ------------------------------------------------------------------ names and values
    def fresh(self, prefix: str) -> str:
        """A value name unique in the whole model."""
        self._count += 1
        return f"{prefix}_{self._count}"

    def where(self) -> str:
        """The path of the module or node being exported (for error messages)."""
        parts: list[str] = []
        for text, is_module in self.path:  # a module entry is a full path from the root: start again there
            if is_module:
                parts = [text] if text else []
            elif text and (not parts or parts[-1].rsplit(".", 1)[-1] != text):
                parts.append(text)
        return ".".join(parts) if parts else "<model>"

    def fail(self, what: str) -> FlowError:
        """The error for a construct ONNX cannot express, naming where it is."""
        return FlowError(f"fg.onnx.export: {self.where()}: {what}")

    def bind(self, array: Any, name: str) -> None:
        """Name ``array`` in the current scope."""
        self.scope.names[id(array)] = name
        self.scope.keep.append(array)

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        """Append one ONNX node to the current scope; returns its output names."""
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        self.scope.nodes.append(self.helper.make_node(op, inputs, outs, name=self.fresh("n_" + op), **attrs))
        return outs

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        """One node, one output."""
        return self.node(op, list(inputs), 1, **attrs)[0]

    def const(self, value: Any, dtype: Any = None) -> str:
        """A constant (a ``Constant`` node in the current scope)."""
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh("const")
        tensor = self.numpy_helper.from_array(arr, name=name + "_value")
        self.scope.nodes.append(self.helper.make_node("Constant", [], [name], value=tensor,
                                                      name=self.fresh("n_Constant")))
        return name

    def ints(self, values: Any) -> str:
        """An int64 1-D constant (shapes, axes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64))

    def value(self, array: Any) -> str:
        """The value name of a native array: a traced value, a parameter (initializer) or a new constant."""
        name = self.scope.lookup(array)
        if name is not None:
            return name
        param = self.params.get(id(array))
        if param is not None:
            pname, parr = param
            self.main.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(parr), name=pname))
            self.main.names[id(array)] = pname
            self.main.keep.append(array)
            return pname
        name = self.const(np.asarray(array))
        self.bind(array, name)
        return name

    def operand(self, x: Any, like: Any) -> str:
        """A primitive's operand: an array, or a Python scalar in the dtype of ``like`` (an array)."""
        if isinstance(x, (bool, int, float, np.generic)) and not isinstance(x, np.ndarray):
            if isinstance(x, np.generic) and self.scope.lookup(x) is not None:
                return self.scope.lookup(x)
            dtype = np.asarray(like).dtype if like is not None else np.asarray(x).dtype
            return self.const(np.asarray(x, dtype=dtype))
        return self.value(x)

    # ------------------------------------------------------------------ switching recording
    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run code for its values only (a module whose ONNX form is emitted directly)."""
        before = self.recording
        self.recording = False
        try:
            yield
        finally:
            self.recording = before

    @contextmanager
    def at(self, name: str, module: bool = False) -> Iterator[None]:
        """Extend the path for error messages (``module``: ``name`` is a module's path from the root)."""
        self.path.append((name, module))
        try:
            yield
        finally:
            self.path.pop()

    @contextmanager
    def sub_scope(self, name: str) -> Iterator[Scope]:
        """Record into a new ``Loop`` body graph."""
        scope = Scope(name, parent=self.scope)
        self.scope = scope
        try:
            yield scope
        finally:
            self.scope = scope.parent

    def value_info(self, name: str, array: Any, shape: Any = None) -> Any:
        """A typed value declaration for a graph input or output (in a ``Loop`` body: the rank only, so a
        runtime never specialises the body to the sample's sizes)."""
        arr = np.asarray(array)
        if shape is None:
            shape = list(arr.shape) if self.scope is self.main else [None] * arr.ndim
        return self.helper.make_tensor_value_info(name, self.helper.np_dtype_to_tensor_dtype(arr.dtype), shape)

    # ------------------------------------------------------------------ primitives
    def record(self, prim: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Emit the ONNX node(s) computing ``out = prim(*args)`` and name ``out``."""
        if prim == "assign":  # checked first: it returns its (now overwritten) destination
            self._p_assign(out, *args)
        if isinstance(out, tuple):  # no multi-output primitive is recorded directly
            raise self.fail(f"the primitive {prim!r} returned several arrays; it has no ONNX form here")
        if any(out is a for a in args if not isinstance(a, (int, float, bool, tuple, list))):
            alias = self.value(next(a for a in args if a is out))
            self.bind(out, alias)  # contiguous()/cast() of an array that already is: the same value
            return
        if prim in _UNARY:
            name = self.op(_UNARY[prim], self.value(args[0]))
        elif prim in _BINARY:
            name = self._binary(_BINARY[prim], args[0], args[1])
        else:
            handler = getattr(self, "_p_" + prim, None)
            if handler is None:  # pragma: no cover - every wrapped primitive has a handler
                raise self.fail(f"the primitive {prim!r} has no ONNX form")
            name = handler(out, *args, **kwargs)
        self.bind(out, name)

    def _pair(self, a: Any, b: Any) -> tuple[str, str]:
        a_arr = a if isinstance(a, (np.ndarray, np.generic)) else None
        b_arr = b if isinstance(b, (np.ndarray, np.generic)) else None
        return self.operand(a, b_arr if a_arr is None else a), self.operand(b, a_arr if b_arr is None else b)

    def _binary(self, op: str, a: Any, b: Any) -> str:
        x, y = self._pair(a, b)
        return self.op(op, x, y)

    def _p_log1p(self, out: Any, a: Any) -> str:
        return self.op("Log", self.op("Add", self.value(a), self.const(np.asarray(1, dtype=out.dtype))))

    def _p_expm1(self, out: Any, a: Any) -> str:
        return self.op("Sub", self.op("Exp", self.value(a)), self.const(np.asarray(1, dtype=out.dtype)))

    def _p_ne(self, out: Any, a: Any, b: Any) -> str:
        return self.op("Not", self._binary("Equal", a, b))

    def _p_floor_divide(self, out: Any, a: Any, b: Any) -> str:
        x, y = self._pair(a, b)
        if np.issubdtype(out.dtype, np.floating):
            return self.op("Floor", self.op("Div", x, y))
        # Python's floor division on integers: (a - a mod b) / b is exact
        return self.op("Div", self.op("Sub", x, self.op("Mod", x, y, fmod=0)), y)

    def _p_remainder(self, out: Any, a: Any, b: Any) -> str:
        x, y = self._pair(a, b)
        if np.issubdtype(out.dtype, np.floating):  # Python's sign convention: a - floor(a / b) * b
            return self.op("Sub", x, self.op("Mul", self.op("Floor", self.op("Div", x, y)), y))
        return self.op("Mod", x, y, fmod=0)

    def _p_atan2(self, out: Any, a: Any, b: Any) -> str:
        raise self.fail("atan2 has no ONNX operator; compute the angle outside the exported model")

    def _p_where(self, out: Any, cond: Any, a: Any, b: Any) -> str:
        return self.op("Where", self.value(cond), self.operand(a, out), self.operand(b, out))

    def _p_cast(self, out: Any, a: Any, dtype: Any) -> str:
        return self.op("Cast", self.value(a), to=self.helper.np_dtype_to_tensor_dtype(np.dtype(out.dtype)))

    def _reduce(self, op: str, a: str, axes: tuple, keepdims: bool) -> str:
        if not axes:
            return self.op("Identity", a)
        if op == "ReduceSum" or self.opset >= 18:
            return self.op(op, a, self.ints(axes), keepdims=int(keepdims))
        return self.op(op, a, axes=list(axes), keepdims=int(keepdims))

    def _p_sum(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._reduce("ReduceSum", self.value(a), axes, keepdims)

    def _p_prod(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._reduce("ReduceProd", self.value(a), axes, keepdims)

    def _p_max(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._reduce("ReduceMax", self.value(a), axes, keepdims)

    def _p_min(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._reduce("ReduceMin", self.value(a), axes, keepdims)

    def _logical_reduce(self, op: str, a: Any, axes: tuple, keepdims: bool) -> str:
        ints = self.op("Cast", self.value(a), to=self.helper.np_dtype_to_tensor_dtype(np.dtype(np.int32)))
        reduced = self._reduce(op, ints, axes, keepdims)
        return self.op("Cast", reduced, to=self.helper.np_dtype_to_tensor_dtype(np.dtype(bool)))

    def _p_any(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._logical_reduce("ReduceMax", a, axes, keepdims)

    def _p_all(self, out: Any, a: Any, axes: tuple, keepdims: bool) -> str:
        return self._logical_reduce("ReduceMin", a, axes, keepdims)

    def _p_argmax(self, out: Any, a: Any, axis: int, keepdims: bool) -> str:
        return self.op("ArgMax", self.value(a), axis=int(axis), keepdims=int(keepdims))

    def _p_argmin(self, out: Any, a: Any, axis: int, keepdims: bool) -> str:
        return self.op("ArgMin", self.value(a), axis=int(axis), keepdims=int(keepdims))

    def _p_cumsum(self, out: Any, a: Any, axis: int) -> str:
        return self.op("CumSum", self.value(a), self.const(np.asarray(axis, dtype=np.int64)))

    def _p_reshape(self, out: Any, a: Any, shape: Any) -> str:
        target = list(np.shape(out))
        src = np.shape(a)
        if self.dynamic_batch and target and src and target[0] == src[0]:
            target[0] = 0  # ONNX Reshape: 0 copies the input's dim, so the batch size may vary
        return self.op("Reshape", self.value(a), self.ints(target))

    def _p_permute(self, out: Any, a: Any, axes: Any) -> str:
        return self.op("Transpose", self.value(a), perm=[int(i) for i in axes])

    def _p_expand(self, out: Any, a: Any, shape: Any) -> str:
        src = (1,) * (len(shape) - np.ndim(a)) + tuple(np.shape(a))
        # A dim the input already has is given as 1 (ONNX Expand broadcasts both ways): batch-size free.
        target = [1 if s == t else t for s, t in zip(src, shape)]
        return self.op("Expand", self.value(a), self.ints(target))

    def _p_slice(self, out: Any, a: Any, index: tuple) -> str:
        starts, ends, axes, steps = [], [], [], []
        shape = np.shape(a)
        for axis, s in enumerate(index):
            if not isinstance(s, slice):
                raise self.fail(f"slice index {s!r} is not a slice")
            start, stop, step = s.indices(shape[axis])
            if (start, stop, step) == (0, shape[axis], 1):
                continue
            if step < 0 and stop < 0:
                stop = -sys.maxsize  # through index 0
            starts.append(start)
            ends.append(stop)
            axes.append(axis)
            steps.append(step)
        if not axes:
            return self.op("Identity", self.value(a))
        return self.op("Slice", self.value(a), self.ints(starts), self.ints(ends), self.ints(axes),
                       self.ints(steps))

    def _p_flip(self, out: Any, a: Any, axes: Any) -> str:
        axes = [int(x) for x in axes]
        n = len(axes)
        return self.op("Slice", self.value(a), self.ints([-1] * n), self.ints([-sys.maxsize] * n),
                       self.ints(axes), self.ints([-1] * n))

    def _p_pad(self, out: Any, a: Any, widths: Any, value: float) -> str:
        begins = [int(w[0]) for w in widths]
        ends = [int(w[1]) for w in widths]
        return self.op("Pad", self.value(a), self.ints(begins + ends),
                       self.const(np.asarray(value, dtype=out.dtype)), mode="constant")

    def _p_concatenate(self, out: Any, arrays: Any, axis: int) -> str:
        return self.op("Concat", *[self.value(x) for x in arrays], axis=int(axis))

    def _p_contiguous(self, out: Any, a: Any) -> str:
        return self.op("Identity", self.value(a))

    _p_native = _p_contiguous

    def _p_assign(self, out: Any, dst: Any, src: Any) -> str:
        raise self.fail("an in-place write (assign, e.g. x[i] = v or an inplace=True op) in forward has no "
                        "ONNX form here; write the forward out of place (torch.cat, torch.where)")

    def _p_matmul(self, out: Any, a: Any, b: Any) -> str:
        return self.op("MatMul", self.value(a), self.value(b))

    def _p_argsort(self, out: Any, a: Any, axis: int, descending: bool) -> str:
        raise self.fail("argsort/sort is not exported (ONNX TopK differs on ties); it has no ONNX form here")

    def _p_gather(self, out: Any, a: Any, axis: int, index: Any) -> str:
        return self.op("GatherElements", self.value(a), self.value(index), axis=int(axis))

    def _p_scatter(self, out: Any, a: Any, axis: int, index: Any, src: Any) -> str:
        return self.op("ScatterElements", self.value(a), self.value(index), self.operand(src, out),
                       axis=int(axis))

    def _p_scatter_add(self, out: Any, a: Any, axis: int, index: Any, src: Any) -> str:
        return self.op("ScatterElements", self.value(a), self.value(index), self.operand(src, out),
                       axis=int(axis), reduction="add")

    def _constant_out(self, out: Any, *args: Any, **kwargs: Any) -> str:
        return self.const(np.asarray(out))

    _p_full = _p_arange = _p_from_host = _constant_out

    def _random(self, out: Any, *args: Any, **kwargs: Any) -> str:
        raise self.fail("draws random numbers in forward (a training-mode op?); export runs the model in "
                        "eval() mode, and a module that samples in eval has no deterministic ONNX form")

    _p_uniform = _p_normal = _p_randint = _random


@contextmanager
def recording(backend: Backend, rec: Recorder) -> Iterator[None]:
    """Wrap ``backend``'s primitives so each top-level call is recorded by ``rec``; restored on exit."""
    saved: dict[str, Any] = {}
    missing = object()

    def wrap(prim: str, fn: Callable) -> Callable:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if rec.depth or not rec.recording:
                return fn(*args, **kwargs)
            rec.depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                rec.depth -= 1
            rec.record(prim, args, kwargs, out)
            return out
        return recorded

    def host_read(fn: Callable) -> Callable:
        def read(*args: Any, **kwargs: Any) -> Any:
            if rec.recording and not rec.depth:
                rec.host_reads.add(rec.where())
            return fn(*args, **kwargs)
        return read

    try:
        saved["to_host"] = backend.__dict__.get("to_host", missing)
        backend.__dict__["to_host"] = host_read(backend.to_host)
        for prim in list(_UNARY) + list(_BINARY) + list(_OTHER):
            saved[prim] = backend.__dict__.get(prim, missing)
            backend.__dict__[prim] = wrap(prim, getattr(backend, prim))
        for cap in _GENERIC:
            saved[cap] = backend.__dict__.get(cap, missing)
            backend.__dict__[cap] = getattr(Backend, cap).__get__(backend)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                backend.__dict__.pop(name, None)
            else:
                backend.__dict__[name] = value

