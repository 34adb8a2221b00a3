"""CUDA C sources for the CuPy backend: the fused elementwise kernel and the Philox random kernels.

Fused kernels are ``cupy.ElementwiseKernel`` s built from a :class:`~flowgraph.backends.fusion.FusedProgram`
by :class:`CudaEmitter` (the CUDA dialect of the shared C emitter). Every parameter is a type placeholder,
so CuPy binds types from the arguments, handles strides and broadcasting (zero strides), and compiles once
per structure; sizes and scalar values are arguments, never source.

float16 and bfloat16 are stored as CuPy's ``float16`` / ``bfloat16`` classes and computed in float32 (each
op rounds back, as NumPy's float16 ufuncs do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..fusion import CEmitter, FusedProgram, UpdateKernel, decompose, offset_expr
from ..row_kernels import MAX_GROUP, RowKernel, render

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
HALF_TYPES = frozenset({F16, BF16})


class CudaEmitter(CEmitter):
    """CUDA C type names (CuPy's) and float32 compute for the 16-bit float types."""

    CTYPES = {
        np.dtype(bool): "bool",
        np.dtype(np.int8): "signed char",
        np.dtype(np.uint8): "unsigned char",
        np.dtype(np.int16): "short",
        np.dtype(np.uint16): "unsigned short",
        np.dtype(np.int32): "int",
        np.dtype(np.uint32): "unsigned int",
        np.dtype(np.int64): "long long",
        np.dtype(np.uint64): "unsigned long long",
        F16: "float16",
        BF16: "bfloat16",
        F32: "float",
        F64: "double",
    }
    FUNCTION_QUALIFIER = "__device__"

    def apply(self, op: str, operands: list[tuple[str, np.dtype]], dtype: np.dtype) -> str:
        """As the base class, with 16-bit float operands widened to float and the result rounded back."""
        widened = [(f"((float)({x}))", F32) if dt in HALF_TYPES else (x, dt) for x, dt in operands]
        if dtype in HALF_TYPES:
            return f"(({self.ctype(dtype)})({super().apply(op, widened, F32)}))"
        return super().apply(op, widened, dtype)


def scalar_transport(dtype: np.dtype) -> np.dtype:
    """The dtype a scalar operand travels in as a kernel argument (16-bit floats go as float32)."""
    return F32 if dtype in HALF_TYPES else dtype


def elementwise_spec(program: FusedProgram, out_dtype: np.dtype,
                     outputs: Sequence[int] = ()) -> tuple[str, str, str, str]:
    """``(in_params, out_params, operation, preamble)`` of the ElementwiseKernel computing ``program``.

    Leaves are ``in0..``, scalars ``s0..`` and the output ``out``, then ``o0..`` holding the program's values
    ``outputs`` in their own dtypes. Array types are placeholders (one letter per dtype) bound by the arrays
    passed; scalars are typed by name.
    """
    emitter = CudaEmitter()

    def scalar_name(i: int) -> str:
        dtype = program.scalars[i].dtype
        if dtype in HALF_TYPES:
            return f"(({emitter.ctype(dtype)})s{i})"
        return f"s{i}"

    lines, result = program.emit(emitter, lambda i: f"in{i}", scalar_name)
    out_dtype = np.dtype(out_dtype)
    lines.append(f"out = {emitter.convert(result, program.dtype, out_dtype)};")
    lines += [f"o{j} = v{k};" for j, k in enumerate(outputs)]
    # CuPy type placeholders are single letters; arguments of one dtype share one (at most 13 dtypes).
    letters: dict[np.dtype, str] = {}

    def letter(dtype: np.dtype) -> str:
        found = letters.get(dtype)
        if found is None:
            found = letters[dtype] = _PLACEHOLDERS[len(letters)]
        return found

    params = [f"{letter(leaf.dtype)} in{i}" for i, leaf in enumerate(program.leaves)]
    # Scalars bind no placeholder in CuPy: they get their dtype's name (16-bit floats travel as float32).
    params += [f"{scalar_transport(s.dtype).name} s{i}" for i, s in enumerate(program.scalars)]
    preamble = emitter.helper_source()
    if BF16 in program.dtypes() or out_dtype == BF16:
        preamble = "#include <cupy/bfloat16.cuh>\n" + preamble
    outs = [f"{letter(out_dtype)} out"] + [f"{letter(program.instrs[k][1])} o{j}" for j, k in enumerate(outputs)]
    return ", ".join(params), ", ".join(outs), "\n".join(lines), preamble


_PLACEHOLDERS = "TUVWXYZABCDEFGHJKLMNPQRS"

#: dtypes the raw strided elementwise kernel takes; programs touching float16/bfloat16 go through
#: ``cupy.ElementwiseKernel`` (CuPy's own 16-bit float classes live in its headers).
RAW_TYPES = frozenset(CudaEmitter.CTYPES) - HALF_TYPES


def strided_source(program: FusedProgram, rank: int, out_dtype: np.dtype, index_type: str,
                   baked: Sequence[int] | None = None, outputs: Sequence[int] = ()) -> str:
    """``fg_ew``: one thread per element of a ``rank``-d collapsed output, every operand by its own strides.

    Parameters: ``n``, the collapsed dims ``d0..``, ``out`` and its strides ``out_s0..``, each leaf
    ``in{i}`` and its strides, each extra output ``o{j}`` (the program's value ``outputs[j]``, in its own
    dtype) and its strides, the scalars; strides in elements, ``index_type`` (``int`` where every offset
    fits) for the index arithmetic. A contiguous operation collapses to rank 1: the index is the offset, no
    per-operand n-d indexing. ``baked``: the collapsed dims written into the source as constants (the launch
    still passes them), for large launches where the per-element divisions by variable dims bound the kernel
    (``fusion.BAKE_DIMS_MIN``). CuPy's ``ElementwiseKernel`` costs several times this launch on the host
    (argument type resolution and its own indexer per call).
    """
    emitter = CudaEmitter()
    it = index_type
    params = [f"{it} n"] + [f"{it} d{a}" for a in range(rank)]
    params += [f"{emitter.ctype(out_dtype)}* out"] + [f"{it} out_s{a}" for a in range(rank)]
    for i, leaf in enumerate(program.leaves):  # no __restrict__: an in-place write reads its own output
        params += [f"const {emitter.ctype(leaf.dtype)}* in{i}"] + [f"{it} in{i}_s{a}" for a in range(rank)]
    for j, k in enumerate(outputs):
        params += [f"{emitter.ctype(program.instrs[k][1])}* o{j}"] + [f"{it} o{j}_s{a}" for a in range(rank)]
    params += [f"{emitter.ctype(sc.dtype)} s{i}" for i, sc in enumerate(program.scalars)]
    expr, result = program.emit(emitter, lambda i: f"in{i}[in{i}_p]", lambda i: f"s{i}")
    lines = [f"{it} idx = ({it})blockIdx.x * blockDim.x + threadIdx.x;", "if (idx >= n) return;"]
    lines += decompose("idx", "d", "c", rank, it, baked)
    lines += [f"{it} in{i}_p = {offset_expr('0', f'in{i}', 'c', rank)};" for i in range(len(program.leaves))]
    lines.append(f"{it} out_p = {offset_expr('0', 'out', 'c', rank)};")
    lines += [f"{it} o{j}_p = {offset_expr('0', f'o{j}', 'c', rank)};" for j in range(len(outputs))]
    lines += expr
    lines.append(f"out[out_p] = {emitter.convert(result, program.dtype, np.dtype(out_dtype))};")
    lines += [f"o{j}[o{j}_p] = v{k};" for j, k in enumerate(outputs)]
    body = "".join(f"  {line}\n" for line in lines)
    return (emitter.helper_source() + f'extern "C" __global__ void fg_ew({", ".join(params)}) {{\n'
            + body + "}\n")


def sum_spec(program: FusedProgram, acc: np.dtype, out_dtype: np.dtype) -> dict[str, str]:
    """Arguments of the ``cupy.ReductionKernel`` summing ``program`` (the fused map feeds the reduction).

    The expression becomes a ``__device__`` function ``fg_map`` of the leaves and scalars, so
    ``sum(x * y)`` or ``sum(exp(x - m))`` reads its inputs once and writes only the sums.
    """
    emitter = CudaEmitter()

    def scalar_name(i: int) -> str:
        dtype = program.scalars[i].dtype
        return f"(({emitter.ctype(dtype)})s{i})" if dtype in HALF_TYPES else f"s{i}"

    lines, result = program.emit(emitter, lambda i: f"in{i}", scalar_name)
    args = [f"{emitter.ctype(leaf.dtype)} in{i}" for i, leaf in enumerate(program.leaves)]
    args += [f"{emitter.ctype(scalar_transport(s.dtype))} s{i}" for i, s in enumerate(program.scalars)]
    names = [f"in{i}" for i in range(len(program.leaves))] + [f"s{i}" for i in range(len(program.scalars))]
    body = "".join(f"  {line}\n" for line in lines)
    function = (
        f"__device__ {emitter.ctype(acc)} fg_map({', '.join(args)}) {{\n{body}"
        f"  return {emitter.convert(result, program.dtype, acc)};\n}}\n"
    )
    letters: dict[np.dtype, str] = {}
    params = []
    for i, leaf in enumerate(program.leaves):
        letter = letters.setdefault(leaf.dtype, _PLACEHOLDERS[len(letters)])
        params.append(f"{letter} in{i}")
    params += [f"{scalar_transport(s.dtype).name} s{i}" for i, s in enumerate(program.scalars)]
    preamble = emitter.helper_source() + function
    if BF16 in program.dtypes():
        preamble = "#include <cupy/bfloat16.cuh>\n" + preamble
    return {
        "in_params": ", ".join(params),
        "out_params": f"{np.dtype(out_dtype).name} out",
        "map_expr": f"fg_map({', '.join(names)})",
        "reduce_expr": "a + b",
        "post_map_expr": f"out = ({emitter.ctype(np.dtype(out_dtype))})(a)",
        "identity": "0",
        "reduce_type": emitter.ctype(acc),
        "preamble": preamble,
    }


# ---------------------------------------------------------------------------------------- optimizers
def update_spec(kernel: UpdateKernel, device_scalars: bool) -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of the ``cupy.ElementwiseKernel`` running ``kernel``.

    ``p`` and the state are output parameters (read and written in place); step scalars are ``T`` values, or
    1-element float32 arrays (``raw``) read into locals with ``device_scalars``.
    """
    steps = [f"raw float32 {n}_d" if device_scalars else f"T {n}" for n in kernel.step_scalars]
    in_params = ", ".join(["T g", *steps, *(f"T {n}" for n in kernel.scalars)])
    out_params = ", ".join(f"T {n}" for n in ("p", *kernel.state))
    loads = "".join(f"T {n} = (T){n}_d[0];\n" for n in kernel.step_scalars) if device_scalars else ""
    return in_params, out_params, loads + kernel.statements


# ---------------------------------------------------------------------------------------- row kernels
#: The CUDA C side of the dialect macros the shared row kernels use (``backends/row_kernels.py``).
CUDA_DIALECT = """
#define FG_KERNEL extern "C" __global__ void
#define FG_DEVICE __device__ __forceinline__
#define FG_GLOBAL
#define FG_RESTRICT __restrict__
#define FG_LOCAL __shared__
#define FG_LOCAL_PTR
#define FG_BARRIER __syncthreads()
#define FG_LID ((int)threadIdx.x)
#define FG_LSIZE ((int)blockDim.x)
#define FG_GID ((long long)blockIdx.x)
#define FG_GLOBAL_ID ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define FG_LONG long long
"""


def row_kernel_source(kernel: RowKernel, dtype: np.dtype) -> str:
    """A shared row kernel (``backends/row_kernels.py``) in CUDA C for ``dtype`` (float32 or float64)."""
    return CUDA_DIALECT + f"typedef {CudaEmitter.CTYPES[np.dtype(dtype)]} T;\n" + render(
        kernel, {"FG_MAX_GROUP": MAX_GROUP})


# ---------------------------------------------------------------------------------------- reductions
#: Leaf and output dtypes the own reduction kernel takes; others go through ``cupy.ReductionKernel``.
RSUM_TYPES = frozenset({F32, F64})


def _rsum_parts(program: FusedProgram, kept_rank: int, red_rank: int, acc: np.dtype, out: np.dtype,
                second: str) -> tuple:
    """What the two reduction kernels share: ``(emitter, parameters, expression lines, result, accumulator
    and output C types)``; ``second`` names the second integer parameter (``parts`` or ``n_out``)."""
    emitter = CudaEmitter()
    acc_t, out_t = emitter.ctype(acc), emitter.ctype(out)
    params = ["long long n_in", f"long long {second}"]
    params += [f"long long k{i}" for i in range(kept_rank)] + [f"long long r{i}" for i in range(red_rank)]
    params.append(f"{out_t}* __restrict__ out")
    for i, leaf in enumerate(program.leaves):
        params.append(f"const {emitter.ctype(leaf.dtype)}* __restrict__ in{i}")
        params += [f"long long in{i}_k{a}" for a in range(kept_rank)]
        params += [f"long long in{i}_r{a}" for a in range(red_rank)]
    params += [f"{emitter.ctype(scalar_transport(sc.dtype))} s{i}" for i, sc in enumerate(program.scalars)]
    expr, result = program.emit(emitter, lambda i: f"in{i}[in{i}_p]", lambda i: f"s{i}")
    return emitter, params, expr, result, acc_t, out_t


def rsum_source(program: FusedProgram, kept_rank: int, red_rank: int, acc: np.dtype, out: np.dtype) -> str:
    """A sum of the fused ``program`` over collapsed reduced dims, ``parts`` thread blocks per output.

    Block ``g`` sums part ``g % parts`` of output ``g / parts`` (a strided loop, then warp shuffles and one
    shared-memory step) and writes ``out[g]``; with ``parts > 1`` the caller adds the partial sums. Leaves
    are addressed by ``kept_rank`` strides (``in{i}_k*``) and ``red_rank`` strides (``in{i}_r*``) in
    elements, as the OpenCL backend's reduction does. CuPy's ``ReductionKernel`` gives each output one
    block and indexes every operand through a full n-d indexer: LayerNorm's row sums took ~30 us there.
    """
    emitter, params, expr, result, acc_t, out_t = _rsum_parts(program, kept_rank, red_rank, acc, out, "parts")
    lines = [
        "long long g = blockIdx.x;",
        "long long o = g / parts, part = g % parts;",
        "int t = threadIdx.x, L = blockDim.x;",
    ]
    lines += decompose("o", "k", "kc", kept_rank)
    lines += [f"long long in{i}_b = {offset_expr('0', f'in{i}', 'kc', kept_rank, 'k')};"
              for i in range(len(program.leaves))]
    lines.append(f"{acc_t} acc = 0;")
    lines.append("long long j = part * L + t, S = (long long)L * parts;")
    # The reduction coordinates are found once and then advanced by the loop's stride digit by digit with a
    # carry: a 64-bit division per element and reduced dim capped BatchNorm's (N, H, W) sums near 1 TB/s.
    lines += decompose("j", "r", "rc", red_rank)
    lines += decompose("S", "r", "sd", red_rank)
    lines.append("for (; j < n_in; j += S) {")
    inner = [f"long long in{i}_p = {offset_expr(f'in{i}_b', f'in{i}', 'rc', red_rank, 'r')};"
             for i in range(len(program.leaves))]
    inner += expr
    inner.append(f"acc += {emitter.convert(result, program.dtype, acc)};")
    for a in range(red_rank - 1, 0, -1):
        inner.append(f"rc{a} += sd{a}; if (rc{a} >= r{a}) {{ rc{a} -= r{a}; rc{a - 1} += 1; }}")
    if red_rank:
        inner.append("rc0 += sd0;")
    lines += [f"  {line}" for line in inner] + ["}"]
    lines += [
        "for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);",
        f"__shared__ {acc_t} warp_sums[32];",
        "if ((t & 31) == 0) warp_sums[t >> 5] = acc;",
        "__syncthreads();",
        "if (t < 32) {",
        f"  acc = t < ((L + 31) >> 5) ? warp_sums[t] : ({acc_t})0;",
        "  for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);",
        f"  if (t == 0) out[g] = ({out_t})acc;",
        "}",
    ]
    body = "".join(f"  {line}\n" for line in lines)
    return (emitter.helper_source() + f'extern "C" __global__ void fg_rsum({", ".join(params)}) {{\n'
            + body + "}\n")


#: Reductions this short per output run one thread per output (``rsum_serial_source``) instead of a thread
#: block per output: gated_routing's weighted sum over 8 experts, (256, 512, 8) summed over the last axis,
#: took ~0.12 ms as 131,072 blocks of 32 threads, 8 of them busy.
SERIAL_SUM_MAX = 64


def rsum_serial_source(program: FusedProgram, kept_rank: int, red_rank: int, acc: np.dtype, out: np.dtype) -> str:
    """``rsum_source``'s sum with one thread per output, looping over its ``n_in`` elements (for short
    reductions); parameters as ``rsum_source``'s with ``n_out`` in place of ``parts``."""
    emitter, params, expr, result, acc_t, out_t = _rsum_parts(program, kept_rank, red_rank, acc, out, "n_out")
    lines = ["long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;", "if (o >= n_out) return;"]
    lines += decompose("o", "k", "kc", kept_rank)
    lines += [f"long long in{i}_b = {offset_expr('0', f'in{i}', 'kc', kept_rank, 'k')};"
              for i in range(len(program.leaves))]
    lines.append(f"{acc_t} acc = 0;")
    lines += [f"long long rc{a} = 0;" for a in range(red_rank)]
    lines.append("for (long long j = 0; j < n_in; ++j) {")
    inner = [f"long long in{i}_p = {offset_expr(f'in{i}_b', f'in{i}', 'rc', red_rank, 'r')};"
             for i in range(len(program.leaves))]
    inner += expr
    inner.append(f"acc += {emitter.convert(result, program.dtype, acc)};")
    if red_rank:
        inner.append(f"rc{red_rank - 1} += 1;")
    for a in range(red_rank - 1, 0, -1):  # the next element: carry digit by digit
        inner.append(f"if (rc{a} >= r{a}) {{ rc{a} = 0; rc{a - 1} += 1; }}")
    lines += [f"  {line}" for line in inner] + ["}", f"out[o] = ({out_t})acc;"]
    body = "".join(f"  {line}\n" for line in lines)
    return (emitter.helper_source() + f'extern "C" __global__ void fg_rsum_serial({", ".join(params)}) {{\n'
            + body + "}\n")


# ---------------------------------------------------------------------------------------- random
#: Values written per Philox block (one 4x32-bit draw) for each kernel.
RNG_PER_BLOCK = {"uniform_f32": 4, "uniform_f64": 2, "normal_f32": 4, "normal_f64": 2, "randint": 2}

RNG_SOURCE = r"""
#define FG_M0 0xD2511F53u
#define FG_M1 0xCD9E8D57u
#define FG_W0 0x9E3779B9u
#define FG_W1 0xBB67AE85u

__device__ __forceinline__ void fg_philox(unsigned int c[4], unsigned int k0, unsigned int k1) {
  for (int round = 0; round < 10; ++round) {
    unsigned int hi0 = __umulhi(FG_M0, c[0]), lo0 = FG_M0 * c[0];
    unsigned int hi1 = __umulhi(FG_M1, c[2]), lo1 = FG_M1 * c[2];
    unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    k0 += FG_W0; k1 += FG_W1;
  }
}

// One Philox block per thread; state = {key, counter} lives on the device, so a captured graph
// draws new numbers on every replay (fg_rng_advance moves the counter after each draw).
__device__ __forceinline__ long long fg_block(const unsigned long long* state, unsigned int w[4]) {
  long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long key = state[0];
  unsigned long long ctr = state[1] + (unsigned long long)gid;
  w[0] = (unsigned int)ctr; w[1] = (unsigned int)(ctr >> 32); w[2] = 0u; w[3] = 0u;
  fg_philox(w, (unsigned int)key, (unsigned int)(key >> 32));
  return gid;
}

__device__ __forceinline__ double fg_u53(unsigned int a, unsigned int b) {
  return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}

extern "C" __global__ void fg_uniform_f32(float* out, long long n, const unsigned long long* state,
                                          int bits) {
  unsigned int w[4];
  long long base = fg_block(state, w) * 4;
  float scale = 1.0f / (float)(1u << bits);
  for (int k = 0; k < 4; ++k)
    if (base + k < n) out[base + k] = (float)(w[k] >> (32 - bits)) * scale;
}

extern "C" __global__ void fg_uniform_f64(double* out, long long n, const unsigned long long* state) {
  unsigned int w[4];
  long long base = fg_block(state, w) * 2;
  if (base < n) out[base] = fg_u53(w[0], w[1]);
  if (base + 1 < n) out[base + 1] = fg_u53(w[2], w[3]);
}

extern "C" __global__ void fg_normal_f32(float* out, long long n, const unsigned long long* state) {
  unsigned int w[4];
  long long base = fg_block(state, w) * 4;
  for (int k = 0; k < 2; ++k) {
    float u1 = 1.0f - (float)(w[2 * k] >> 8) * (1.0f / 16777216.0f);
    float u2 = (float)(w[2 * k + 1] >> 8) * (1.0f / 16777216.0f);
    float r = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    if (base + 2 * k < n) out[base + 2 * k] = r * c;
    if (base + 2 * k + 1 < n) out[base + 2 * k + 1] = r * s;
  }
}

extern "C" __global__ void fg_normal_f64(double* out, long long n, const unsigned long long* state) {
  unsigned int w[4];
  long long base = fg_block(state, w) * 2;
  double u1 = 1.0 - fg_u53(w[0], w[1]);
  double u2 = fg_u53(w[2], w[3]);
  double r = sqrt(-2.0 * log(u1));
  double s, c;
  sincospi(2.0 * u2, &s, &c);
  if (base < n) out[base] = r * c;
  if (base + 1 < n) out[base + 1] = r * s;
}

extern "C" __global__ void fg_randint(long long* out, long long n, const unsigned long long* state,
                                      long long low, unsigned long long range) {
  unsigned int w[4];
  long long base = fg_block(state, w) * 2;
  for (int k = 0; k < 2; ++k) {
    unsigned long long bits = ((unsigned long long)w[2 * k] << 32) | w[2 * k + 1];
    if (base + k < n) out[base + k] = low + (long long)(bits % range);
  }
}

extern "C" __global__ void fg_rng_advance(unsigned long long* state, unsigned long long blocks) {
  state[1] += blocks;
}
"""

RNG_KERNELS = ("fg_uniform_f32", "fg_uniform_f64", "fg_normal_f32", "fg_normal_f64", "fg_randint",
               "fg_rng_advance")


def rng_module(cupy: Any) -> Any:
    """The compiled random module (CuPy caches it on disk by source)."""
    return cupy.RawModule(code=RNG_SOURCE, name_expressions=None)
