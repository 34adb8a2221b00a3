"""Row-wise kernels written once in dialect-neutral C: LayerNorm forward and backward, multi-tensor Adam.

The CUDA backend (CuPy ``RawKernel``) and the OpenCL backend compile the same kernel bodies; each puts its
own prelude of dialect macros in front (``cuda/kernels.py``'s ``CUDA_DIALECT``, ``opencl/kernels.py``'s
``OPENCL_DIALECT``). The macros a body may use:

=================  =====================================  ==========================================
macro              OpenCL C                               CUDA C
=================  =====================================  ==========================================
``FG_KERNEL``      ``__kernel void``                      ``extern "C" __global__ void``
``FG_DEVICE``      ``inline``                             ``__device__ __forceinline__``
``FG_GLOBAL``      ``__global``                           (nothing)
``FG_RESTRICT``    ``restrict``                           ``__restrict__``
``FG_LOCAL``       ``__local`` (a group-shared array)     ``__shared__``
``FG_LOCAL_PTR``   ``__local`` (a pointer parameter)      (nothing)
``FG_BARRIER``     ``barrier(CLK_LOCAL_MEM_FENCE)``       ``__syncthreads()``
``FG_LID``         ``get_local_id(0)``                    ``threadIdx.x``
``FG_LSIZE``       ``get_local_size(0)``                  ``blockDim.x``
``FG_GID``         ``get_group_id(0)``                    ``blockIdx.x``
``FG_GLOBAL_ID``   ``get_global_id(0)``                   ``blockIdx.x * blockDim.x + threadIdx.x``
``FG_LONG``        ``long``                               ``long long``
=================  =====================================  ==========================================

plus ``T``, the element type (``float`` or ``double``: 16-bit inputs are normalised in float32 by
``Backend.layer_norm``'s generic default, as PyTorch computes them), and ``FG_MAX_GROUP``, the size of the
group-shared scratch array (the launch's work-group size is a power of two no larger).

A kernel is described by :class:`RowKernel`: its parameters (so each backend builds its argument list, and
OpenCL its scalar-argument dtypes, from one place) and its body. :func:`render` writes the signature and body.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from .fusion import ADAM_UPDATE

_dtype_of = attrgetter("dtype")
_shape_of = attrgetter("shape")

#: Work-group (thread-block) size cap of the row kernels and the size of their shared scratch array.
MAX_GROUP = 256

#: Elements of one tensor a thread block of the CUDA multi-tensor Adam updates (PyTorch's
#: ``multi_tensor_apply`` uses 65,536 per chunk with 512 threads; 256 threads x 32 elements here).
ADAM_CHUNK = 8192

#: Tensors one OpenCL multi-tensor Adam launch takes (OpenCL 1.2 has no pointer tables: each is 4 buffers).
OPENCL_ADAM_TENSORS = 8


class RowKernel:
    """One kernel: ``name``, ``params`` ``(kind, name)`` in order, and ``body`` (C statements).

    Parameter kinds: ``"long"`` (a ``FG_LONG``), ``"scalar"`` (a ``T`` value), ``"in"`` (a read-only ``T``
    buffer), ``"out"`` (a written ``T`` buffer), ``"index"`` (a read-only ``FG_LONG`` buffer).
    """

    __slots__ = ("name", "params", "body", "helpers")

    def __init__(self, name: str, params: Sequence[tuple[str, str]], body: str, helpers: str = "") -> None:
        self.name = name
        self.params = tuple(params)
        self.body = body.strip("\n")
        #: Device functions the body calls beyond the shared ones (an emitter's, for a :class:`Prologue`).
        self.helpers = helpers


class Prologue:
    """A pending input a row kernel computes itself instead of reading it (``LazyEngine._row_input``): the
    elementwise expression that would otherwise run as a kernel of its own first (a linear layer's bias and
    activation before a LayerNorm), evaluated at each ``(row, j)`` from its ``leaves`` (``T`` buffers, each
    with an element offset and two strides: zero on a broadcast axis) and ``scalars`` (``T`` parameters).

    ``lines`` and ``result`` are the statements and result a backend's emitter wrote for the program
    (:func:`prologue` below), so they are in that backend's dialect, as are ``helpers``."""

    __slots__ = ("leaves", "scalars", "lines", "result", "helpers")

    def __init__(self, leaves: int, scalars: int, lines: Sequence[str], result: str, helpers: str) -> None:
        self.leaves, self.scalars = leaves, scalars
        self.lines, self.result, self.helpers = tuple(lines), result, helpers

    @staticmethod
    def load(i: int) -> str:
        """The C expression reading leaf ``i`` at ``(row, j)``."""
        return f"in{i}[in{i}_off + row * in{i}_s0 + j * in{i}_s1]"

    @staticmethod
    def scalar(i: int) -> str:
        """The parameter holding scalar ``i``."""
        return f"s{i}"

    def params(self) -> list[tuple[str, str]]:
        """The kernel parameters: per leaf its buffer, offset and two strides, then the scalars."""
        out: list[tuple[str, str]] = []
        for i in range(self.leaves):
            out += [("in", f"in{i}"), ("long", f"in{i}_off"), ("long", f"in{i}_s0"), ("long", f"in{i}_s1")]
        return out + [("scalar", self.scalar(i)) for i in range(self.scalars)]

    def compute(self, target: str, indent: str) -> str:
        """Statements setting the ``T`` variable ``target`` to the expression at ``(row, j)`` (in a block
        of their own: the emitter's temporaries do not meet the kernel's names)."""
        inner = "".join(f"{indent}  {line}\n" for line in self.lines)
        return f"{indent}{{\n{inner}{indent}  {target} = {self.result};\n{indent}}}\n"


def prologue(program: Any, emitter: Any) -> Prologue:
    """The :class:`Prologue` of a ``fusion.FusedProgram`` written by a backend's ``fusion.CEmitter``."""
    lines, result = program.emit(emitter, Prologue.load, Prologue.scalar)
    return Prologue(len(program.leaves), len(program.scalars), lines, result, emitter.helper_source())


_C_PARAM = {
    "long": "FG_LONG {n}",
    "scalar": "T {n}",
    "in": "FG_GLOBAL const T* FG_RESTRICT {n}",
    "out": "FG_GLOBAL T* FG_RESTRICT {n}",
    "index": "FG_GLOBAL const FG_LONG* FG_RESTRICT {n}",
    "count": "FG_GLOBAL FG_LONG* FG_RESTRICT {n}",
    "f32": "FG_GLOBAL const float* FG_RESTRICT {n}",
}


def render(kernel: RowKernel, defines: dict[str, str | int] | None = None) -> str:
    """The kernel's dialect-neutral source: ``#define`` lines for ``defines``, the shared helpers, the kernel.

    A backend puts its dialect prelude (and ``T``) in front of the result.
    """
    lines = [f"#define {k} {v}" for k, v in (defines or {}).items()]
    signature = ", ".join(_C_PARAM[kind].format(n=name) for kind, name in kernel.params)
    return ("\n".join(lines) + "\n" + _HELPERS + kernel.helpers
            + f"FG_KERNEL {kernel.name}({signature}) {{\n{kernel.body}\n}}\n")


_HELPERS = """
// The sum of v over the work-group (L a power of two, at most FG_MAX_GROUP), in a fixed tree order, so every
// backend and every run gives the same bits; s is group-shared scratch, free again on return.
FG_DEVICE T fg_group_sum(FG_LOCAL_PTR T* s, T v, int t, int L) {
  s[t] = v;
  FG_BARRIER;
  for (int k = L >> 1; k > 0; k >>= 1) {
    if (t < k) s[t] += s[t + k];
    FG_BARRIER;
  }
  T r = s[0];
  FG_BARRIER;
  return r;
}
"""


def layer_norm_forward(has_w: bool, has_b: bool, computed: Prologue | None = None,
                       has_residual: bool = False) -> RowKernel:
    """``y = (x - mean) * rstd * w + b`` over each row of a contiguous ``(rows, cols)`` ``x``, one work-group
    per row: the mean and the (biased) variance as two group sums (two passes over the row, as the generic
    default), ``rstd = 1 / sqrt(var + eps)``; ``mean``/``rstd`` ``(rows,)`` are written for the backward.

    With ``computed`` the input is a pending expression the first pass evaluates and writes out (``x_out``,
    the realized input the backward reads); the other passes read it back (the same work-item's elements).
    With ``has_residual`` the kernel writes ``res + y`` (a residual block's sum) in place of ``y``."""
    params = [("long", "cols")]
    params += [("in", "x"), ("long", "x_off")] if computed is None else computed.params()
    params += [("in", "w"), ("long", "w_off")] if has_w else []
    params += [("in", "b"), ("long", "b_off")] if has_b else []
    params += [("in", "res"), ("long", "res_off")] if has_residual else []
    params += [("out", "y"), ("out", "mean_out"), ("out", "rstd_out"), ("scalar", "eps")]
    params += [("out", "x_out")] if computed is not None else []
    affine = ("    v = v * w[w_off + j];\n" if has_w else "") + ("    v = v + b[b_off + j];\n" if has_b else "")
    if computed is None:
        rows_x = "FG_GLOBAL const T* xr = x + x_off + row * cols;"
        first = "    s += xr[j];\n"
    else:
        rows_x = "FG_GLOBAL T* xr = x_out + row * cols;"
        first = "    T xv;\n" + computed.compute("xv", "    ") + "    xr[j] = xv;\n    s += xv;\n"
    body = f"""
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG row = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  {rows_x}
  FG_GLOBAL T* yr = y + row * cols;
  T s = (T)0;
  for (FG_LONG j = t; j < cols; j += L) {{
{first}  }}
  T mean = fg_group_sum(scratch, s, t, L) * ((T)1 / (T)cols);
  T q = (T)0;
  for (FG_LONG j = t; j < cols; j += L) {{
    T d = xr[j] - mean;
    q += d * d;
  }}
  T var = fg_group_sum(scratch, q, t, L) * ((T)1 / (T)cols);
  T rstd = (T)1 / sqrt(var + eps);
  for (FG_LONG j = t; j < cols; j += L) {{
    T v = (xr[j] - mean) * rstd;
{affine}    yr[j] = {"res[res_off + row * cols + j] + v" if has_residual else "v"};
  }}
  if (t == 0) {{
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }}
"""
    name = ("fg_layer_norm" if computed is None else "fg_layer_norm_computed") + "_residual" * has_residual
    return RowKernel(name, params, body, "" if computed is None else computed.helpers)


def layer_norm_backward(has_w: bool, g_pair: bool = False) -> RowKernel:
    """The input gradient, one work-group per row: ``gy = g * w``, ``xhat = (x - mean) * rstd``,
    ``gx = (gy - mean(gy) - xhat * mean(gy * xhat)) * rstd`` (both means from one pass of two group sums).
    With ``g_pair`` the output gradient arrives as two contributions ``g + g2`` (a pending sum,
    ``LazyEngine._pending_pair_sum``: a residual branch's gradient plus the skip path's) that the first pass
    adds and writes out (``g_sum``, which the second pass and the parameter gradients then read)."""
    params = [("long", "cols"), ("in", "g"), ("long", "g_off")]
    params += [("in", "g2"), ("long", "g2_off")] if g_pair else []
    params += [("in", "x"), ("long", "x_off"), ("in", "mean"), ("in", "rstd")]
    params += [("in", "w"), ("long", "w_off")] if has_w else []
    params += [("out", "gx")] + ([("out", "g_sum")] if g_pair else [])
    weighted = " * w[w_off + j]" if has_w else ""
    if g_pair:
        pair_rows = """
  FG_GLOBAL const T* g2r = g2 + g2_off + row * cols;
  FG_GLOBAL T* gsr = g_sum + row * cols;"""
        first, second = "T gv = gr[j] + g2r[j];\n    gsr[j] = gv;", "T gv = gsr[j];"  # the same work-item's j
    else:
        pair_rows, first, second = "", "T gv = gr[j];", "T gv = gr[j];"
    body = f"""
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG row = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  FG_GLOBAL const T* gr = g + g_off + row * cols;{pair_rows}
  FG_GLOBAL const T* xr = x + x_off + row * cols;
  FG_GLOBAL T* out = gx + row * cols;
  T mu = mean[row], rs = rstd[row];
  T a = (T)0, c = (T)0;
  for (FG_LONG j = t; j < cols; j += L) {{
    {first}
    T gy = gv{weighted};
    T xh = (xr[j] - mu) * rs;
    a += gy;
    c += gy * xh;
  }}
  T inv = (T)1 / (T)cols;
  a = fg_group_sum(scratch, a, t, L) * inv;
  c = fg_group_sum(scratch, c, t, L) * inv;
  for (FG_LONG j = t; j < cols; j += L) {{
    {second}
    T gy = gv{weighted};
    T xh = (xr[j] - mu) * rs;
    out[j] = (gy - a - xh * c) * rs;
  }}
"""
    return RowKernel("fg_layer_norm_backward" + "_g2" * g_pair, params, body)


def _buffers(*named: tuple[str, str]) -> list[tuple[str, str]]:
    """Buffer parameters, each followed by its element offset (``name_off``)."""
    return [p for kind, name in named for p in ((kind, name), ("long", f"{name}_off"))]


# Batch norm in training, over ``x`` ``(N, C, *S)`` viewed as ``N * C`` rows of ``cols = prod(S)``: a row kernel
# takes each row's mean and sum of squared deviations (two passes, as LayerNorm's), then a channel kernel
# merges the ``N`` rows of each channel exactly (Chan et al.: ``M2 = sum(M2_r) + cols * sum((mean_r -
# mean)^2)``), so every work-group has work even where the channels are few and long (convnet's first layer:
# 64 channels of 524,288 elements, 8,192 rows). The backward is the same pair over ``g`` and ``x``.
BATCH_NORM_ROW_MOMENTS = RowKernel("fg_batch_norm_row_moments", [
    ("long", "cols"), *_buffers(("in", "x"), ("out", "mean_out"), ("out", "m2_out"))], """
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG row = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  FG_GLOBAL const T* xr = x + x_off + row * cols;
  T s = (T)0;
  for (FG_LONG j = t; j < cols; j += L) s += xr[j];
  T mean = fg_group_sum(scratch, s, t, L) * ((T)1 / (T)cols);
  T q = (T)0;
  for (FG_LONG j = t; j < cols; j += L) {
    T d = xr[j] - mean;
    q += d * d;
  }
  q = fg_group_sum(scratch, q, t, L);
  if (t == 0) {
    mean_out[mean_out_off + row] = mean;
    m2_out[m2_out_off + row] = q;
  }
""")


def batch_norm_stats(has_w: bool, has_running: bool, counts: bool = False) -> RowKernel:
    """Per channel (one work-group each, over its ``n`` rows): the mean, the biased variance, ``rstd = 1 /
    sqrt(var + eps)`` and ``scale = rstd * w`` (``rstd`` without a weight); with ``has_running`` the running
    statistics are updated in place as PyTorch does, ``r = (1 - momentum) * r + momentum * stat`` (the
    variance's unbiased by ``unbias = count / (count - 1)``), and with ``counts`` (``has_running`` too) the
    layer's batch count, an int64 buffer, is incremented by channel 0's first work-item."""
    params = [("long", "n"), ("long", "channels"), ("long", "cols")]
    params += _buffers(("in", "rmean"), ("in", "rm2"))
    params += _buffers(("in", "w")) if has_w else []
    params += _buffers(("out", "run_mean"), ("out", "run_var")) if has_running else []
    params += _buffers(("count", "batches")) if counts else []
    params += _buffers(("out", "mean_out"), ("out", "var_out"), ("out", "rstd_out"), ("out", "scale_out"))
    params += [("scalar", "eps"), ("scalar", "momentum"), ("scalar", "unbias")]
    running = """
    run_mean[run_mean_off + c] = ((T)1 - momentum) * run_mean[run_mean_off + c] + momentum * mean;
    run_var[run_var_off + c] = ((T)1 - momentum) * run_var[run_var_off + c] + momentum * (var * unbias);"""
    if counts:
        running += """
    if (c == 0) batches[batches_off] += 1;"""
    body = f"""
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG c = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  T s = (T)0;
  for (FG_LONG k = t; k < n; k += L) s += rmean[rmean_off + k * channels + c];
  T mean = fg_group_sum(scratch, s, t, L) * ((T)1 / (T)n);
  T q = (T)0;
  for (FG_LONG k = t; k < n; k += L) {{
    T d = rmean[rmean_off + k * channels + c] - mean;
    q += rm2[rm2_off + k * channels + c] + (T)cols * d * d;
  }}
  T var = fg_group_sum(scratch, q, t, L) / ((T)n * (T)cols);
  T rstd = (T)1 / sqrt(var + eps);
  if (t == 0) {{
    mean_out[mean_out_off + c] = mean;
    var_out[var_out_off + c] = var;
    rstd_out[rstd_out_off + c] = rstd;
    scale_out[scale_out_off + c] = rstd{" * w[w_off + c]" if has_w else ""};{running if has_running else ""}
  }}
"""
    return RowKernel("fg_batch_norm_stats" + "_w" * has_w + "_running" * has_running + "_count" * counts, params,
                     body)


BATCH_NORM_ROW_GRAD_SUMS = RowKernel("fg_batch_norm_row_grad_sums", [
    ("long", "cols"), ("long", "channels"),
    *_buffers(("in", "g"), ("in", "x"), ("in", "mean"), ("out", "sg_out"), ("out", "sgc_out"))], """
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG row = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  FG_GLOBAL const T* gr = g + g_off + row * cols;
  FG_GLOBAL const T* xr = x + x_off + row * cols;
  T mu = mean[mean_off + row % channels];
  T a = (T)0, b = (T)0;
  for (FG_LONG j = t; j < cols; j += L) {
    T gv = gr[j];
    a += gv;
    b += gv * (xr[j] - mu);
  }
  a = fg_group_sum(scratch, a, t, L);
  b = fg_group_sum(scratch, b, t, L);
  if (t == 0) {
    sg_out[sg_out_off + row] = a;
    sgc_out[sgc_out_off + row] = b;
  }
""")


def batch_norm_grads(has_w: bool) -> RowKernel:
    """Per channel, from the rows' sums ``sum(g)`` and ``sum(g * (x - mean))``: ``gb = sum(g)``, ``gw = rstd *
    sum(g * (x - mean))``, and the coefficients of the input gradient ``gx = g * a + (x - mean) * b + c``
    (``a = w * rstd``, ``b = -w * rstd^3 * sum(g * (x - mean)) / count``, ``c = -w * rstd * sum(g) / count``: the
    closed form ``rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with ``gy = g * w`` per channel)."""
    params = [("long", "n"), ("long", "channels"), ("long", "cols")]
    params += _buffers(("in", "sg_rows"), ("in", "sgc_rows"), ("in", "rstd"))
    params += _buffers(("in", "w")) if has_w else []
    params += _buffers(("out", "gw_out"), ("out", "gb_out"), ("out", "a_out"), ("out", "b_out"), ("out", "c_out"))
    body = f"""
  FG_LOCAL T scratch[FG_MAX_GROUP];
  FG_LONG c = FG_GID;
  int t = FG_LID, L = FG_LSIZE;
  T a = (T)0, b = (T)0;
  for (FG_LONG k = t; k < n; k += L) {{
    a += sg_rows[sg_rows_off + k * channels + c];
    b += sgc_rows[sgc_rows_off + k * channels + c];
  }}
  a = fg_group_sum(scratch, a, t, L);
  b = fg_group_sum(scratch, b, t, L);
  if (t == 0) {{
    T rs = rstd[rstd_off + c];
    T ws = {"w[w_off + c] * rs" if has_w else "rs"};
    T inv = (T)1 / ((T)n * (T)cols);
    gb_out[gb_out_off + c] = a;
    gw_out[gw_out_off + c] = b * rs;
    a_out[a_out_off + c] = ws;
    b_out[b_out_off + c] = -ws * rs * rs * b * inv;
    c_out[c_out_off + c] = -ws * a * inv;
  }}
"""
    return RowKernel("fg_batch_norm_grads" + "_w" * has_w, params, body)


#: Columns one work-group of a column-sum kernel (:data:`LAYER_NORM_PARAM_GRADS`, :func:`column_sum`) covers:
#: adjacent work-items read adjacent columns, 8 of them one 32-byte memory sector of float32, and a
#: ``(256, 1024)`` gradient gives 128 work-groups. Strips of 32 columns gave 32 work-groups, too few to hide
#: the loads' latency on an H100 (16 us for a Linear's bias gradient with GELU's backward computed in it, against
#: 5.5 us for the two kernels it replaced). A device whose work-groups are smaller runs strips as wide as its
#: group.
PARAM_STRIP = 8

#: The leading parameters of the column-sum kernels (``param_grad_layout`` gives their values).
_STRIP_PARAMS = [("long", "rows"), ("long", "cols"), ("long", "chunk"), ("long", "width"), ("long", "strips"),
                 ("long", "total")]


#: Work-group size of the column-sum kernels where the device allows it (their lane scratch is sized for it):
#: a Linear's bias gradient that computes GELU's backward in place is bound by that arithmetic's latency, and
#: 1024 work-items per strip keep four times as many in flight as the row kernels' 256.
STRIP_GROUP = 1024


def _strip_sums(name: str, params: Sequence[tuple[str, str]], element: str, sums: Sequence[str],
                helpers: str = "") -> RowKernel:
    """A kernel of column sums over a ``(rows, cols)`` operand, one work-group per ``width`` columns of one
    chunk of rows: group ``part * strips + s`` sums rows ``[part * chunk, (part + 1) * chunk)`` of its
    columns, its ``FG_LSIZE / width`` lanes (a power of two) each taking every lane-th row, then the lanes'
    sums are added in a fixed tree order (the same bits on every run). ``element`` (statements at
    ``(row, j)``) defines ``T`` values named in ``sums``; sum ``k`` of part ``part`` goes to
    ``partial[k * total + part * cols + j]``. With one part (``param_grad_parts``) these are the sums
    themselves (one launch, PyTorch's ``GammaBetaBackward`` layout); with more the caller sums the parts."""
    n = len(sums)
    declare = "".join(f"  FG_LOCAL T lanes_{k}[{STRIP_GROUP}];\n" for k in range(n))
    zero = ", ".join(f"acc_{k} = (T)0" for k in range(n))
    add = "".join(f"      acc_{k} += {term};\n" for k, term in enumerate(sums))
    store = "".join(f"  lanes_{k}[t] = acc_{k};\n" for k in range(n))
    fold = "".join(f"      lanes_{k}[t] += lanes_{k}[t + k * w];\n" for k in range(n))
    write = "".join(f"    partial[{k} * total + part * cols + j] = lanes_{k}[t];\n" for k in range(n))
    body = f"""{declare}  int t = FG_LID, w = (int)width, lanes = FG_LSIZE / w;
  int tx = t % w, ty = t / w;
  FG_LONG part = FG_GID / strips;
  FG_LONG j = (FG_GID - part * strips) * width + tx;
  FG_LONG r0 = part * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  T {zero};
  if (j < cols) {{
    for (FG_LONG row = r0 + ty; row < r1; row += lanes) {{
{element}{add}    }}
  }}
{store}  FG_BARRIER;
  for (int k = lanes >> 1; k > 0; k >>= 1) {{
    if (ty < k) {{
{fold}    }}
    FG_BARRIER;
  }}
  if (ty == 0 && j < cols) {{
{write}  }}
"""
    return RowKernel(name, [*_STRIP_PARAMS, *params, ("out", "partial")], body, helpers)


#: LayerNorm's weight and bias gradients, ``sum(g * xhat)`` and ``sum(g)`` over the rows (``_strip_sums``).
LAYER_NORM_PARAM_GRADS = _strip_sums(
    "fg_layer_norm_param_grads",
    [("in", "g"), ("long", "g_off"), ("in", "x"), ("long", "x_off"), ("in", "mean"), ("in", "rstd")],
    "      T gv = g[g_off + row * cols + j];\n",
    ["gv * ((x[x_off + row * cols + j] - mean[row]) * rstd[row])", "gv"],
)


def column_sum(computed: Prologue | None = None) -> RowKernel:
    """The sum over the rows of a ``(rows, cols)`` operand (a linear layer's bias gradient, ``_strip_sums``):
    a contiguous ``g`` read, or with ``computed`` a pending expression evaluated at each element and written
    out to ``g_out`` (each element is visited once), so the layer's GEMMs then read it realized."""
    if computed is None:
        return _strip_sums("fg_column_sum", [("in", "g"), ("long", "g_off")],
                           "      T gv = g[g_off + row * cols + j];\n", ["gv"])
    element = "      T gv;\n" + computed.compute("gv", "      ") + "      g_out[row * cols + j] = gv;\n"
    return _strip_sums("fg_column_sum_computed", [*computed.params(), ("out", "g_out")], element, ["gv"],
                       computed.helpers)


_ADAM_SCALARS = tuple(("scalar", n) for n in (*ADAM_UPDATE.step_scalars, *ADAM_UPDATE.scalars))


def _adam_element(p: str, g: str, m: str, v: str, i: str) -> str:
    """One element's Adam update (``fusion.ADAM_UPDATE``'s statements) on buffers ``p g m v`` at ``i``."""
    statements = "\n".join(f"    {line}" for line in ADAM_UPDATE.statements.splitlines())
    return (f"  {{\n    T p = {p}[{i}], g = {g}[{i}], m = {m}[{i}], v = {v}[{i}];\n{statements}\n"
            f"    {p}[{i}] = p; {m}[{i}] = m; {v}[{i}] = v;\n  }}\n")


def adam_multi_table(device_scalars: bool) -> RowKernel:
    """CUDA multi-tensor Adam over a device table of ``5 * n_tensors`` words (per tensor: the addresses of
    ``p, g, m, v`` and its size) then ``2 * blocks`` (per thread block: its tensor and its first element): each
    block updates one chunk of ``ADAM_CHUNK`` elements of one tensor (PyTorch's ``multi_tensor_apply``). With
    ``device_scalars`` the step scalars ``SS``/``EH`` are read from 1-element float32 device arrays (a step
    recorded in a CUDA graph reads each replay's values), as the per-tensor kernel does."""
    if device_scalars:
        scalars = [("f32", f"{n}_d") for n in ADAM_UPDATE.step_scalars]
        scalars += [("scalar", n) for n in ADAM_UPDATE.scalars]
        loads = "".join(f"  T {n} = (T){n}_d[0];\n" for n in ADAM_UPDATE.step_scalars)
    else:
        scalars, loads = list(_ADAM_SCALARS), ""
    return RowKernel(
        "fg_adam_multi_device" if device_scalars else "fg_adam_multi",
        [("index", "table"), ("long", "n_tensors"), *scalars],
        f"""{loads}
  FG_GLOBAL const FG_LONG* entry = table + 5 * n_tensors + 2 * (FG_LONG)FG_GID;
  FG_GLOBAL const FG_LONG* tensor = table + 5 * entry[0];
  T* p_buf = (T*)tensor[0];
  const T* g_buf = (const T*)tensor[1];
  T* m_buf = (T*)tensor[2];
  T* v_buf = (T*)tensor[3];
  FG_LONG end = entry[1] + {ADAM_CHUNK} < tensor[4] ? entry[1] + {ADAM_CHUNK} : tensor[4];
  for (FG_LONG i = entry[1] + FG_LID; i < end; i += FG_LSIZE)
{_adam_element("p_buf", "g_buf", "m_buf", "v_buf", "i")}""",
    )


ADAM_MULTI_TABLE = adam_multi_table(False)
ADAM_MULTI_TABLE_DEVICE = adam_multi_table(True)


def adam_multi_buffers(count: int) -> RowKernel:
    """Multi-tensor Adam over ``count`` tensors passed as buffers (OpenCL 1.2 has no pointer tables): work-item
    ``i`` of ``total`` finds its tensor by the running ends ``end0 < end1 < ...`` of the tensors' sizes."""
    params: list[tuple[str, str]] = [("long", "total")]
    for k in range(count):
        params += [("out", f"p{k}"), ("long", f"p{k}_off"), ("in", f"g{k}"), ("long", f"g{k}_off"),
                   ("out", f"m{k}"), ("long", f"m{k}_off"), ("out", f"v{k}"), ("long", f"v{k}_off"),
                   ("long", f"end{k}")]
    params += _ADAM_SCALARS
    lines = ["  FG_LONG i = FG_GLOBAL_ID;", "  if (i >= total) return;"]
    for k in range(count):
        start = "0" if k == 0 else f"end{k - 1}"
        test = f"if (i < end{k})" if k < count - 1 else ""
        lines.append(f"  {'else ' if k else ''}{test} {{")
        lines.append(f"  FG_LONG e = i - {start};")
        lines.append(_adam_element(f"(p{k} + p{k}_off)", f"(g{k} + g{k}_off)", f"(m{k} + m{k}_off)",
                                   f"(v{k} + v{k}_off)", "e"))
        lines.append("  }")
    return RowKernel(f"fg_adam_multi{count}", params, "\n".join(lines))


@functools.lru_cache(maxsize=512)  # asked at every launch of a row kernel, with a layer's few sizes
def row_group(cols: int, limit: int) -> int:
    """The power-of-two work-group size for rows of ``cols``: enough to cover a row, at most ``limit``."""
    limit = 1 << (max(1, min(limit, MAX_GROUP)).bit_length() - 1)
    return min(limit, 1 << max(0, (max(cols, 1) - 1).bit_length()))


#: ``param_grad_parts`` sums the columns in one pass (one launch) up to this many rows when the columns give at
#: least ``PARAM_SINGLE_PASS_STRIPS`` work-groups; beyond, it splits the rows so about
#: ``PARAM_TARGET_GROUPS`` work-groups run, and a second launch sums the parts.
PARAM_SINGLE_PASS_ROWS = 1024
PARAM_SINGLE_PASS_STRIPS = 16
PARAM_TARGET_GROUPS = 256


@functools.lru_cache(maxsize=512)  # asked at every column-sum launch, with a layer's few sizes
def param_grad_layout(rows: int, cols: int, group_limit: int) -> tuple[int, int, int, int]:
    """``(width, lanes, parts, chunk)`` for :data:`LAYER_NORM_PARAM_GRADS` on a device whose work-groups take at
    most ``group_limit`` (a power of two) items: strips of ``width`` columns, ``lanes`` rows at a time per column
    (a work-group of ``width * lanes``, at most ``STRIP_GROUP``), the rows in ``parts`` chunks of ``chunk``."""
    group = min(group_limit, STRIP_GROUP)
    width = min(PARAM_STRIP, group)
    lanes = group // width
    return (width, lanes, *param_grad_parts(rows, cols, lanes, width))


def param_grad_parts(rows: int, cols: int, lanes: int = 8, width: int = PARAM_STRIP) -> tuple[int, int]:
    """``(parts, chunk)``: the rows split into ``parts`` chunks of ``chunk`` rows for
    :data:`LAYER_NORM_PARAM_GRADS` run on strips of ``width`` columns with ``lanes`` rows at a time per
    column. One part (no second launch) when the rows are few or the columns alone give the device enough
    work-groups; otherwise enough parts for about ``PARAM_TARGET_GROUPS`` work-groups, each lane still
    summing at least 8 rows."""
    strips = -(-cols // width)
    if rows <= lanes * 8 or (rows <= PARAM_SINGLE_PASS_ROWS and strips >= PARAM_SINGLE_PASS_STRIPS):
        return 1, max(rows, 1)
    parts = max(1, min(-(-rows // (lanes * 8)), -(-PARAM_TARGET_GROUPS // strips)))
    chunk = -(-rows // parts)
    return -(-rows // chunk), chunk


# ---------------------------------------------------------------------------------------------- block max pooling
_POOL_PARAMS = [("long", "n"), ("long", "od"), ("long", "oh"), ("long", "ow"), ("long", "kd"), ("long", "kh"),
                ("long", "kw"), ("in", "x"), ("long", "x_off")]

# Work-item i owns output i of a contiguous (planes, od, oh, ow) result and the kd x kh x kw block of the
# contiguous (planes, od*kd, oh*kh, ow*kw) input under it; the block is scanned in row-major order, a value
# replacing the running maximum where it is greater or NaN (the first maximum wins, the last NaN), as the
# generic ``Backend.max_pool_blocks`` and PyTorch do.
_POOL_BLOCK = """
  FG_LONG i = FG_GLOBAL_ID;
  if (i >= n) return;
  FG_LONG c = i % ow, t = i / ow;
  FG_LONG b = t % oh;
  t /= oh;
  FG_LONG a = t % od, plane = t / od;
  FG_LONG W = ow * kw, H = oh * kh;
  FG_LONG base = x_off + ((plane * od * kd + a * kd) * H + b * kh) * W + c * kw;
  T best = x[base];
  FG_LONG win = 0, k = 0;
  for (FG_LONG p = 0; p < kd; ++p)
    for (FG_LONG q = 0; q < kh; ++q)
      for (FG_LONG r = 0; r < kw; ++r, ++k) {
        T v = x[base + (p * H + q) * W + r];
        if (v > best || isnan(v)) {
          best = v;
          win = k;
        }
      }
"""

#: ``Backend.max_pool_blocks`` for 1-3 spatial dims: one work-item per output (see :func:`pool_blocks_dims`).
MAX_POOL_BLOCKS = RowKernel("fg_max_pool_blocks", [*_POOL_PARAMS, ("out", "y")], _POOL_BLOCK + "  y[i] = best;\n")

#: ``Backend.max_pool_blocks_backward``: one work-item per output finds its block's winner again (no index
#: array kept from the forward) and writes the whole block of ``gx``, ``g`` at the winner and zeros elsewhere,
#: so ``gx`` needs no zero fill.
MAX_POOL_BLOCKS_BACKWARD = RowKernel(
    "fg_max_pool_blocks_backward", [*_POOL_PARAMS, ("in", "g"), ("long", "g_off"), ("out", "gx")],
    _POOL_BLOCK + """
  T gi = g[g_off + i];
  FG_LONG out = base - x_off;
  k = 0;
  for (FG_LONG p = 0; p < kd; ++p)
    for (FG_LONG q = 0; q < kh; ++q)
      for (FG_LONG r = 0; r < kw; ++r, ++k)
        gx[out + (p * H + q) * W + r] = k == win ? gi : (T)0;
""")


def pool_blocks_dims(shape: Sequence[int], kernel: Sequence[int], *dtypes: np.dtype
                     ) -> tuple[tuple[int, ...], list[int]] | None:
    """For the block pooling kernels: the output shape of ``(N, C, *S)`` pooled by ``kernel`` and the kernels'
    ``[od, oh, ow, kd, kh, kw]`` (leading spatial dims of size 1 where ``S`` has fewer than 3), or None when
    ``S`` has more than 3 dims or ``dtypes`` (the operands') are not one of float32/float64."""
    if any(d != dtypes[0] for d in dtypes) or dtypes[0] not in (np.float32, np.float64):
        return None
    nd = len(kernel)
    if not 1 <= nd <= 3 or len(shape) != nd + 2:
        return None
    out = [s // k for s, k in zip(shape[2:], kernel)]
    pad = [1] * (3 - nd)
    return (*shape[:2], *out), pad + out + pad + list(kernel)


# ---------------------------------------------------------------------------------------------- GRU cell
_GRU_PARAMS = [("long", "n"), ("long", "hidden"), ("in", "x"), ("long", "x_off"), ("in", "p"), ("long", "p_off"),
               ("in", "h"), ("long", "h_off")]

# Work-item i owns element (b, j) of the (B, H) state: gate j of each third of the (B, 3H) projections.
_GRU_INDEX = """
  FG_LONG i = FG_GLOBAL_ID;
  if (i >= n) return;
  FG_LONG j = i % hidden, b = i / hidden;
  FG_LONG row3 = b * 3 * hidden, row2 = b * 2 * hidden;
"""


def _gru_term(buf: str, bias: bool, k: str) -> str:
    """Element ``k`` of a projection's row (``xr``/``pr``), plus its bias (``bx``/``bp``) where the kernel has one:
    the projection and its bias add first, as PyTorch's fused GRU cell and the generic default do."""
    row = f"{buf}r[{k}]"
    return f"({row} + b{buf}[b{buf}_off + {k}])" if bias else row


@functools.cache
def gru_cell_forward(has_bx: bool, has_bp: bool) -> RowKernel:
    """``Backend.gru_cell``: ``h'``, ``rz`` and ``n`` of one GRU step in one pass, the biases ``bx``/``bp`` (3H,)
    added in the kernel where given (the generic default's operations and association order, so the values
    match it up to the compiler's contractions)."""
    x0, x1, x2 = (_gru_term("x", has_bx, k) for k in ("j", "hidden + j", "2 * hidden + j"))
    p0, p1, p2 = (_gru_term("p", has_bp, k) for k in ("j", "hidden + j", "2 * hidden + j"))
    biases = [("in", "bx"), ("long", "bx_off")] * has_bx + [("in", "bp"), ("long", "bp_off")] * has_bp
    return RowKernel(
        "fg_gru_cell" + "_bx" * has_bx + "_bp" * has_bp,
        [*_GRU_PARAMS, *biases, ("out", "h_new"), ("out", "rz"), ("out", "n_out")], _GRU_INDEX + f"""
  FG_GLOBAL const T* xr = x + x_off + row3;
  FG_GLOBAL const T* pr = p + p_off + row3;
  T r = (T)1 / (exp(-({x0} + {p0})) + (T)1);
  T z = (T)1 / (exp(-({x1} + {p1})) + (T)1);
  T nv = tanh({x2} + r * {p2});
  T hv = h[h_off + i];
  rz[row2 + j] = r;
  rz[row2 + hidden + j] = z;
  n_out[i] = nv;
  h_new[i] = nv + z * (hv - nv);
""")


@functools.cache
def gru_cell_backward(has_bp: bool, g_pair: bool = False) -> RowKernel:
    """``Backend.gru_cell_backward``: ``gx = [dr, dz, dn]``, ``gp = [dr, dz, dn * r]`` and ``gh = g * z`` in one
    pass (``W_hn h + b_hn`` read from the hidden projection ``p`` plus its bias ``bp`` where given). With
    ``g_pair`` the output gradient arrives as two contributions ``g + g2`` (a pending sum,
    ``LazyEngine._pending_pair_sum``) that the kernel adds and also writes out (``g_sum``)."""
    hn = _gru_term("p", has_bp, "2 * hidden + j")
    pair = [("in", "g2"), ("long", "g2_off")] * g_pair
    store_sum = "\n  g_sum[i] = gv;" if g_pair else ""
    return RowKernel(
        "fg_gru_cell_backward" + "_bp" * has_bp + "_g2" * g_pair,
        [("long", "n"), ("long", "hidden"), ("in", "g"), ("long", "g_off"), *pair, ("in", "rz"), ("long", "rz_off"),
         ("in", "nv"), ("long", "nv_off"), ("in", "h"), ("long", "h_off"), ("in", "p"), ("long", "p_off"),
         *[("in", "bp"), ("long", "bp_off")] * has_bp, ("out", "gx"), ("out", "gp"), ("out", "gh"),
         *[("out", "g_sum")] * g_pair],
        _GRU_INDEX + f"""
  FG_GLOBAL const T* pr = p + p_off + row3;
  T gv = g[g_off + i]{" + g2[g2_off + i]" if g_pair else ""};
  T r = rz[rz_off + row2 + j], z = rz[rz_off + row2 + hidden + j];
  T nn = nv[nv_off + i];
  T hn = {hn};
  T dn = (gv * (-z + (T)1)) * (-(nn * nn) + (T)1);
  T dr = (dn * hn) * (r * (-r + (T)1));
  T dz = (gv * (h[h_off + i] - nn)) * (z * (-z + (T)1));
  gx[row3 + j] = dr;
  gx[row3 + hidden + j] = dz;
  gx[row3 + 2 * hidden + j] = dn;
  gp[row3 + j] = dr;
  gp[row3 + hidden + j] = dz;
  gp[row3 + 2 * hidden + j] = dn * r;
  gh[i] = gv * z;{store_sum}
""")


def gru_layout(arrays: Sequence, biases: Sequence, backward: bool) -> tuple[int, int, list] | None:
    """``(rows, hidden, result shapes)`` of the GRU kernel for ``arrays`` in its argument order (forward
    ``(x, p, h) -> (h', rz, n)``, backward ``(g, rz, n, h, p) -> (gx, gp, gh)``) and ``biases`` (forward
    ``(bx, bp)``, backward ``(bp,)``, each ``(3H,)`` or None), or None (the generic default runs) unless the
    state ``h`` is ``(B, H)`` with ``H > 0`` and every array is float32/float64 of one dtype and of its
    expected shape."""
    h_shape = tuple(arrays[-2 if backward else -1].shape)
    dtype = arrays[0].dtype
    if len(h_shape) != 2 or not h_shape[-1] or dtype not in (np.float32, np.float64):
        return None
    rows, hidden = h_shape
    state, two, three = (rows, hidden), (rows, 2 * hidden), (rows, 3 * hidden)
    shapes, results = ([state, two, state, state, three], [three, three, state]) if backward else (
        [three, three, state], [state, two, state])
    # every array's dtype and shape compared in C calls (this runs at every step of an unrolled GRU, twice)
    if list(map(_dtype_of, arrays)) != [dtype] * len(arrays) or list(map(tuple, map(_shape_of, arrays))) != shapes:
        return None
    for b in biases:
        if b is not None and (b.dtype != dtype or tuple(b.shape) != (3 * hidden,)):
            return None
    return rows, hidden, results


def gru_kernel(biases: Sequence, backward: bool, g_pair: bool = False) -> RowKernel:
    """The GRU kernel for ``biases`` (forward ``(bx, bp)``, backward ``(bp,)``, None where absent; ``g_pair``:
    the backward's output gradient as two contributions, see ``gru_cell_backward``)."""
    if backward:
        return gru_cell_backward(biases[0] is not None, g_pair)
    return gru_cell_forward(biases[0] is not None, biases[1] is not None)
