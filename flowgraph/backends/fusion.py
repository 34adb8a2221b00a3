"""Backend-agnostic elementwise fusion: a lazy expression graph, its structural key, and a C emitter.

An accelerated backend (OpenCL now, CUDA later) does not run an elementwise primitive at once. It returns
a *lazy* array whose ``lazy`` attribute is an :class:`Expr` (an op applied to inputs), and only compiles and
runs the whole chain when something needs a real buffer: a reduction, matmul, a movement op, a host read,
or the size caps below. The chain then becomes one kernel.

This module holds everything about that which does not depend on the device API:

* :class:`Expr` / :class:`Scalar` - the graph. Inputs of an ``Expr`` are arrays (realized ones are the
  *leaves*; lazy ones carry their own ``Expr``) or scalars. Every array input has the node's shape already
  (a backend broadcasts realized inputs as zero-stride views and realizes lazy inputs of another shape), so
  every leaf of a tree has the root's shape and is addressed by its own strides.
* :func:`linearize` - a tree into a :class:`FusedProgram`: leaves and scalars in order, instructions in
  topological order, and a *structural key* (ops, dtypes, sharing) that never contains values or sizes, so
  one compiled kernel serves every shape and every scalar value.
* :class:`CEmitter` - turns a program into C-like statements. It holds the op templates shared by OpenCL C
  and CUDA C; a device emitter subclass names the C types and the few functions that differ.
* :func:`result_dtype` - the NumPy result dtype of every elementwise primitive, so fused backends agree with
  the NumPy backend.
* :func:`set_enabled` - turn fusion off (each op realizes at once) for debugging.

The arrays themselves are opaque here: the only attributes read are ``lazy``, ``dtype`` and ``shape``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, ShapeError

#: A fused tree is realized before it grows past this many op nodes ...
MAX_NODES = 32
#: ... or reads more than this many leaf arrays (kernel argument lists stay short).
MAX_LEAVES = 8
#: A fused kernel writes at most this many interior values of its tree besides the root (values needed again
#: later: ``lazy.extra_outputs``); any further ones are recomputed by whatever reads them.
MAX_OUTPUTS = 8

_ENABLED = [True]


def set_enabled(enabled: bool) -> None:
    """Turn elementwise fusion on (default) or off; off, every elementwise primitive runs at once.

    >>> from flowgraph.backends import fusion
    >>> fusion.set_enabled(False)   # debug: one kernel per primitive
    >>> fusion.set_enabled(True)
    """
    _ENABLED[0] = bool(enabled)


def is_enabled() -> bool:
    """Whether elementwise fusion is on."""
    return _ENABLED[0]


class Scalar:
    """A Python scalar operand, already converted to the dtype it is computed in.

    Its value is a kernel argument, never part of the kernel source or the structural key.
    """

    __slots__ = ("value", "dtype")

    def __init__(self, value: Any, dtype: np.dtype):
        self.dtype = np.dtype(dtype)
        self.value = np.array(value).astype(self.dtype)[()]

    def __repr__(self) -> str:
        return f"Scalar({self.value!r}, {self.dtype})"


#: The leaf ids of a tree that reads no array (scalars only, before its inputs are added).
_NO_IDS: frozenset = frozenset()


class Expr:
    """One pending elementwise op: ``op`` applied to ``inputs`` (arrays or :class:`Scalar`), giving ``dtype``.

    ``leaves`` is the number of distinct realized arrays the tree reads (``leaf_ids``: the set of their ids);
    ``nodes`` an upper bound of its op nodes (shared subtrees counted twice), exact where ``path`` (no node of
    the tree has two pending inputs, so nothing in it is shared: a chain of ops on one running value).
    Backends compare them with :data:`MAX_LEAVES` / :data:`MAX_NODES` (``too_big``) to decide when to realize
    (an input realized after the tree was built reads as its own leaves). ``keep``: the value is needed again
    later (autograd saved it), so the kernel that computes it inside a larger tree also writes it
    out (``lazy.extra_outputs``) instead of leaving it to be recomputed.
    """

    __slots__ = ("op", "inputs", "dtype", "nodes", "leaf_ids", "path", "keep", "_node_ids")

    def __init__(self, op: str, inputs: Sequence[Any], dtype: np.dtype):
        self.op = op
        self.inputs = inputs = tuple(inputs)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        nodes = 1
        ids: frozenset = _NO_IDS
        path = True
        pending = None
        for x in inputs:
            if type(x) is Scalar:
                continue
            sub = x.lazy
            if sub is None:
                ids = ids | {id(x)}
            else:
                nodes += sub.nodes
                path = path and sub.path and pending is None
                pending = sub
                ids = ids | sub.leaf_ids if ids else sub.leaf_ids
        self.nodes = nodes
        self.path = path
        self.leaf_ids = ids
        self.keep = False
        self._node_ids: frozenset | None = None

    @classmethod
    def over(cls, op: str, a: Any, b: Any, dtype: np.dtype) -> Expr:
        """``Expr(op, (a, b), dtype)`` for array inputs only (``b`` None for a unary op; no :class:`Scalar`) and
        a ``np.dtype``: the constructor of the lazy engine's commonest nodes, ``__init__``'s loop unrolled."""
        self = cls.__new__(cls)
        self.op = op
        self.dtype = dtype
        self.keep = False
        self._node_ids = None
        la = a.lazy
        if b is None:
            self.inputs = (a,)
            if la is None:
                self.nodes, self.path, self.leaf_ids = 1, True, frozenset((id(a),))
            else:
                self.nodes, self.path, self.leaf_ids = la.nodes + 1, la.path, la.leaf_ids
            return self
        self.inputs = (a, b)
        lb = b.lazy
        if la is None:
            if lb is None:
                self.nodes, self.path, self.leaf_ids = 1, True, frozenset((id(a), id(b)))
            else:
                self.nodes, self.path, self.leaf_ids = lb.nodes + 1, lb.path, lb.leaf_ids | {id(a)}
        elif lb is None:
            self.nodes, self.path, self.leaf_ids = la.nodes + 1, la.path, la.leaf_ids | {id(b)}
        else:  # two pending inputs (or one given twice): not a path
            self.nodes, self.path, self.leaf_ids = la.nodes + lb.nodes + 1, False, la.leaf_ids | lb.leaf_ids
        return self

    @property
    def leaves(self) -> int:
        """How many distinct realized arrays the tree reads."""
        return len(self.leaf_ids)

    def too_big(self) -> bool:
        """Whether this tree passed the fusion caps and should be realized.

        The leaf count is exact, and so is the node count of a ``path``. Otherwise the node count is an upper
        bound that decides most calls; only when it passes the cap are the distinct nodes counted (shared
        subtrees once) and the exact figure replaces the bound. The count is built from each input's own cached
        set, so a tree is never walked again for every op added on top (backward graphs share subtrees heavily:
        the walk was the top of the backward profile).
        """
        if len(self.leaf_ids) > MAX_LEAVES:
            return True
        if self.nodes <= MAX_NODES:
            return False
        if self.path:
            return True
        self.nodes = len(self._distinct()) + 1
        return self.nodes > MAX_NODES

    def _distinct(self) -> frozenset:
        """Ids of the distinct lazy arrays under this node, cached (an input realized later stays counted as a
        node: the figure can only be high, never low)."""
        found = self._node_ids
        if found is None:
            nodes: set[int] = set()
            for x in self.inputs:
                if type(x) is Scalar:
                    continue
                sub = x.lazy
                if sub is not None and id(x) not in nodes:
                    nodes.add(id(x))
                    nodes.update(sub._distinct())
            found = self._node_ids = frozenset(nodes)
        return found

    def __repr__(self) -> str:
        return f"Expr({self.op}, {len(self.inputs)} inputs, {self.dtype}, nodes={self.nodes})"


# A reference inside a program: ("l", i) leaf i, ("s", i) scalar i, ("v", i) the value of instruction i.
Ref = tuple[str, int]


class FusedProgram:
    """A linearized expression: what a device emitter needs to write one kernel.

    ``leaves`` are the realized arrays read (deduplicated by identity), ``scalars`` the scalar operands,
    ``instrs`` ``(op, dtype, refs)`` in evaluation order, ``result`` the reference holding the value, and
    ``key`` the structural key (hashable; no sizes, strides or values).
    """

    __slots__ = ("leaves", "scalars", "instrs", "result", "key")

    def __init__(
        self,
        leaves: list[Any],
        scalars: list[Scalar],
        instrs: list[tuple[str, np.dtype, tuple[Ref, ...]]],
        result: Ref,
    ):
        self.leaves = leaves
        self.scalars = scalars
        self.instrs = instrs
        self.result = result
        self.key = (
            tuple((op, dt.str, refs) for op, dt, refs in instrs),
            tuple(leaf.dtype.str for leaf in leaves),
            tuple(s.dtype.str for s in scalars),
            result,
        )

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the program's result."""
        return self.ref_dtype(self.result)

    def ref_dtype(self, ref: Ref) -> np.dtype:
        """The dtype of one reference."""
        kind, i = ref
        if kind == "l":
            return self.leaves[i].dtype
        if kind == "s":
            return self.scalars[i].dtype
        return self.instrs[i][1]

    def dtypes(self) -> set[np.dtype]:
        """Every dtype that appears in the program (for device extension pragmas)."""
        found = {leaf.dtype for leaf in self.leaves} | {s.dtype for s in self.scalars}
        return found | {dt for _, dt, _ in self.instrs}

    def emit(
        self, emitter: CEmitter, load: Callable[[int], str], scalar_name: Callable[[int], str]
    ) -> tuple[list[str], str]:
        """C statements computing the result and the C expression naming it.

        ``load(i)`` is the C expression reading leaf ``i`` at the current element; ``scalar_name(i)`` the
        kernel parameter holding scalar ``i``.
        """
        lines: list[str] = []
        names: dict[Ref, str] = {}
        for i, leaf in enumerate(self.leaves):
            names[("l", i)] = f"l{i}"
            lines.append(f"{emitter.ctype(leaf.dtype)} l{i} = {load(i)};")
        for i in range(len(self.scalars)):
            names[("s", i)] = scalar_name(i)
        for k, (op, dtype, refs) in enumerate(self.instrs):
            operands = [(names[r], self.ref_dtype(r)) for r in refs]
            lines.append(f"{emitter.ctype(dtype)} v{k} = {emitter.apply(op, operands, dtype)};")
            names[("v", k)] = f"v{k}"
        return lines, names[self.result]


def linearize(root: Any) -> FusedProgram:
    """Flatten the lazy tree under ``root`` (an array or a :class:`Scalar`) into a :class:`FusedProgram`.

    A realized array (``lazy is None``) is a leaf; shared subtrees and repeated leaves are emitted once.
    """
    leaves: list[Any] = []
    leaf_refs: dict[int, Ref] = {}
    scalars: list[Scalar] = []
    instrs: list[tuple[str, np.dtype, tuple[Ref, ...]]] = []
    memo: dict[int, Ref] = {}

    def visit(x: Any) -> Ref:
        if isinstance(x, Scalar):
            scalars.append(x)
            return ("s", len(scalars) - 1)
        expr = x.lazy
        if expr is None:
            ref = leaf_refs.get(id(x))
            if ref is None:
                leaves.append(x)
                ref = leaf_refs[id(x)] = ("l", len(leaves) - 1)
            return ref
        ref = memo.get(id(x))
        if ref is None:
            refs = tuple(visit(i) for i in expr.inputs)
            instrs.append((expr.op, expr.dtype, refs))
            ref = memo[id(x)] = ("v", len(instrs) - 1)
        return ref

    try:
        result = visit(root)
    finally:
        visit = None  # a self-calling closure is a reference cycle that would keep the tree's arrays alive until gc
    return FusedProgram(leaves, scalars, instrs, result)


def leaves_of(root: Any) -> list[Any]:
    """The realized arrays a lazy tree reads (empty for a realized array or a scalar)."""
    if isinstance(root, Scalar) or root.lazy is None:
        return []
    return linearize(root).leaves


# ----------------------------------------------------------------------------------------- dtype rules
_NUMPY_UFUNCS: dict[str, str] = {
    "neg": "negative",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "sin": "sin",
    "cos": "cos",
    "tanh": "tanh",
    "erf": "sin",
    "gelu": "sin",
    "gelu_grad": "sin",
    "abs": "abs",
    "sign": "sign",
    "reciprocal": "reciprocal",
    "log1p": "log1p",
    "expm1": "expm1",
    "floor": "floor",
    "ceil": "ceil",
    "round": "rint",
    "logical_not": "logical_not",
    "isnan": "isnan",
    "isinf": "isinf",
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "div": "true_divide",
    "pow": "power",
    "maximum": "maximum",
    "minimum": "minimum",
    "floor_divide": "floor_divide",
    "remainder": "remainder",
    "atan2": "arctan2",
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "logical_xor": "logical_xor",
}
#: Ops whose result is bool whatever the input (computed in the input dtype).
BOOL_RESULT_OPS = frozenset(
    {
        "logical_not",
        "isnan",
        "isinf",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_xor",
    }
)
_RESULT_DTYPES: dict[tuple[str, np.dtype], np.dtype] = {}


def result_dtype(op: str, dtype: np.dtype) -> np.dtype:
    """The dtype NumPy gives ``op`` on arrays of ``dtype`` (both operands ``dtype`` for binary ops).

    Raises BackendError where NumPy refuses the combination (e.g. ``sub`` on bool).
    """
    key = (op, dtype)
    found = _RESULT_DTYPES.get(key)
    if found is None:
        name = _NUMPY_UFUNCS.get(op)
        if name is None:
            raise BackendError(f"unknown elementwise op {op!r}; expected one of {sorted(_NUMPY_UFUNCS)}")
        ufunc = getattr(np, name)
        probe = np.zeros(1, dtype=dtype)
        try:
            with np.errstate(all="ignore"):
                out = ufunc(*([probe] * ufunc.nin))
        except TypeError as exc:
            raise BackendError(f"elementwise {op!r} is not defined for {dtype} arrays (NumPy: {exc})") from exc
        found = _RESULT_DTYPES[key] = out.dtype
    return found


# ----------------------------------------------------------------------------------------- C emitter
_FLOAT_UNARY: dict[str, str] = {
    "neg": "(-{x})",
    "exp": "exp({x})",
    "log": "log({x})",
    "sqrt": "sqrt({x})",
    "sin": "sin({x})",
    "cos": "cos({x})",
    "tanh": "tanh({x})",
    "erf": "erf({x})",
    # exact GELU, x * cdf(x), and its derivative cdf(x) + x * pdf(x) (PyTorch's formulas): one instruction each,
    # so a GELU is one lazy node forward and two backward (a multiply by g), not five and seven
    "gelu": "({x} * ({T})0.5 * (({T})1 + erf({x} * ({T})0.70710678118654752440)))",
    "gelu_grad": "(({T})0.5 * (({T})1 + erf({x} * ({T})0.70710678118654752440))"
                 " + {x} * exp({x} * {x} * ({T})-0.5) * ({T})0.39894228040143267794)",
    "abs": "fabs({x})",
    "sign": "(isnan({x}) ? {x} : ({T})(({x} > 0) - ({x} < 0)))",
    "reciprocal": "(({T})1 / {x})",
    "log1p": "log1p({x})",
    "expm1": "expm1({x})",
    "floor": "floor({x})",
    "ceil": "ceil({x})",
    "round": "rint({x})",
    "copy": "{x}",
    "cast": "{x}",
}
_INT_UNARY: dict[str, str] = {
    "neg": "(({T})-{x})",
    "abs": "({x} < 0 ? ({T})-{x} : {x})",
    "sign": "({T})(({x} > 0) - ({x} < 0))",
    "reciprocal": "({x} == 0 ? ({T})0 : ({T})(1 / {x}))",
    "floor": "{x}",
    "ceil": "{x}",
    "round": "{x}",
    "copy": "{x}",
    "cast": "{x}",
}
_BOOL_UNARY: dict[str, str] = {
    "logical_not": "({B})({x} == 0)",
}
_FLOAT_BINARY: dict[str, str] = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "div": "({a} / {b})",
    "pow": "pow({a}, {b})",
    "maximum": "(({a} > {b} || isnan({a})) ? {a} : {b})",
    "minimum": "(({a} < {b} || isnan({a})) ? {a} : {b})",
    "floor_divide": "fg_floordiv_{t}({a}, {b})",
    "remainder": "fg_remainder_{t}({a}, {b})",
    "atan2": "atan2({a}, {b})",
}
_INT_BINARY: dict[str, str] = {
    "add": "({T})({a} + {b})",
    "sub": "({T})({a} - {b})",
    "mul": "({T})({a} * {b})",
    "div": "({T})({b} == 0 ? 0 : {a} / {b})",
    "pow": "fg_ipow_{t}({a}, {b})",
    "maximum": "({a} > {b} ? {a} : {b})",
    "minimum": "({a} < {b} ? {a} : {b})",
    "floor_divide": "fg_floordiv_{t}({a}, {b})",
    "remainder": "fg_remainder_{t}({a}, {b})",
}
_BOOL_BINARY: dict[str, str] = {
    "add": "({a} | {b})",
    "mul": "({a} & {b})",
    "maximum": "({a} | {b})",
    "minimum": "({a} & {b})",
}
#: Instructions of more than two float operands, written by the lazy engine's normalization composites only (one
#: pending node where the same arithmetic as separate ops was three to five, each with its node, array, hazard
#: registration and broadcast checks: the host work of an eager step; ``LazyEngine.batch_norm``). The C
#: expressions associate as the separate ops did.
_FLOAT_NARY: dict[str, str] = {
    # ``(x - mean) * scale``, then ``+ bias``: batch norm's output
    "norm_scale": "(({0} - {1}) * {2})",
    "norm_affine": "((({0} - {1}) * {2}) + {3})",
    # ``g * a + (x - mean) * b + k``: batch norm's input gradient from its per-channel coefficients
    "norm_input_grad": "((({0} * {1}) + (({2} - {3}) * {4})) + {5})",
}
_COMPARE: dict[str, str] = {
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
}
_LOGICAL: dict[str, str] = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}


class CEmitter:
    """Op templates shared by the C dialects (OpenCL C, CUDA C); a subclass names the types.

    ``apply(op, operands, dtype)`` returns a C expression for one instruction. Operands are cast to the
    dtype the op computes in (the result dtype, or the common input dtype for ops with a bool result).
    Helper functions an expression calls (integer power, NumPy's floor division and remainder) are
    collected in ``helpers`` and written by :meth:`helper_source`.
    """

    #: numpy dtype -> C type name; a subclass fills this for its dialect.
    CTYPES: dict[np.dtype, str] = {}
    #: qualifier put before helper functions (``""`` in OpenCL C, ``"__device__"`` in CUDA).
    FUNCTION_QUALIFIER = ""

    def __init__(self) -> None:
        self.helpers: dict[str, str] = {}

    # ---------------------------------------------------------------- types
    def ctype(self, dtype: np.dtype) -> str:
        """The C type that stores ``dtype`` (bool is stored as an unsigned char)."""
        try:
            return self.CTYPES[np.dtype(dtype)]
        except KeyError:
            raise BackendError(
                f"dtype {np.dtype(dtype)} has no C type in {type(self).__name__}; supported: "
                f"{sorted(str(d) for d in self.CTYPES)}"
            ) from None

    def convert(self, x: str, src: np.dtype, dst: np.dtype) -> str:
        """``x`` of ``src`` as a ``dst`` value (bool: nonzero test)."""
        if src == dst:
            return x
        if dst.kind == "b":
            return f"({self.ctype(dst)})({x} != 0)"
        return f"({self.ctype(dst)})({x})"

    # ---------------------------------------------------------------- expressions
    def apply(self, op: str, operands: list[tuple[str, np.dtype]], dtype: np.dtype) -> str:
        """C expression of ``op`` on ``operands`` ((expression, dtype) pairs) with result ``dtype``."""
        if op == "where":
            (c, _), (a, at), (b, bt) = operands
            return f"({c} ? {self.convert(a, at, dtype)} : {self.convert(b, bt, dtype)})"
        if op in BOOL_RESULT_OPS:
            compute = operands[0][1]
        else:
            compute = dtype
        args = [self.convert(x, dt, compute) for x, dt in operands]
        if op in ("cast", "copy"):
            return args[0]
        template = _FLOAT_NARY.get(op)
        if template is not None:
            arity = template.count("{")
            if compute.kind != "f" or len(args) != arity:
                raise BackendError(f"elementwise {op!r} takes {arity} float operands, got {len(args)} of {compute}")
            return template.format(*args)
        if len(args) == 1:
            return self._unary(op, args[0], compute)
        return self._binary(op, args[0], args[1], compute)

    def _fill(self, template: str, dtype: np.dtype, **names: str) -> str:
        ctype = self.ctype(dtype)
        return template.format(T=ctype, t=ctype.replace(" ", "_"), B=self.ctype(np.dtype(bool)), **names)

    def _unary(self, op: str, x: str, dtype: np.dtype) -> str:
        bool_t = self.ctype(np.dtype(bool))
        if op == "isnan":
            return f"({bool_t})isnan({x})" if dtype.kind == "f" else f"({bool_t})0"
        if op == "isinf":
            return f"({bool_t})isinf({x})" if dtype.kind == "f" else f"({bool_t})0"
        if op in _BOOL_UNARY:
            return self._fill(_BOOL_UNARY[op], dtype, x=x)
        table = _FLOAT_UNARY if dtype.kind == "f" else _INT_UNARY
        if dtype.kind == "u" and op in ("abs", "neg", "sign"):
            table = {"abs": "{x}", "neg": "(({T})-{x})", "sign": "({T})({x} > 0)"}
        template = table.get(op)
        if template is None:
            raise BackendError(f"elementwise {op!r} is not defined for {dtype} in {type(self).__name__}")
        return self._fill(template, dtype, x=x)

    def _binary(self, op: str, a: str, b: str, dtype: np.dtype) -> str:
        bool_t = self.ctype(np.dtype(bool))
        if op in _COMPARE:
            return f"({bool_t})({a} {_COMPARE[op]} {b})"
        if op in _LOGICAL:
            return f"({bool_t})(({a} != 0) {_LOGICAL[op]} ({b} != 0))"
        if dtype.kind == "b":
            template = _BOOL_BINARY.get(op)
        elif dtype.kind == "f":
            template = _FLOAT_BINARY.get(op)
        else:
            template = _INT_BINARY.get(op)
        if template is None:
            raise BackendError(f"elementwise {op!r} is not defined for {dtype} in {type(self).__name__}")
        if "fg_" in template:
            self._need_helper(op, dtype)
        return self._fill(template, dtype, a=a, b=b)

    # ---------------------------------------------------------------- helper functions
    def _need_helper(self, op: str, dtype: np.dtype) -> None:
        ctype = self.ctype(dtype)
        t = ctype.replace(" ", "_")
        q = self.FUNCTION_QUALIFIER
        name = f"{op}_{t}"
        if name in self.helpers:
            return
        signed = dtype.kind == "i"
        if op == "pow":
            negative = (
                f"  if (b < 0) return (a == 1) ? ({ctype})1 : "
                f"((a == -1) ? ((b & 1) ? ({ctype})-1 : ({ctype})1) : ({ctype})0);\n"
                if signed
                else ""
            )
            body = (
                f"{q} {ctype} fg_ipow_{t}({ctype} a, {ctype} b) {{\n{negative}"
                f"  {ctype} r = 1;\n  while (b) {{ if (b & 1) r *= a; a *= a; b >>= 1; }}\n  return r;\n}}\n"
            )
        elif op == "floor_divide" and dtype.kind == "f":
            body = (
                f"{q} {ctype} fg_floordiv_{t}({ctype} a, {ctype} b) {{\n"
                f"  if (b == 0) return a / b;\n"
                f"  {ctype} mod = fmod(a, b);\n  {ctype} div = (a - mod) / b;\n"
                f"  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;\n"
                f"  if (div == 0) return copysign(({ctype})0, a / b);\n"
                f"  {ctype} fl = floor(div);\n  if (div - fl > ({ctype})0.5) fl += 1;\n  return fl;\n}}\n"
            )
        elif op == "remainder" and dtype.kind == "f":
            body = (
                f"{q} {ctype} fg_remainder_{t}({ctype} a, {ctype} b) {{\n"
                f"  {ctype} mod = fmod(a, b);\n  if (b == 0) return mod;\n"
                f"  if (mod != 0) {{ if ((b < 0) != (mod < 0)) mod += b; }}\n"
                f"  else mod = copysign(({ctype})0, b);\n  return mod;\n}}\n"
            )
        elif op == "floor_divide":
            guard = f"  if (b == -1) return ({ctype})-a;\n" if signed else ""
            adjust = "  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;\n" if signed else ""
            body = (
                f"{q} {ctype} fg_floordiv_{t}({ctype} a, {ctype} b) {{\n  if (b == 0) return 0;\n{guard}"
                f"  {ctype} q = a / b;\n{adjust}  return q;\n}}\n"
            )
        else:  # integer remainder
            guard = "  if (b == -1) return 0;\n" if signed else ""
            adjust = "  if (r != 0 && ((r < 0) != (b < 0))) r += b;\n" if signed else ""
            body = (
                f"{q} {ctype} fg_remainder_{t}({ctype} a, {ctype} b) {{\n  if (b == 0) return 0;\n{guard}"
                f"  {ctype} r = a % b;\n{adjust}  return r;\n}}\n"
            )
        self.helpers[name] = body

    def helper_source(self) -> str:
        """The helper functions the emitted expressions call, in first-use order."""
        return "".join(self.helpers.values())


# ------------------------------------------------------------------ optimizer update kernels (C dialects)
class UpdateKernel:
    """A fused optimizer update written once in dialect-neutral C, for every accelerated backend.

    Per element the kernel reads ``g``, ``p`` and the ``state`` buffers as values of type ``T`` (the
    parameter's float type), runs ``statements`` (which assign ``p`` and the state names) and writes
    ``p`` and the state back. ``step_scalars`` are host numbers or, inside ``fg.capture``, float32 device
    scalars the kernel reads (so a replayed graph sees each step's values); ``scalars`` are host numbers.
    A backend supplies the loads, stores and signature in its own dialect.
    """

    def __init__(self, name: str, state: tuple[str, ...], step_scalars: tuple[str, ...],
                 scalars: tuple[str, ...], statements: str) -> None:
        self.name, self.state, self.step_scalars, self.scalars = name, state, step_scalars, scalars
        self.statements = statements.strip()


#: Adam/AdamW: ``c1``/``c2`` are ``1 - beta`` rounded once from the Python floats (as the tensor-op path
#: and PyTorch round them), ``sign`` is -1 with ``maximize``, ``decay`` is AdamW's ``1 - lr * wd``.
ADAM_UPDATE = UpdateKernel("adam", ("m", "v"), ("SS", "EH"), ("b1", "c1", "b2", "c2", "l2", "decay", "sign"), """
T gg = sign * g + l2 * p;
m = b1 * m + c1 * gg;
v = b2 * v + c2 * gg * gg;
p = p * decay - SS * m / (sqrt(v) + EH);
""")

#: SGD with momentum (``damp1`` is ``1 - dampening``, ``nest`` 1 for Nesterov momentum, else 0).
SGD_UPDATE = UpdateKernel("sgd", ("buf",), ("LR",), ("mom", "damp1", "wd", "sign", "nest"), """
T gg = sign * g + wd * p;
T b = mom * buf + damp1 * gg;
buf = b;
p = p - LR * (nest != 0 ? gg + mom * b : b);
""")


def adam_update_scalars(beta1: float, beta2: float, l2: float, decay: float, maximize: bool) -> tuple:
    """``ADAM_UPDATE.scalars`` from ``adam_step``'s arguments."""
    return beta1, 1.0 - beta1, beta2, 1.0 - beta2, l2, decay, -1.0 if maximize else 1.0


def sgd_update_scalars(momentum: float, dampening: float, weight_decay: float, nesterov: bool,
                       maximize: bool) -> tuple:
    """``SGD_UPDATE.scalars`` from ``sgd_step``'s arguments."""
    return momentum, 1.0 - dampening, weight_decay, -1.0 if maximize else 1.0, 1.0 if nesterov else 0.0


def is_host_scalar(x: Any) -> bool:
    """A Python/NumPy number (as opposed to a device array holding a step scalar inside ``fg.capture``)."""
    return isinstance(x, (int, float, np.generic))


# ------------------------------------------------------------------ strided indexing (C dialects)
def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], tuple]:
    """Drop size-1 axes and merge neighbours that are contiguous in every operand.

    ``strides`` holds one stride tuple per operand (in elements). Returns the reduced shape and strides;
    a C-contiguous elementwise op becomes rank 1, a 0-d or single-element one rank 0. Memoised: every
    kernel launch of the device backends asks, and a training step asks the same few layouts again.
    """
    return _collapse(tuple(shape), tuple(strides))


#: Entries each layout memo (:func:`collapse`, :func:`reduction_layout`) keeps.
LAYOUT_MEMO = 8192


@functools.lru_cache(maxsize=LAYOUT_MEMO)
def _collapse(shape: tuple[int, ...], strides: tuple[tuple[int, ...], ...]) -> tuple:
    out_shape: list[int] = []
    out_strides: list[list[int]] = []
    for axis, n in enumerate(shape):
        if n == 1:
            continue
        column = [s[axis] for s in strides]
        if out_shape and all(prev == cur * n for prev, cur in zip(out_strides[-1], column)):
            out_shape[-1] *= n
            out_strides[-1] = column
        else:
            out_shape.append(n)
            out_strides.append(column)
    per_operand = tuple(tuple(col[k] for col in out_strides) for k in range(len(strides)))
    return tuple(out_shape), per_operand


def matmul_dims(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
    """``(m, k, n, batch)`` of ``a @ b`` for operands of at least 2 axes (a vector already given its unit axis);
    raises ShapeError naming both shapes when the inner dimensions differ or the batch axes do not broadcast."""
    (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
    if k != k2:
        raise ShapeError(f"matmul: inner dimensions differ: {a_shape} @ {b_shape} ({k} != {k2})")
    if len(a_shape) == 2 and len(b_shape) == 2:
        return m, k, n, ()
    try:
        return m, k, n, tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions of {a_shape} and {b_shape} do not broadcast") from None


def accumulate_dims(dst: Any, a: Any, b: Any) -> tuple[int, int, int] | None:
    """``(m, k, n)`` where ``dst += a @ b`` can run as one accumulating GEMM (``Backend.matmul_accumulate``):
    ``a``, ``b`` 2-d of ``dst``'s dtype, a non-empty reduction, and ``dst`` holding ``m * n`` elements (a bias's
    ``(n,)`` takes ``(1, n)``); None otherwise. Which dtypes its GEMM takes, and whether ``dst`` is laid out
    row-major once realized, are the caller's to check."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype != dst.dtype:
        return None
    (m, k), (k2, n) = a.shape, b.shape
    size = math.prod(dst.shape)
    if k != k2 or k == 0 or size == 0 or size != m * n:
        return None
    return m, k, n


#: Elementwise launches of at least this many elements over 2 or more collapsed dims get their dims baked into
#: the kernel source (``decompose(values=...)``; one kernel per shape, on CUDA and OpenCL): BatchNorm's
#: normalise + ReLU over (128, 64, 64, 64) with per-channel operands took 177 us with the dims as arguments
#: and 129 us with them as constants on an H200 (a division by a variable is ~20 instructions per element
#: and axis).
BAKE_DIMS_MIN = 1 << 18


#: Kernels index with 32-bit ``int`` arithmetic when every index and offset they form stays at or below this
#: (:func:`index_fits_int`). 64-bit multiplies and divisions are emulated on NVIDIA GPUs: on an H200 through
#: NVIDIA's OpenCL, BatchNorm's normalise + ReLU over (128, 128, 32, 32) took 110 us with 64-bit indexing and
#: 84 us with 32-bit, a per-channel sum over (128, 512, 8, 8) 22 and 17 us.
INT_INDEX_LIMIT = 2**31 - 1


def index_fits_int(count: int, dims: Sequence[int], strides: Sequence[Sequence[int]],
                   offsets: Sequence[int] | None = None) -> bool:
    """Whether ``count`` (work-items or elements) and every operand's furthest element (its offset, when
    ``offsets`` are given, plus ``(d - 1) * |stride|`` over ``dims``) fit in :data:`INT_INDEX_LIMIT`."""
    limit = INT_INDEX_LIMIT
    if count > limit:
        return False
    spans = operand_spans(dims, strides)
    if offsets is not None:
        spans = [span + offset for span, offset in zip(spans, offsets)]
    return all(span <= limit for span in spans)


def operand_spans(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> list[int]:
    """Each operand's furthest element from its first: ``(d - 1) * |stride|`` summed over ``dims``, per stride
    tuple (the figure ``index_fits_int`` compares; a backend keeping a layout keeps these)."""
    return [sum((d - 1) * abs(s) for d, s in zip(dims, st)) for st in strides]


def decompose(index: str, dims: str, coords: str, rank: int, itype: str = "long",
              values: Sequence[int] | None = None) -> list[str]:
    """C lines splitting the linear ``index`` over ``rank`` dims ``{dims}0..`` (row-major) into ``{coords}0..``,
    declared as ``itype``. With ``values`` the dims are those literal sizes instead of the variables: a
    division by a constant compiles to a multiply and a shift, a division by a variable to a ~20-instruction
    sequence per element."""
    if rank == 0:
        return []
    if rank == 1:
        return [f"{itype} {coords}0 = {index};"]
    lines = [f"{itype} {coords}_r = {index};"]
    for axis in range(rank - 1, 0, -1):
        d = f"{dims}{axis}" if values is None else str(int(values[axis]))
        lines.append(f"{itype} {coords}{axis} = {coords}_r % {d}; {coords}_r /= {d};")
    lines.append(f"{itype} {coords}0 = {coords}_r;")
    return lines


def offset_expr(base: str, name: str, coords: str, rank: int, suffix: str = "s") -> str:
    """``base + c0*name_s0 + ...``: the element offset of operand ``name`` at coordinates ``coords``."""
    terms = [base] + [f"{coords}{i} * {name}_{suffix}{i}" for i in range(rank)]
    return " + ".join(terms)


def reduction_layout(shape: Sequence[int], axes: tuple[int, ...], strides: Sequence[Sequence[int]]) -> tuple:
    """How a reduction kernel walks its operands: ``(kept_shape, (kdims, kstrides), (rdims, rstrides))``.

    ``axes`` are the reduced axes (sorted), ``strides`` one stride tuple per operand (in elements). The kept
    and the reduced axes are collapsed separately (:func:`collapse`), so the kernel indexes each operand by
    ``len(kdims)`` output coordinates and ``len(rdims)`` reduction coordinates.
    """
    return _reduction_layout(tuple(shape), tuple(axes), tuple(strides))


@functools.lru_cache(maxsize=LAYOUT_MEMO)
def _reduction_layout(shape: tuple[int, ...], axes: tuple[int, ...], strides: tuple[tuple[int, ...], ...]) -> tuple:
    kept = [d for d in range(len(shape)) if d not in axes]
    kept_shape = tuple(shape[d] for d in kept)
    red_shape = tuple(shape[d] for d in axes)
    return (kept_shape, _collapse(kept_shape, tuple(tuple(st[d] for d in kept) for st in strides)),
            _collapse(red_shape, tuple(tuple(st[d] for d in axes) for st in strides)))


#: ``cupy.ReductionKernel`` gives each output element one thread block: below this many outputs a long
#: reduction leaves most of the GPU idle (BatchNorm2d's per-channel sums over (N, H, W) made its forward
#: 12x slower fused than unfused), so :func:`split_reduction` moves reduced axes to the outputs of a first
#: stage whose partial sums a second, small reduction adds up.
MIN_REDUCTION_BLOCKS = 2048
#: Reductions shorter than this per output are left in one stage (BatchNorm2d(256) on 128x256x16x16,
#: 256 sums of 32,768, took 1.0-2.0 ms in one stage on an H200).
MIN_SPLIT_LENGTH = 4096


def split_reduction(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """The reduced axes (outermost first) to keep as outputs of a first fused stage; ``()`` for one stage.

    >>> split_reduction((128, 64, 64, 64), (0, 2, 3))   # BatchNorm2d: 64 sums of 524,288 elements
    (0,)
    >>> split_reduction((256, 1024), (1,))               # LayerNorm rows: 256 sums of 1,024, one stage
    ()
    """
    outputs = math.prod(n for i, n in enumerate(shape) if i not in axes)
    length = math.prod(shape[i] for i in axes)
    kept: list[int] = []
    for ax in axes[:-1]:  # the innermost reduced axis always stays reduced in the first stage
        if outputs >= MIN_REDUCTION_BLOCKS or length < MIN_SPLIT_LENGTH:
            break
        if shape[ax] == 1:
            continue
        kept.append(ax)
        outputs *= shape[ax]
        length //= shape[ax]
    return tuple(kept)
