"""OpenCL C source generators: elementwise (fused), reductions, line scans, gather/scatter, matmul, random.

Every generator returns a :class:`KernelSource` (the source text plus the argument dtypes pyopencl needs
to pack scalar arguments). Shapes, strides and offsets are never written into source: a kernel takes
``rank`` dimension sizes and, per operand, an offset and ``rank`` strides as ``long`` arguments, so one
program serves every shape of that rank. Callers first merge dimensions that are contiguous in every
operand (:func:`collapse`), so most calls use rank 0-2 kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import BackendError
from ..fusion import CEmitter, FusedProgram, UpdateKernel, collapse, decompose, offset_expr  # noqa: F401
from ..row_kernels import MAX_GROUP, RowKernel, render

LONG = np.dtype(np.int64)
INT = np.dtype(np.int32)
BOOL = np.dtype(bool)


class OpenCLEmitter(CEmitter):
    """The OpenCL C dialect of the shared C emitter: type names and extension pragmas."""

    CTYPES = {
        np.dtype(bool): "uchar",
        np.dtype(np.int8): "char",
        np.dtype(np.uint8): "uchar",
        np.dtype(np.int16): "short",
        np.dtype(np.uint16): "ushort",
        np.dtype(np.int32): "int",
        np.dtype(np.uint32): "uint",
        np.dtype(np.int64): "long",
        np.dtype(np.uint64): "ulong",
        np.dtype(np.float16): "half",
        np.dtype(np.float32): "float",
        np.dtype(np.float64): "double",
    }

    @staticmethod
    def pragmas(dtypes: set[np.dtype]) -> str:
        """Extension pragmas the dtypes need (half and double arithmetic)."""
        lines = []
        if np.dtype(np.float16) in dtypes:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n")
        if np.dtype(np.float64) in dtypes:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n")
        return "".join(lines)


EMITTER_TYPES = OpenCLEmitter.CTYPES


_TYPE_NAMES = OpenCLEmitter()  # stateless use only: ctype lookups


def ctype(dtype: np.dtype) -> str:
    """OpenCL C type storing ``dtype``."""
    return _TYPE_NAMES.ctype(dtype)


class KernelSource:
    """Source text of one kernel named ``name`` and the pyopencl scalar-argument dtypes of its parameters."""

    __slots__ = ("source", "name", "arg_dtypes")

    def __init__(self, source: str, name: str, arg_dtypes: list[np.dtype | None]):
        self.source = source
        self.name = name
        self.arg_dtypes = arg_dtypes


class Params:
    """Builds a kernel parameter list and the matching pyopencl argument dtypes together."""

    def __init__(self) -> None:
        self.decls: list[str] = []
        self.dtypes: list[np.dtype | None] = []

    def long(self, *names: str) -> None:
        """``long`` scalar parameters."""
        self.index("long", *names)

    def index(self, index_type: str, *names: str) -> None:
        """Index scalar parameters of ``index_type`` (``long``, or ``int`` where every offset fits)."""
        for name in names:
            self.decls.append(f"{index_type} {name}")
            self.dtypes.append(INT if index_type == "int" else LONG)

    def scalar(self, dtype: np.dtype, name: str, c_type: str | None = None) -> None:
        """A scalar parameter of ``dtype`` (bool travels as uchar)."""
        self.decls.append(f"{c_type or ctype(dtype)} {name}")
        self.dtypes.append(np.dtype(np.uint8) if dtype.kind == "b" else np.dtype(dtype))

    def buffer(self, dtype: np.dtype, name: str, const: bool) -> None:
        """A ``__global`` pointer parameter."""
        qualifier = "const " if const else ""
        self.decls.append(f"__global {qualifier}{ctype(dtype)}* restrict {name}")
        self.dtypes.append(None)

    def local(self, c_type: str, name: str) -> None:
        """A ``__local`` pointer parameter (sized at launch with ``cl.LocalMemory``)."""
        self.decls.append(f"__local {c_type}* {name}")
        self.dtypes.append(None)

    def strided(self, dtype: np.dtype, name: str, rank: int, const: bool, suffix: str = "s",
                index_type: str = "long") -> None:
        """A buffer with its element offset and ``rank`` strides: ``name``, ``name_off``, ``name_s0``..."""
        self.buffer(dtype, name, const)
        self.index(index_type, f"{name}_off", *[f"{name}_{suffix}{i}" for i in range(rank)])

    def signature(self, name: str) -> str:
        """The kernel's declaration line."""
        return f"__kernel void {name}(" + ", ".join(self.decls) + ")"


def assemble(
    name: str, emitter: OpenCLEmitter, dtypes: set[np.dtype], params: Params, lines: Sequence[str], preamble: str = ""
) -> KernelSource:
    """One kernel's source: extension pragmas, helper functions, ``preamble``, then the kernel itself."""
    body = "".join(f"  {line}\n" for line in lines)
    source = (
        emitter.pragmas(dtypes) + emitter.helper_source() + preamble + params.signature(name) + " {\n" + body + "}\n"
    )
    return KernelSource(source, name, params.dtypes)


def strided_kernel(
    name: str,
    rank: int,
    operands: Sequence[tuple[str, np.dtype, bool]],
    params_after: Params,
    body: Sequence[str],
    emitter: OpenCLEmitter | None = None,
    extra_dtypes: set[np.dtype] | None = None,
    baked: Sequence[int] | None = None,
    index_type: str = "long",
) -> KernelSource:
    """A kernel with one work-item per element of a ``rank``-d index space.

    ``operands`` are ``(name, dtype, const)`` strided buffers; the body sees ``{name}_p``, each operand's
    element offset at the current index, and ``gid``. ``params_after`` are extra parameters appended.
    ``baked``: the dims written into the source as constants (still passed; ``fusion.BAKE_DIMS_MIN``).
    ``index_type``: ``int`` where the caller knows every index and offset fits (32-bit index arithmetic:
    ~25% faster elementwise kernels on NVIDIA's driver, which emulates 64-bit multiplies and divisions).
    """
    emitter = emitter or OpenCLEmitter()
    params = Params()
    it = index_type
    params.index(it, "n", *[f"d{i}" for i in range(rank)])
    for op_name, dtype, const in operands:
        params.strided(dtype, op_name, rank, const, index_type=it)
    params.decls += params_after.decls
    params.dtypes += params_after.dtypes
    lines = [f"{it} gid = get_global_id(0);", "if (gid >= n) return;"]
    lines += decompose("gid", "d", "c", rank, it, baked)
    lines += [f"{it} {op_name}_p = {offset_expr(f'{op_name}_off', op_name, 'c', rank)};" for op_name, _, _ in operands]
    lines += list(body)
    dtypes = {dt for _, dt, _ in operands} | (extra_dtypes or set())
    return assemble(name, emitter, dtypes, params, lines)


# ----------------------------------------------------------------------------------------- elementwise
def elementwise_source(program: FusedProgram, rank: int, out_dtype: np.dtype,
                       baked: Sequence[int] | None = None, index_type: str = "long",
                       outputs: Sequence[int] = ()) -> KernelSource:
    """One kernel evaluating a fused program into a strided output of ``out_dtype`` (``baked``, ``index_type``:
    see ``strided_kernel``); value ``outputs[j]`` of the program is also stored, in its own dtype, into the
    strided operand ``o{j}`` (after the leaves)."""
    emitter = OpenCLEmitter()
    lines, result = program.emit(emitter, lambda i: f"in{i}[in{i}_p]", lambda i: f"s{i}")
    lines.append(f"out[out_p] = {emitter.convert(result, program.dtype, out_dtype)};")
    lines += [f"o{j}[o{j}_p] = v{k};" for j, k in enumerate(outputs)]
    operands = [("out", out_dtype, False)] + [(f"in{i}", leaf.dtype, True) for i, leaf in enumerate(program.leaves)]
    operands += [(f"o{j}", program.instrs[k][1], False) for j, k in enumerate(outputs)]
    scalars = Params()
    for i, s in enumerate(program.scalars):
        scalars.scalar(s.dtype, f"s{i}")
    return strided_kernel("fg_elementwise", rank, operands, scalars, lines, emitter, program.dtypes(), baked,
                          index_type)


# ----------------------------------------------------------------------------------------- reductions
def _int_literal(value: int, dtype: np.dtype) -> str:
    if value == -(2**63):
        text = "(-9223372036854775807L - 1)"
    elif value >= 2**63:
        text = f"{value}UL"
    else:
        text = f"{value}L"
    return f"(({ctype(dtype)}){text})"


def reduce_identity(op: str, dtype: np.dtype) -> str:
    """C literal of the identity of reduction ``op`` for accumulator ``dtype``."""
    if op in ("sum", "any"):
        return f"(({ctype(dtype)})0)"
    if op in ("prod", "all"):
        return f"(({ctype(dtype)})1)"
    largest = op in ("min", "argmin")
    if dtype.kind == "f":
        return "INFINITY" if largest else "(-INFINITY)"
    if dtype.kind == "b":
        return f"(({ctype(dtype)}){1 if largest else 0})"
    info = np.iinfo(dtype)
    return _int_literal(int(info.max if largest else info.min), dtype)


def reduce_combine(op: str, dtype: np.dtype, acc: str, v: str) -> str:
    """C expression folding value ``v`` into accumulator ``acc`` for reduction ``op``."""
    if op == "sum":
        return f"({acc} + {v})"
    if op == "prod":
        return f"({acc} * {v})"
    if op == "any":
        return f"({acc} | {v})"
    if op == "all":
        return f"({acc} & {v})"
    cmp = ">" if op == "max" else "<"
    if dtype.kind == "f":
        return f"(({v} {cmp} {acc} || isnan({v})) ? {v} : {acc})"
    return f"({v} {cmp} {acc} ? {v} : {acc})"


def _arg_better(op: str, dtype: np.dtype, v: str, i: str, bv: str, bi: str) -> str:
    """Whether (v, i) beats (bv, bi) for argmax/argmin: NaN first, then ties to the lower index."""
    cmp = ">" if op == "argmax" else "<"
    plain = f"({v} {cmp} {bv} || ({v} == {bv} && {i} < {bi}))"
    if dtype.kind != "f":
        return plain
    return f"(isnan({v}) ? (!isnan({bv}) || {i} < {bi}) : (!isnan({bv}) && {plain}))"


def reduce_source(
    program: FusedProgram, kept_rank: int, red_rank: int, op: str, acc_dtype: np.dtype, out_dtype: np.dtype,
    index_type: str = "long", serial: bool = False,
) -> KernelSource:
    """``parts`` work-groups per output element: strided partial folds, then a tree in local memory.
    ``serial`` (short reductions over many outputs, such as summing split-K partial results): one work-item
    per output folds its ``n_in`` inputs in a loop, and the second index argument is the output count
    ``n_out`` instead of ``parts`` (a work-group per output left most of each group idle: summing two 4.7 MB
    partial results took 0.71 ms on an H200).

    Group ``g`` folds part ``g % parts`` of output ``g / parts`` and writes ``out[g]``; with ``parts > 1``
    the caller folds the partial results with a second reduction (not for argmax/argmin).

    The input is a fused program (so ``sum(x * y)`` is one kernel). Leaves are addressed by ``kept_rank``
    strides (``in{i}_k*``) over the kept axes and ``red_rank`` strides (``in{i}_r*``) over the reduced ones.
    ``op`` is a name of REDUCE_OPS or ``argmax``/``argmin`` (which track the index along one axis).
    ``index_type``: ``int`` where every index and offset fits (see ``strided_kernel``).
    """
    it = index_type
    emitter = OpenCLEmitter()
    arg = op in ("argmax", "argmin")
    acc_t = ctype(acc_dtype)
    params = Params()
    if serial and arg:
        raise ValueError("reduce_source: argmax/argmin have no serial form")
    params.index(it, "n_in", "n_out" if serial else "parts", *[f"k{i}" for i in range(kept_rank)],
                 *[f"r{i}" for i in range(red_rank)])
    params.buffer(out_dtype, "out", const=False)
    for i, leaf in enumerate(program.leaves):
        params.buffer(leaf.dtype, f"in{i}", const=True)
        params.index(
            it,
            f"in{i}_off",
            *[f"in{i}_k{a}" for a in range(kept_rank)],
            *[f"in{i}_r{a}" for a in range(red_rank)],
        )
    for i, s in enumerate(program.scalars):
        params.scalar(s.dtype, f"s{i}")
    if not serial:
        params.local(acc_t, "sacc")
    if arg:
        params.local("long", "sidx")
    expr_lines, result = program.emit(emitter, lambda i: f"in{i}[in{i}_p]", lambda i: f"s{i}")
    lines = [
        f"{it} o = get_global_id(0);",
        "if (o >= n_out) return;",
    ] if serial else [
        f"{it} g = get_group_id(0);",
        f"{it} o = g / parts, part = g % parts;",
        "int t = get_local_id(0);",
        "int L = get_local_size(0);",
    ]
    lines += decompose("o", "k", "kc", kept_rank, it)
    lines += [
        f"{it} in{i}_b = {offset_expr(f'in{i}_off', f'in{i}', 'kc', kept_rank, 'k')};"
        for i in range(len(program.leaves))
    ]
    lines += [f"{acc_t} acc = {reduce_identity(op, acc_dtype)};"]
    if arg:
        lines.append("long bi = LONG_MAX;")
    # The reduction coordinates are found once and then advanced by the loop's stride digit by digit with a
    # carry (as the CUDA kernel does): a 64-bit division per element and reduced axis made BatchNorm's
    # (N, H, W) sums several times slower than the elementwise kernels over the same data.
    # (only where the work-item has inputs: an empty reduced axis would divide by zero, which traps on CPUs)
    lines.append(f"{it} j = 0, S = 1;" if serial else f"{it} j = part * L + t, S = ({it})L * parts;")
    lines.append("if (j < n_in) {")
    lines += [f"  {line}" for line in decompose("j", "r", "rc", red_rank, it) + decompose("S", "r", "sd", red_rank, it)]
    lines.append("for (; j < n_in; j += S) {")
    inner = [
        f"{it} in{i}_p = {offset_expr(f'in{i}_b', f'in{i}', 'rc', red_rank, 'r')};" for i in range(len(program.leaves))
    ]
    inner += expr_lines
    inner.append(f"{acc_t} v = {emitter.convert(result, program.dtype, acc_dtype)};")
    if arg:
        inner.append(f"if ({_arg_better(op, acc_dtype, 'v', 'j', 'acc', 'bi')}) {{ acc = v; bi = j; }}")
    else:
        inner.append(f"acc = {reduce_combine(op, acc_dtype, 'acc', 'v')};")
    for a in range(red_rank - 1, 0, -1):
        inner.append(f"rc{a} += sd{a}; if (rc{a} >= r{a}) {{ rc{a} -= r{a}; rc{a - 1} += 1; }}")
    if red_rank:
        inner.append("rc0 += sd0;")
    lines += [f"  {line}" for line in inner] + ["}", "}"]
    dtypes = program.dtypes() | {acc_dtype, out_dtype}
    if serial:
        lines.append(f"out[o] = {emitter.convert('acc', acc_dtype, out_dtype)};")
        return assemble("fg_reduce_serial", emitter, dtypes, params, lines)
    lines += ["sacc[t] = acc;"] + (["sidx[t] = bi;"] if arg else [])
    lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
    lines.append("for (int s = L >> 1; s > 0; s >>= 1) {")
    if arg:
        better = _arg_better(op, acc_dtype, "sacc[t + s]", "sidx[t + s]", "sacc[t]", "sidx[t]")
        lines.append(f"  if (t < s && {better}) {{ sacc[t] = sacc[t + s]; sidx[t] = sidx[t + s]; }}")
    else:
        lines.append(f"  if (t < s) sacc[t] = {reduce_combine(op, acc_dtype, 'sacc[t]', 'sacc[t + s]')};")
    lines += ["  barrier(CLK_LOCAL_MEM_FENCE);", "}"]
    final = "(long)sidx[0]" if arg else emitter.convert("sacc[0]", acc_dtype, out_dtype)
    lines.append(f"if (t == 0) out[g] = {final};")
    return assemble("fg_reduce", emitter, dtypes, params, lines)


# ----------------------------------------------------------------------------------------- line kernels
def update_source(kernel: UpdateKernel, dtype: np.dtype, device_scalars: bool) -> KernelSource:
    """The fused optimizer update ``kernel`` (see ``fusion.UpdateKernel``), one work-item per element.

    Buffers are ``{name}_buf`` with an element offset; each element of ``p``, the state and ``g`` is loaded
    into a local of its own name, the shared statements run on those, ``p`` and the state are stored back.
    Step scalars are ``dtype`` scalars, or float32 buffers (``{name}_d``) with ``device_scalars``.
    """
    emitter = OpenCLEmitter()
    params = Params()
    params.long("n")
    written = ("p", *kernel.state)
    for name in (*written, "g"):
        params.buffer(dtype, f"{name}_buf", const=name == "g")
        params.long(f"{name}_off")
    for name in kernel.step_scalars:
        if device_scalars:
            params.buffer(np.dtype(np.float32), f"{name}_d", const=True)
            params.long(f"{name}_d_off")
        else:
            params.scalar(dtype, name)
    for name in kernel.scalars:
        params.scalar(dtype, name)
    lines = ["long i = get_global_id(0);", "if (i >= n) return;", f"typedef {ctype(dtype)} T;"]
    if device_scalars:
        lines += [f"T {name} = (T){name}_d[{name}_d_off];" for name in kernel.step_scalars]
    lines += [f"T {name} = {name}_buf[{name}_off + i];" for name in (*written, "g")]
    lines += kernel.statements.splitlines()
    lines += [f"{name}_buf[{name}_off + i] = {name};" for name in written]
    return assemble(f"fg_{kernel.name}", emitter, {dtype}, params, lines)


#: The OpenCL C side of the dialect macros the shared row kernels use (``backends/row_kernels.py``).
OPENCL_DIALECT = """
#define FG_KERNEL __kernel void
#define FG_DEVICE inline
#define FG_GLOBAL __global
#define FG_RESTRICT restrict
#define FG_LOCAL __local
#define FG_LOCAL_PTR __local
#define FG_BARRIER barrier(CLK_LOCAL_MEM_FENCE)
#define FG_LID ((int)get_local_id(0))
#define FG_LSIZE ((int)get_local_size(0))
#define FG_GID ((long)get_group_id(0))
#define FG_GLOBAL_ID ((long)get_global_id(0))
#define FG_LONG long
"""

_ROW_ARG_DTYPES = {"long": LONG, "scalar": None, "in": None, "out": None, "index": None, "count": None}


def row_kernel_source(kernel: RowKernel, dtype: np.dtype) -> KernelSource:
    """A shared row kernel (``backends/row_kernels.py``) in OpenCL C for element type ``dtype``."""
    dtype = np.dtype(dtype)
    prelude = OpenCLEmitter.pragmas({dtype}) + OPENCL_DIALECT + f"typedef {ctype(dtype)} T;\n"
    source = prelude + render(kernel, {"FG_MAX_GROUP": MAX_GROUP})
    arg_dtypes = [dtype if kind == "scalar" else _ROW_ARG_DTYPES[kind] for kind, _ in kernel.params]
    return KernelSource(source, kernel.name, arg_dtypes)


def cumsum_source(rank: int, dtype: np.dtype, acc_dtype: np.dtype) -> KernelSource:
    """Inclusive scan: one work-item per line along the scanned axis (``len`` elements, axis strides)."""
    emitter = OpenCLEmitter()
    extra = Params()
    extra.long("len", "x_as", "out_as")
    acc_t = ctype(acc_dtype)
    body = [
        f"{acc_t} acc = 0;",
        "for (long j = 0; j < len; j++) {",
        f"  acc += {emitter.convert('x[x_p + j * x_as]', dtype, acc_dtype)};",
        f"  out[out_p + j * out_as] = {emitter.convert('acc', acc_dtype, dtype)};",
        "}",
    ]
    operands = [("out", dtype, False), ("x", dtype, True)]
    return strided_kernel("fg_cumsum", rank, operands, extra, body, emitter, {acc_dtype})


def scatter_source(rank: int, dtype: np.dtype, accumulate: bool) -> KernelSource:
    """Scatter (or scatter-add) along an axis: one work-item per line, so duplicates never race.

    Within a line the index is walked in order: duplicates accumulate (scatter-add) or the last write
    wins (scatter), matching NumPy's sequential ``put_along_axis`` / ``add.at``.
    """
    extra = Params()
    extra.long("len", "out_as", "out_alen", "idx_as", "src_as")
    if not accumulate:
        update = "out[k] = src[src_p + j * src_as];"
    elif dtype.kind == "b":
        update = "out[k] = out[k] | src[src_p + j * src_as];"
    else:
        update = "out[k] += src[src_p + j * src_as];"
    body = [
        "for (long j = 0; j < len; j++) {",
        "  long i = idx[idx_p + j * idx_as];",
        "  if (i < 0) i += out_alen;",
        "  i = clamp(i, 0L, out_alen - 1);",
        "  long k = out_p + i * out_as;",
        f"  {update}",
        "}",
    ]
    operands = [("out", dtype, False), ("idx", LONG, True), ("src", dtype, True)]
    name = "fg_scatter_add" if accumulate else "fg_scatter"
    return strided_kernel(name, rank, operands, extra, body)


def gather_source(rank: int, dtype: np.dtype) -> KernelSource:
    """``take_along_axis``: ``a`` is addressed with its axis stride zeroed plus ``index * a_as``."""
    extra = Params()
    extra.long("a_as", "a_alen")
    body = [
        "long i = idx[idx_p];",
        "if (i < 0) i += a_alen;",
        "i = clamp(i, 0L, a_alen - 1);",
        "out[out_p] = a[a_p + i * a_as];",
    ]
    operands = [("out", dtype, False), ("idx", LONG, True), ("a", dtype, True)]
    return strided_kernel("fg_gather", rank, operands, extra, body)


def argsort_source(dtype: np.dtype, descending: bool) -> KernelSource:
    """Stable argsort of the rows of a contiguous ``(rows, n)`` array by rank counting: work-item ``(row, i)``
    counts the elements that sort before element ``i`` (smaller, or equal at a lower position) and stores
    ``i`` at that rank. O(n) work per element, no synchronisation; NaN sorts last ascending and first
    descending, as in PyTorch."""
    emitter = OpenCLEmitter()
    t = ctype(dtype)
    params = Params()
    params.buffer(dtype, "a", True)
    params.buffer(LONG, "out", False)
    params.long("n", "total")
    if dtype.kind == "f":
        first, second = ("y", "x") if descending else ("x", "y")
        before = f"(y {'>' if descending else '<'} x) || (isnan({first}) && !isnan({second}))"
        same = "(y == x) || (isnan(x) && isnan(y))"
    else:
        before = f"y {'>' if descending else '<'} x"
        same = "y == x"
    lines = [
        "long gid = get_global_id(0);",
        "if (gid >= total) return;",
        "long row = gid / n, i = gid - row * n;",
        "__global const " + t + "* r = a + row * n;",
        f"{t} x = r[i];",
        "long rank = 0;",
        "for (long j = 0; j < n; ++j) {",
        f"  {t} y = r[j];",
        f"  if (({before}) || (j < i && ({same}))) ++rank;",
        "}",
        "out[row * n + rank] = i;",
    ]
    return assemble("fg_argsort", emitter, {dtype}, params, lines)


def arange_source(dtype: np.dtype, step_dtype: np.dtype) -> KernelSource:
    """``out[i] = start + i * step`` computed in ``step_dtype`` (NumPy's fill rule), stored as ``dtype``."""
    emitter = OpenCLEmitter()
    extra = Params()
    extra.scalar(step_dtype, "start")
    extra.scalar(step_dtype, "step")
    value = f"start + ({ctype(step_dtype)})gid * step"
    body = [f"out[out_p] = {emitter.convert(f'({value})', step_dtype, dtype)};"]
    return strided_kernel("fg_arange", 1, [("out", dtype, False)], extra, body, emitter, {step_dtype})


# ----------------------------------------------------------------------------------------- matmul
def matmul_source(batch_rank: int, dtype: np.dtype, acc_dtype: np.dtype, threads: int, work: int,
                  accumulate: bool = False) -> KernelSource:
    """Register-blocked batched GEMM (the "myGEMM" scheme); with ``accumulate``, ``out += a @ b`` (the sum
    taken in the accumulator type).

    A work-group of ``threads`` x ``threads`` work-items computes a ``threads * work`` square tile of the
    output; each work-item keeps ``work`` x ``work`` accumulators in registers, taking rows and columns
    ``threads`` apart so local-memory reads are conflict-free and global writes coalesce. A and B tiles
    (``threads`` deep along K) are staged in local memory. A and B are strided (row and column strides are
    arguments, so transposed views need no copy); the batch index is split over ``batch_rank`` collapsed
    batch dims with per-operand batch strides. Only ``threads`` and ``work`` are in the source.
    """
    emitter = OpenCLEmitter()
    acc_t = ctype(acc_dtype)
    tile, depth, group = threads * work, threads, threads * threads
    params = Params()
    params.long("M", "N", "K", *[f"d{i}" for i in range(batch_rank)])
    params.strided(dtype, "out", batch_rank, const=False)
    params.strided(dtype, "a", batch_rank, const=True)
    params.long("a_rs", "a_cs")
    params.strided(dtype, "b", batch_rank, const=True)
    params.long("b_rs", "b_cs")
    zero = f"({acc_t})0"
    lines = [
        "int tx = get_local_id(0), ty = get_local_id(1);",
        f"int tid = ty * {threads} + tx;",
        f"long col0 = get_group_id(0) * {tile};",
        f"long row0 = get_group_id(1) * {tile};",
        "long bidx = get_global_id(2);",
    ]
    lines += decompose("bidx", "d", "c", batch_rank)
    lines += [f"long {n}_p = {offset_expr(f'{n}_off', n, 'c', batch_rank)};" for n in ("out", "a", "b")]
    lines += [
        f"__local {acc_t} As[{depth}][{tile}];",
        f"__local {acc_t} Bs[{depth}][{tile}];",
        f"{acc_t} acc[{work}][{work}];",
        f"for (int i = 0; i < {work}; i++) for (int j = 0; j < {work}; j++) acc[i][j] = {zero};",
        f"for (long t0 = 0; t0 < K; t0 += {depth}) {{",
        f"  for (int l = 0; l < {work}; l++) {{",
        f"    int e = tid + l * {group};",
        f"    int m = e / {depth}, k = e % {depth};",
        "    long gr = row0 + m, gk = t0 + k;",
        f"    As[k][m] = (gr < M && gk < K) ? ({acc_t})a[a_p + gr * a_rs + gk * a_cs] : {zero};",
        f"    int k2 = e / {tile}, n2 = e % {tile};",
        "    long gk2 = t0 + k2, gc = col0 + n2;",
        f"    Bs[k2][n2] = (gk2 < K && gc < N) ? ({acc_t})b[b_p + gk2 * b_rs + gc * b_cs] : {zero};",
        "  }",
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        f"  for (int k = 0; k < {depth}; k++) {{",
        f"    {acc_t} bv[{work}];",
        f"    for (int j = 0; j < {work}; j++) bv[j] = Bs[k][tx + j * {threads}];",
        f"    for (int i = 0; i < {work}; i++) {{",
        f"      {acc_t} av = As[k][ty + i * {threads}];",
        f"      for (int j = 0; j < {work}; j++) acc[i][j] += av * bv[j];",
        "    }",
        "  }",
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        "}",
        f"for (int i = 0; i < {work}; i++) {{",
        f"  long row = row0 + ty + i * {threads};",
        f"  for (int j = 0; j < {work}; j++) {{",
        f"    long col = col0 + tx + j * {threads};",
        "    if (row < M && col < N) {",
        *([f"      acc[i][j] += {emitter.convert('out[out_p + row * N + col]', dtype, acc_dtype)};"]
          if accumulate else []),
        f"      out[out_p + row * N + col] = {emitter.convert('acc[i][j]', acc_dtype, dtype)};",
        "    }",
        "  }",
        "}",
    ]
    return assemble("fg_matmul", emitter, {dtype, acc_dtype}, params, lines)


# ----------------------------------------------------------------------------------------- random
_PHILOX = """
inline uint4 fg_philox(uint4 c, uint2 k) {
  for (int r = 0; r < 10; r++) {
    uint lo0 = c.x * 0xD2511F53u, hi0 = mul_hi(c.x, 0xD2511F53u);
    uint lo1 = c.z * 0xCD9E8D57u, hi1 = mul_hi(c.z, 0xCD9E8D57u);
    c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u; k.y += 0xBB67AE85u;
  }
  return c;
}
"""


def rng_per_block(dist: str, dtype: np.dtype) -> int:
    """Values one Philox block (four 32-bit words) yields: 2 where each takes 64 random bits, else 4."""
    return 2 if dist == "randint" or dtype == np.float64 else 4


def _u24(w: str) -> str:
    return f"((float)({w} >> 8) * (1.0f / 16777216.0f))"


def _u53(hi: str, lo: str) -> str:
    return f"(((double)({hi} >> 5) * 67108864.0 + (double)({lo} >> 6)) * (1.0 / 9007199254740992.0))"


def rng_source(dist: str, dtype: np.dtype) -> KernelSource:
    """Counter-based Philox4x32-10: block ``counter + gid`` under key ``(key0, key1)`` fills ``per`` values.

    ``uniform`` is in [0, 1) (24 random bits for float32, 53 for float64, 11 for float16 so it never
    rounds up to 1); ``normal`` is Box-Muller; ``randint`` is ``low + (64 random bits) % range``.
    """
    emitter = OpenCLEmitter()
    per = rng_per_block(dist, dtype)
    params = Params()
    params.buffer(dtype, "out", const=False)
    params.long("n")
    params.scalar(np.dtype(np.uint64), "counter")
    params.scalar(np.dtype(np.uint32), "key0")
    params.scalar(np.dtype(np.uint32), "key1")
    values: list[str] = []
    if dist == "uniform":
        if dtype == np.float64:
            values = [_u53("w[0]", "w[1]"), _u53("w[2]", "w[3]")]
        elif dtype == np.float16:
            values = [f"((float)(w[{k}] >> 21) * (1.0f / 2048.0f))" for k in range(4)]
        else:
            values = [_u24(f"w[{k}]") for k in range(4)]
        acc = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    elif dist == "normal":
        if dtype == np.float64:
            acc = np.dtype(np.float64)
            u1 = f"(1.0 - {_u53('w[0]', 'w[1]')})"
            u2 = _u53("w[2]", "w[3]")
            pairs = [(u1, u2)]
            pi2 = "6.283185307179586"
        else:
            acc = np.dtype(np.float32)
            pairs = [(f"(1.0f - {_u24('w[0]')})", _u24("w[1]")), (f"(1.0f - {_u24('w[2]')})", _u24("w[3]"))]
            pi2 = "6.2831853f"
        for u1, u2 in pairs:
            values += [
                f"(sqrt(-2 * log({u1})) * cos({pi2} * {u2}))",
                f"(sqrt(-2 * log({u1})) * sin({pi2} * {u2}))",
            ]
    elif dist == "randint":
        acc = LONG
        params.long("low")
        params.scalar(np.dtype(np.uint64), "range")
        values = [f"(low + (long)(((((ulong)w[{2 * k}]) << 32) | w[{2 * k + 1}]) % range))" for k in range(2)]
    else:
        raise BackendError(f"unknown random distribution {dist!r}")
    lines = [
        "long gid = get_global_id(0);",
        f"long base = gid * {per};",
        "if (base >= n) return;",
        "ulong ctr = counter + (ulong)gid;",
        "uint4 r = fg_philox((uint4)((uint)ctr, (uint)(ctr >> 32), 0u, 0u), (uint2)(key0, key1));",
        "uint w[4] = {r.x, r.y, r.z, r.w};",
    ]
    for k, value in enumerate(values):
        lines.append(f"if (base + {k} < n) out[base + {k}] = {emitter.convert(value, acc, dtype)};")
    return assemble("fg_random", emitter, {dtype, acc}, params, lines, preamble=_PHILOX)
