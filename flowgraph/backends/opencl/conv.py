"""Implicit-GEMM convolution kernels for the OpenCL backend: forward, input gradient, weight gradient.

A convolution in PyTorch's layout (``x`` ``(N, C_in, *S)``, ``w`` ``(C_out, C_in / groups, *K)``, symmetric zero
padding, stride, dilation, groups; 1-3 spatial dims) is three GEMMs per group, none of which needs an im2col
buffer in global memory: the operand that im2col would materialise is gathered straight from the input while a
tile of it is staged in local memory.

=============  ========================  ===========================  ====================================
op             rows (M)                  columns (N)                  reduction (K)
=============  ========================  ===========================  ====================================
``forward``    ``C_out/g`` (``co``)      ``N * prod(out)`` (n, o)     ``C_in/g * prod(K)`` (ci, k): ``x``
``dgrad``      ``C_in/g`` (``ci``)       ``N * prod(S)`` (n, i)       ``C_out/g * prod(K)`` (co, k): ``g``
``wgrad``      ``C_out/g`` (``co``)      ``C_in/g * prod(K)`` (ci, k) ``N * prod(out)`` (n, o): ``g``, ``x``
=============  ========================  ===========================  ====================================

* ``forward``: ``A = w`` (rows of the weight, read contiguously), ``B[(ci, k), (n, o)] = x[n, ci, o*s - p + k*d]``
  (zero outside the input: that is the zero padding).
* ``dgrad`` is the gather form of the transposed problem: ``B[(co, k), (n, i)] = g[n, co, (i + p - k*d) / s]``
  where that division is exact and lands inside the output, else zero; ``A[ci, (co, k)] = w[co, ci, k]``. It
  runs once per stride phase (:func:`phase_args`), pairing the input positions of one residue class with only
  the kernel offsets that reach them. Every input element is written by exactly one work-item, so no atomics and
  no zero-fill are needed.
* ``wgrad`` reduces over ``N * prod(out)``, which is long while the weight is small: the reduction is split over
  ``splits`` work-groups per output tile (split-K, the grid's z index carries ``group + groups * split``), each
  writing its own slice of a partial buffer that the backend's reduction then sums. ``forward`` splits the same
  way where its output is small (a small batch of small feature maps) and its reduction long.

The tile scheme is the backend's register-blocked matmul's (``kernels.matmul_source``), made rectangular:
a work-group of ``tx * ty`` work-items computes a ``(ty * wy) x (tx * wx)`` tile, each work-item ``wy * wx``
accumulators; ``depth``-deep slices of A and B are staged in local memory (A padded by one column so the
transposing store is free of bank conflicts). Each work-item loads the same B column at every K step, so the
column's decomposition into (n, o) (or (ci, k)) is done once, outside the K loop. The slices are read from global
memory one step ahead into registers, so their latency overlaps the current step's arithmetic. Tile sizes, the
dtype, the spatial rank, the index type and the tile configuration are the only things in the source; every
size, stride, padding, dilation, stride phase and the group count are kernel arguments, so one binary serves
every shape of a rank.

On NVIDIA GPUs of compute capability 8.0 or later, float32 kernels under ``fg.backends.cudnn.allow_tf32`` run
the multiply on the tensor cores (``conv_source(tf32=True)``): NVIDIA's OpenCL compiler passes inline PTX
through, so the slices are rounded to TF32 as they are staged and each warp accumulates its block of the tile
with ``mma.sync`` (:func:`mma_warps`, :data:`GPU_TF32_TILES`).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

from ...errors import ShapeError
from ..fusion import decompose
from .kernels import KernelSource, OpenCLEmitter, Params, assemble, ctype

#: The deepest tile's K step (every tile table's depth divides it). The table-free variants need their step's
#: rows to share one kernel offset (``channels_inner``: a multiple of this many reduced channels per group) or
#: one run of output positions (``row_runs``: the output's last size a multiple of it).
STEP_MULTIPLE = 16
#: The three implicit-GEMM problems of a convolution (see the module docstring).
OPS = ("forward", "dgrad", "wgrad")
_INT = np.dtype(np.int32)


class ConvTiles(NamedTuple):
    """One tile configuration: ``tx * ty`` work-items, each computing ``wy`` rows by ``wx`` columns, K staged
    ``depth`` deep. ``tile_m = ty * wy`` rows and ``tile_n = tx * wx`` columns per work-group."""

    tx: int
    ty: int
    wx: int
    wy: int
    depth: int

    @property
    def group(self) -> int:
        """Work-items per work-group."""
        return self.tx * self.ty

    @property
    def tile_m(self) -> int:
        """Output rows per work-group."""
        return self.ty * self.wy

    @property
    def tile_n(self) -> int:
        """Output columns per work-group."""
        return self.tx * self.wx

    def local_bytes(self, itemsize: int, pad: int = 1) -> int:
        """Local memory the two staged slices (each padded by ``pad`` columns: 1 for the scalar kernel, 8 for
        the tensor-core one), the per-row tables (at most 40 bytes a row) and the per-column table (at most 32
        bytes a column) take."""
        return self.depth * (((self.tile_m + pad) + (self.tile_n + pad)) * itemsize + 40) + 32 * self.tile_n

    def valid(self) -> bool:
        """Whether each work-item keeps one B column for the whole K loop (the kernel relies on it)."""
        return self.group % self.tile_n == 0 and self.depth % (self.group // self.tile_n) == 0


#: Configurations per device kind and problem height (M > 32 tall, 9-32 mid, 2-8 short, 1 single). GPUs: 256 (128)
#: work-items with 4x4 (2x4) outputs each, the classic register-blocked shape. The CPU (PoCL runs a work-group
#: as loops over its work-items, vectorised across ``tx``) wants much more work per work-item: 8x8 outputs ran
#: 2-5x faster than 4x4 on PoCL (docs/opencl.md), and short problems keep the 128-wide column tile.
GPU_TILES = {
    "huge": ConvTiles(16, 16, 8, 8, 16),   # 128 x 128, where there are enough such tiles to fill the device
    "tall": ConvTiles(16, 16, 4, 4, 16),   # 64 x 64
    "mid": ConvTiles(16, 8, 4, 4, 16),     # 32 x 64
    "short": ConvTiles(32, 8, 4, 2, 16),   # 16 x 128
    "single": ConvTiles(256, 1, 1, 1, 16),  # 1 x 256: one row (depthwise with multiplier 1)
}
#: The tensor-core instruction of the TF32 kernels: a warp multiplies a 16x8 A fragment by an 8x8 B fragment
#: into a 16x8 float32 accumulator (PTX ``mma.sync``, sm_80 and later).
MMA_M, MMA_N, MMA_K = 16, 8, 8
#: Columns the TF32 kernels pad each staged slice by: a row of the slice is then 8 banks (mod 32) from the
#: next, so the 32 lanes of a fragment read (8 rows x 4 reduction steps) hit 32 different banks.
MMA_PAD = 8


def swizzle(k: int | str, depth: int) -> int | str:
    """The XOR a TF32 kernel applies to the column of reduction row ``k`` of a slice staged by rows
    (``As[k][m ^ swizzle(k)]``): the rows' columns permuted within blocks of 8, by ``k // 4``.

    A transposing store has each warp write ``32 / depth`` columns of ``depth`` consecutive rows; with rows 8
    banks apart (MMA_PAD) rows ``k`` and ``k + 4`` of one column share a bank, a 4-way conflict at depth 16
    (8-way at 32). The XOR moves those rows to different banks of their 8-column block; a fragment read
    (rows ``k0 + tq``, ``k0`` a multiple of 4, and 8 consecutive columns from a multiple of 8) sees one XOR
    constant, which permutes its 8 columns among themselves: both stay conflict-free. ``k`` an int gives the
    constant, a C expression gives C."""
    rows_per_warp = max(1, 32 // depth)
    if isinstance(k, int):
        return ((k >> 2) * rows_per_warp) & 7
    return f"((({k}) >> 2) * {rows_per_warp} & 7)"


#: Tensor-core (TF32) kernels' tiles where they differ from GPU_TILES, per op, for the large problems. Measured on
#: an H200's convnet step (eager, TF32 kernels, `benchmarks.opencl_profile` and per-op sweeps) against the
#: GPU_TILES pair (128 x 128 / 64 x 64, 256 work-items): the forward 128 x 256 with 512 work-items (warp blocks of
#: 32 x 64; 2.00 -> 1.71 ms), the input gradient 64 x 128 (2.86 -> 2.06 ms; 128 x 256 ran 2.70), the weight
#: gradient 128 x 64 (3.24 -> 2.80 ms; 128 x 128 with 256 work-items, 3.96). The input gradient's huge class,
#: 64 x 256 with 256 work-items, where those tiles still give each compute unit two work-groups (convnet's
#: second layer's, 0.38 -> 0.29 ms; on the 8x8 and 4x4 layers, with half the work-groups, it ran 0.35-0.37 ms
#: against 0.25-0.37).
GPU_TF32_TILES = {
    "forward": {"huge": ConvTiles(32, 16, 8, 8, 16), "tall": ConvTiles(32, 16, 8, 8, 16)},
    "dgrad": {"huge": ConvTiles(32, 8, 8, 8, 16), "tall": ConvTiles(32, 8, 4, 8, 16)},
    "wgrad": {"huge": ConvTiles(16, 16, 4, 8, 16), "tall": ConvTiles(16, 16, 4, 8, 16)},
}
CPU_TILES = {
    "huge": ConvTiles(16, 8, 8, 8, 16),    # 64 x 128
    "tall": ConvTiles(16, 8, 8, 8, 16),    # 64 x 128
    "mid": ConvTiles(16, 8, 8, 2, 16),     # 16 x 128
    "short": ConvTiles(16, 8, 8, 1, 16),   # 8 x 128
    "single": ConvTiles(128, 1, 1, 1, 16),  # 1 x 128
}


def tile_class(is_gpu: bool, m: int, n: int, groups: int, compute_units: int,
               huge: ConvTiles | None = None) -> str:
    """The row class of a problem of ``m`` rows and ``n`` columns per group: ``huge`` (large tiles, only where
    they still give every compute unit two work-groups), ``tall`` (m > 32), ``mid`` (9-32), ``short`` (2-8) or
    ``single`` (one row: a depthwise convolution's forward and input gradient). ``huge``: the tiles of that
    class where the kernel has its own (GPU_TF32_TILES), else the device kind's table's."""
    if huge is None:
        huge = (GPU_TILES if is_gpu else CPU_TILES)["huge"]
    if m >= huge.tile_m and -(-m // huge.tile_m) * -(-n // huge.tile_n) * groups >= 2 * compute_units:
        return "huge"
    return "tall" if m > 32 else "mid" if m > 8 else "short" if m > 1 else "single"


@functools.lru_cache(maxsize=256)
def choose_tiles(is_gpu: bool, max_group: int, local_mem: int, itemsize: int, row_class: str,
                 tf32_op: str | None = None) -> ConvTiles:
    """The tile configuration for a problem of ``row_class`` (see :func:`tile_class`) on a device with these
    properties: the entry of the device kind's table where it fits ``max_group`` work-items and ``local_mem``
    bytes, else the largest tile (then the deepest, then the widest work-group) among its halvings that does.
    ``tf32_op``: the op of a tensor-core kernel, whose entry comes from GPU_TF32_TILES where that has one and
    whose slices are padded by MMA_PAD columns. Memoised: the search over every halving ran on each
    convolution (5 ms a call on PoCL)."""
    base = (GPU_TILES if is_gpu else CPU_TILES)[row_class]
    pad = 1
    if is_gpu and tf32_op is not None:
        base = GPU_TF32_TILES.get(tf32_op, {}).get(row_class, base)
        pad = MMA_PAD

    def halvings(n: int) -> list[int]:
        return [n >> i for i in range(n.bit_length())]

    fitting = [t for t in map(ConvTiles._make, itertools.product(*(halvings(n) for n in base)))
               if t.valid() and t.group <= max_group and t.local_bytes(itemsize, pad) <= local_mem]
    return max(fitting, key=lambda t: (t.tile_m * t.tile_n, t.depth, t.group))


def mma_warps(tiles: ConvTiles) -> tuple[int, int] | None:
    """How the TF32 kernel splits ``tiles``' output tile among its warps: ``(warp rows, warp columns)``, each
    warp computing a ``tile_m / rows x tile_n / cols`` block of whole 16x8 fragments, the squarest such split
    (fewest fragment reads from local memory per multiply); ``None`` where the tile has no such split (fewer
    than 16 rows, a work-group that is not whole warps, a slice depth that is not whole 8-steps)."""
    if tiles.group % 32 or tiles.depth % MMA_K or tiles.tile_m % MMA_M or tiles.tile_n % (2 * MMA_N):
        return None
    warps = tiles.group // 32
    splits = [(r, warps // r) for r in range(1, warps + 1) if warps % r == 0
              and (tiles.tile_m // MMA_M) % r == 0 and (tiles.tile_n // MMA_N) % (warps // r) == 0]
    if not splits:
        return None
    return min(splits, key=lambda rc: (tiles.tile_m // rc[0] + tiles.tile_n // rc[1], rc[0]))


#: Rounds a float32 to TF32 (round to nearest, ties away: what cuDNN and cuBLAS feed their tensor cores), as
#: the float32 whose bits the ``mma`` instruction reads. NVIDIA's OpenCL compiler passes inline PTX through.
_TF32_HELPER = """inline float fg_tf32(float x) {
  uint r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return as_float(r);
}
"""


def geometry_names(nd: int) -> list[str]:
    """The per-dim geometry arguments, in order: input sizes, output sizes, kernel sizes, stride, padding,
    dilation (``S0.. O0.. K0.. st0.. pd0.. dl0..``)."""
    return [f"{name}{j}" for name in ("S", "O", "K", "st", "pd", "dl") for j in range(nd)]


def phase_names(nd: int) -> list[str]:
    """The input gradient's per-phase arguments, in order: ``UP`` (input positions of the phase per image),
    ``KCP`` (kernel offsets of the phase), then per dim ``U`` (positions), ``kc`` (offsets), ``cb``, ``e``,
    ``k0``, ``ks``, ``f`` (see :func:`phase_args`)."""
    return ["UP", "KCP"] + [f"{name}{j}" for name in ("U", "kc", "cb", "e", "k0", "ks", "f") for j in range(nd)]


def phase_args(geo: ConvGeometry) -> list[list[int]]:
    """The input gradient's stride phases: per combination of residues ``r_j < stride_j``, the arguments of
    :func:`phase_names` (phases without input positions are left out).

    Input positions ``i = f + st*u`` (``u < U``) are those with ``(i + pd) % st == r``; the kernel offsets that
    reach them are ``k = k0 + ks*m`` (``m < kc``), those with ``k*dl % st == r`` (an arithmetic progression of
    step ``st / gcd(st, dl)``). For such a pair ``o = (i + pd - k*dl) / st = cb + u - m*e`` exactly, with
    ``cb = (f + pd - k0*dl) / st`` and ``e = ks*dl / st``. A phase with no offsets (``kc = 0``) still runs: its
    positions get a zero gradient. With stride 1 there is one phase: ``f = 0, U = S, k0 = 0, ks = 1, kc = K``.
    """
    per_dim = []
    for s, k, st, pd, dl in zip(geo.spatial, geo.kernel, geo.stride, geo.padding, geo.dilation):
        options = []
        for r in range(st):
            f = (r - pd) % st
            u = max(0, -(-(s - f) // st))
            offsets = [kk for kk in range(k) if (kk * dl - r) % st == 0]
            k0 = offsets[0] if offsets else 0
            ks = st // math.gcd(st, dl)
            cb = (f + pd - k0 * dl) // st
            options.append((u, len(offsets), cb, ks * dl // st, k0, ks, f))
        per_dim.append(options)
    phases = []
    for combo in itertools.product(*per_dim):
        if all(c[0] > 0 for c in combo):
            fields = list(zip(*combo))  # U, kc, cb, e, k0, ks, f: one tuple of nd values each
            phases.append([math.prod(fields[0]), math.prod(fields[1])] + [v for values in fields for v in values])
    return phases


def _indent(lines: list[str], depth: int) -> list[str]:
    """``lines`` indented by ``depth`` levels of two spaces."""
    return [("  " * depth) + line for line in lines]


def _inside(coords: str, dims: str, nd: int, itype: str) -> str:
    """``0 <= coords_j < dims_j`` for every j, one unsigned compare each (a negative coordinate wraps to a
    value above any size)."""
    return " && ".join(f"(u{itype}){coords}{j} < (u{itype}){dims}{j}" for j in range(nd))


def _vector4(itype: str, first: str, coords: str, nd: int) -> str:
    """The table entry ``(first, coords_0, .., coords_{nd-1})`` as one ``itype``4 vector, zero-padded."""
    return f"({itype}4)({', '.join([first, *(f'{coords}{j}' for j in range(nd)), *['0'] * (3 - nd)])})"


def _operands(op: str) -> tuple[str, str, str]:
    """(output, first input, second input) buffer names of ``op``, in argument order."""
    return {"forward": ("y", "x", "w"), "dgrad": ("gx", "g", "w"), "wgrad": ("gw", "x", "g")}[op]


def _strides(name: str, dims: str, nd: int, itype: str) -> list[str]:
    """C lines giving ``{name}j``, the row-major strides (in elements, of C type ``itype``) of the sizes
    ``{dims}j``."""
    lines = [f"{itype} {name}{nd - 1} = 1;"]
    for j in range(nd - 2, -1, -1):
        lines.append(f"{itype} {name}{j} = {name}{j + 1} * {dims}{j + 1};")
    return lines


def _dot(coords: str, strides: str, nd: int) -> str:
    """``coords0 * strides0 + ...``."""
    return " + ".join(f"{coords}{j} * {strides}{j}" for j in range(nd))


def _problem(op: str, nd: int, itype: str, acc_t: str) -> dict[str, list[str]]:
    """The op-specific pieces of the GEMM template.

    Every B element is ``src[colbase + roff]`` where the per-dim coordinates ``b_j`` (the column's part)
    plus ``rk_j`` (the reduction row's part) fall inside the source (``roff`` and ``rk_j`` come from ``Rt``, a
    per-row table of 4-vectors ``(roff, rk_0, rk_1, rk_2)``, read with one local load; the tables are what the
    work-group builds in local memory once per K step, so the divisions that split a reduction index are paid
    ``depth`` times per step, not once per element). ``column``: lines run once per work-item for its B column
    ``gc``, setting ``colbase`` and ``b_j``; ``row``: lines for reduction index ``gk`` setting ``roff``, ``rk_j``
    and (where A needs it) ``aoff``; ``load_a``/``load_b``: lines setting ``va`` (A row ``gm``, table slot ``ak``,
    reduction index ``gk``) and ``vb`` (table slot ``bk``); ``store``: lines writing ``v`` at ``row``, ``col``.
    The input gradient runs once per stride phase (:func:`phase_args`), so it never visits a kernel offset that
    cannot reach an input position, and needs no divisibility test.
    """
    rk = [f"rt.s{j + 1}" for j in range(nd)]
    row_entry = f"{itype}4 rt = Rt[bk];"
    if op == "forward":
        return {
            "column": [f"{itype} n = gc / P, p = gc - n * P;", *decompose("p", "O", "o", nd, itype),
                       *[f"{itype} b{j} = o{j} * st{j} - pd{j};" for j in range(nd)],
                       f"{itype} colbase = x_off + (n * Cin + grp * Cin_g) * SP + {_dot('b', 'Ss', nd)};"],
            "row": [f"{itype} ci = gk / KP, kr = gk - ci * KP;", *decompose("kr", "K", "k", nd, itype),
                    *[f"{itype} rk{j} = k{j} * dl{j};" for j in range(nd)],
                    f"{itype} roff = ci * SP + {_dot('rk', 'Ss', nd)};"],
            "load_a": [f"va = ({acc_t})w[w_off + (grp * Cout_g + gm) * K + gk];"],
            "load_b": [row_entry, *[f"{itype} i{j} = b{j} + {rk[j]};" for j in range(nd)],
                       f"if ({_inside('i', 'S', nd, itype)}) vb = ({acc_t})x[colbase + rt.s0];"],
            "store": [f"{itype} n = col / P, p = col - n * P;",
                      "y[y_off + split * ssplit + (n * Cout + grp * Cout_g + row) * P + p] = "
                      "STORE(v);"],
        }
    if op == "dgrad":
        # one stride phase: input positions i = f + st*u; kernel offsets k = k0 + ks*m, the ones whose
        # i + pd - k*dl is a multiple of st; then o = cb + u - m*e with cb, e exact (see phase_args)
        return {
            "column": [f"{itype} n = gc / UP, q = gc - n * UP;", *decompose("q", "U", "u", nd, itype),
                       *[f"{itype} b{j} = cb{j} + u{j};" for j in range(nd)],
                       f"{itype} colbase = g_off + (n * Cout + grp * Cout_g) * P + {_dot('b', 'Os', nd)};"],
            "row": [f"{itype} co = gk / KCP, kr = gk - co * KCP;", *decompose("kr", "kc", "m", nd, itype),
                    *[f"{itype} rk{j} = m{j} * e{j};" for j in range(nd)],
                    f"{itype} roff = co * P - ({_dot('rk', 'Os', nd)});",
                    f"{itype} aoff = co * Cin_g * KP + {_phase_kernel_index(nd)};"],
            "load_a": [f"va = ({acc_t})w[w_off + grp * Cout_g * Cin_g * KP + gm * KP + Aoff[ak]];"],
            "load_b": [row_entry, *[f"{itype} o{j} = b{j} - {rk[j]};" for j in range(nd)],
                       f"if ({_inside('o', 'O', nd, itype)}) vb = ({acc_t})g[colbase + rt.s0];"],
            "store": [f"{itype} n = col / UP, q = col - n * UP;", *decompose("q", "U", "u", nd, itype),
                      *[f"{itype} i{j} = f{j} + st{j} * u{j};" for j in range(nd)],
                      f"gx[gx_off + (n * Cin + grp * Cin_g + row) * SP + "
                      f"{_dot('i', 'Ss', nd)}] = STORE(v);"],
        }
    return {  # wgrad
        "column": [f"{itype} ci = gc / KP, kr = gc - ci * KP;", *decompose("kr", "K", "k", nd, itype),
                   *[f"{itype} b{j} = k{j} * dl{j} - pd{j};" for j in range(nd)],
                   f"{itype} colbase = x_off + (grp * Cin_g + ci) * SP + {_dot('b', 'Ss', nd)};"],
        "row": [f"{itype} n = gk / P, p = gk - n * P;", *decompose("p", "O", "o", nd, itype),
                *[f"{itype} rk{j} = o{j} * st{j};" for j in range(nd)],
                f"{itype} roff = n * Cin * SP + {_dot('rk', 'Ss', nd)};",
                f"{itype} aoff = n * Cout * P + p;"],
        "load_a": [f"va = ({acc_t})g[g_off + (grp * Cout_g + gm) * P + Aoff[ak]];"],
        # B is staged by rows here (see conv_source): the column's part comes from the column table
        "load_b": [row_entry, f"{itype}4 ct = Cr[l];", *[f"{itype} i{j} = ct.s{j + 1} + {rk[j]};" for j in range(nd)],
                   f"if ({_inside('i', 'S', nd, itype)}) vb = ({acc_t})x[ct.s0 + rt.s0];"],
        "store": ["gw[gw_off + split * ssplit + (grp * Cout_g + row) * N + col] = STORE(v);"],
    }


def _phase_kernel_index(nd: int) -> str:
    """The flat kernel index ``sum_j (k0_j + m_j * ks_j) * Ks_j`` of an input-gradient phase's offset ``m``."""
    return " + ".join(f"(k0{j} + m{j} * ks{j}) * Ks{j}" for j in range(nd))


def _channels_inner_pieces(op: str, nd: int, itype: str, acc_t: str) -> dict[str, list[str]]:
    """The pieces of a ``channels_inner`` kernel (``forward`` or ``dgrad``, see :func:`conv_source`) that replace
    the row table's.

    ``step``: lines run once per work-item and K step, from the step's first reduction index ``tk``: its kernel
    offset (one per step, channels being innermost), its first channel ``c0``, ``in_window`` (whether this
    work-item's B column meets the source at that offset) and ``base``, the source offset of the column's
    element of channel ``c0``; ``load_b``: B slot ``bk`` (channel ``c0 + bk``) read from ``base``, one channel
    stride per slot. The forward's A is the weight ``(C_out, *K, C_in / groups)`` read as it is (``_problem``'s
    ``load_a``); the input gradient's ``load_a`` reads the weight copied to ``(groups, C_in / groups, *K,
    C_out / groups)`` from ``abase``, the step's element of row 0: consecutive slots ``ak`` are consecutive
    channels.
    """
    channels = "Cin_g" if op == "forward" else "Cout_g"
    split = f"{itype} kk = tk / {channels}, c0 = tk - kk * {channels};"
    if op == "forward":  # offset k: input position i = b + k*dl
        return {
            "step": [split, *decompose("kk", "K", "k", nd, itype),
                     *[f"{itype} rk{j} = k{j} * dl{j}, i{j} = b{j} + rk{j};" for j in range(nd)],
                     f"bool in_window = col_ok && {_inside('i', 'S', nd, itype)};",
                     f"{itype} base = colbase + c0 * SP + {_dot('rk', 'Ss', nd)};"],
            "load_b": [f"vb = ({acc_t})x[base + bk * SP];"],
        }
    # dgrad: the phase's offset m (kernel offset k0 + m*ks), output position o = b - m*e
    return {
        "step": [split, *decompose("kk", "kc", "m", nd, itype),
                 *[f"{itype} rk{j} = m{j} * e{j}, o{j} = b{j} - rk{j};" for j in range(nd)],
                 f"bool in_window = col_ok && {_inside('o', 'O', nd, itype)};",
                 f"{itype} base = colbase + c0 * P - ({_dot('rk', 'Os', nd)});",
                 f"{itype} abase = w_off + (grp * Cin_g * KP + {_phase_kernel_index(nd)}) * Cout_g + c0;"],
        "load_a": [f"va = ({acc_t})w[abase + gm * KP * Cout_g + ak];"],
        "load_b": [f"vb = ({acc_t})g[base + bk * P];"],
    }


def _row_run_pieces(nd: int, itype: str, acc_t: str) -> dict[str, list[str]]:
    """The pieces of a ``row_runs`` weight gradient (see :func:`conv_source`) that replace the row table's.

    ``step``: lines run once per work-item and K step, from the step's first reduction index ``tk``: its batch
    index ``n`` and first output position ``o_j``; ``abase``, the step's first A element past its row, and
    ``rbase``, the offset of its first B element past its column's table entry. ``load_a``: slot ``ak`` of the
    step is the A element ``ak`` past the step's first (the step's positions are consecutive in ``g``).
    ``load_b``: slot ``bk`` is output position ``o + (dy, dx)`` in the last two dims, ``dy = bk >> rsh`` rows
    and ``dx = bk & rmask`` columns on: ``rsh`` is 30 where the last size is a multiple of 16 (a step is part
    of one row: ``dy = 0``, ``dx = bk``), else its log2 (it divides 16: a step is ``16 / O_last`` whole rows)."""
    last = nd - 1
    coords = [f"{itype} i{j} = ct.s{j + 1} + o{j} * st{j};" for j in range(last - 1)]
    if nd == 1:
        shift, run = [], "dx * st0"
        coords.append(f"{itype} dx = bk, i0 = ct.s1 + (o0 + dx) * st0;")
    else:
        shift = [f"int rsh = (O{last} & 15) ? 31 - (int)clz((int)O{last}) : 30, rmask = (1 << rsh) - 1;"]
        coords += [f"{itype} dy = bk >> rsh, dx = bk & rmask;",
                   f"{itype} i{last - 1} = ct.s{last} + (o{last - 1} + dy) * st{last - 1};",
                   f"{itype} i{last} = ct.s{last + 1} + (o{last} + dx) * st{last};"]
        run = f"dy * st{last - 1} * Ss{last - 1} + dx * st{last}"
    run_offset = " + ".join(f"o{j} * st{j} * Ss{j}" for j in range(nd))  # input offset of o at kernel offset 0
    return {
        "step": [f"{itype} n = tk / P, p0 = tk - n * P;", *decompose("p0", "O", "o", nd, itype),
                 f"{itype} abase = g_off + n * Cout * P + p0;",
                 f"{itype} rbase = n * Cin * SP + {run_offset};", *shift],
        "load_a": [f"va = ({acc_t})g[abase + (grp * Cout_g + gm) * P + ak];"],
        "load_b": [f"{itype}4 ct = Cr[l];", *coords,
                   f"if ({_inside('i', 'S', nd, itype)}) vb = ({acc_t})x[ct.s0 + rbase + {run}];"],
    }


def conv_source(op: str, nd: int, dtype: np.dtype, acc_dtype: np.dtype, index_dtype: np.dtype,
                tiles: ConvTiles, tf32: bool = False, bias: bool = False,
                channels_inner: bool = False, row_runs: bool = False) -> KernelSource:
    """The implicit-GEMM kernel ``op`` (one of :data:`OPS`) for ``nd`` spatial dims of ``dtype``, accumulating in
    ``acc_dtype``, with index arithmetic in ``index_dtype`` (int32 where every size and offset fits, else int64;
    offsets, strides and the row tables are of that type too).

    Arguments, in order: ``M, N, K, kchunk, groups`` (the per-group GEMM and the reduction slice of one split),
    ``Cin, Cout, Cin_g, Cout_g, P, SP, KP`` (channels, ``prod(out)``, ``prod(S)``, ``prod(K)``), the
    :func:`geometry_names`, for ``dgrad`` the :func:`phase_names`, then the output buffer with its element offset
    and ``ssplit`` (the elements between the partial results of two splits; split-K runs write their own
    slices of a partial buffer), then the two inputs, each with its element offset. Launch:
    global ``(ceil(N / tile_n) * tx, ceil(M / tile_m) * ty, groups * splits)``, local ``(tx, ty, 1)``.

    ``tf32`` (float32 only, NVIDIA devices of compute capability 8.0 or later, tiles that :func:`mma_warps`
    splits): the staged slices are rounded to TF32 and multiplied on the tensor cores, each warp accumulating
    its block of the tile with ``mma.sync`` in inline PTX, the precision cuDNN gives a float32 convolution under
    ``fg.backends.cudnn.allow_tf32``. Staging, tables and stores are the scalar kernel's.

    ``bias`` (``forward`` only, one split): a last buffer argument ``bias`` with its element offset, ``(C_out,)``
    of ``dtype``, added to each output channel as the result is stored (a biased layer's forward in one pass).

    ``channels_inner`` (``forward`` and ``dgrad``): the reduction runs channels innermost, the forward's over
    ``(k, ci)`` instead of ``(ci, k)`` with the weight argument laid out ``(C_out, *K, C_in / groups)``, the input
    gradient's over ``(m, co)`` (its phase's kernel offsets, then output channels) instead of ``(co, m)`` with the
    weight argument laid out ``(groups, C_in / groups, *K, C_out / groups)``; for a multiple of ``depth``
    reduced channels per group, so each K step reads one kernel offset of ``depth`` consecutive channels. The
    step's offset and each column's bounds test are then worked out once per work-item and step, and each B
    element is one read at a multiple of the channel stride: no row table, no per-element test
    (:func:`_channels_inner_pieces`).

    ``row_runs`` (``wgrad`` only): every K step is one run of ``depth`` consecutive output positions: part of one
    row where the output's last size is a multiple of ``depth``, whole rows of one plane where it divides
    ``depth`` and the last two sizes' product is a multiple of it (the backend asks for 16, the deepest tile).
    The step's batch index and output position are worked out once per work-item and step; the A elements
    (``g``) are then consecutive from one base and each B element (``x``) is its column's entry (in registers)
    plus that base and the slot's row and column steps: no row or A-offset table.
    """
    if bias and op != "forward":
        raise ValueError(f"conv_source: bias is the forward kernel's option, not {op!r}")
    if channels_inner and op == "wgrad":
        raise ValueError("conv_source: channels_inner is an option of the forward and the input gradient, not 'wgrad'")
    if row_runs and op != "wgrad":
        raise ValueError(f"conv_source: row_runs is the weight gradient's option, not {op!r}")
    emitter = OpenCLEmitter()
    itype = ctype(index_dtype)
    acc_t = ctype(acc_dtype)
    tx, ty, wx, wy, depth = tiles
    group, tm, tn = tiles.group, tiles.tile_m, tiles.tile_n
    bstep = group // tn
    # The weight gradient's B (the input, gathered at (ci, k) columns) is contiguous along the reduction, not
    # along columns: it is staged by rows (consecutive work-items take consecutive reduction indices, so global
    # reads coalesce), with every column's split kept in a local table built once; Bs is padded against bank
    # conflicts of that transposing store. The other ops stage B by columns, one column per work-item.
    b_rows = op == "wgrad"
    warps = mma_warps(tiles) if tf32 else None
    if tf32 and (warps is None or dtype != np.float32 or acc_dtype != np.float32):
        raise ValueError(f"conv_source: no TF32 kernel for {dtype} with tiles {tiles} (float32, and tiles that "
                         "mma_warps splits into whole warps of 16x8 fragments)")
    pad = MMA_PAD if tf32 else 1
    rounded = "fg_tf32" if tf32 else ""
    params = Params()
    for name in ("M", "N", "K", "kchunk", "groups", "Cin", "Cout", "Cin_g", "Cout_g", "P", "SP", "KP",
                 *geometry_names(nd), *(phase_names(nd) if op == "dgrad" else ())):
        params.scalar(index_dtype, name)
    out_name, first, second = _operands(op)
    params.buffer(dtype, out_name, const=False)
    params.scalar(index_dtype, f"{out_name}_off")
    params.scalar(index_dtype, "ssplit")
    for name in (first, second) + (("bias",) if bias else ()):
        params.buffer(dtype, name, const=True)
        params.scalar(index_dtype, f"{name}_off")
    pieces = _problem(op, nd, itype, acc_t)
    if bias:  # v is the accumulated sum of the output element at (row, col): its channel's bias joins it
        pieces["store"] = [f"v += ({acc_t})bias[bias_off + grp * Cout_g + row];", *pieces["store"]]
    tabled = not (channels_inner or row_runs)  # the kernel splits each step's rows into the Rt table
    if channels_inner:
        pieces.update(_channels_inner_pieces(op, nd, itype, acc_t))
    if row_runs:
        pieces.update(_row_run_pieces(nd, itype, acc_t))
    has_aoff = tabled and any("aoff" in line for line in pieces["row"])
    zero = f"({acc_t})0"
    # elements of A and B each work-item stages per step
    n_a, n_b = -(-tm * depth // group), (-(-tn * depth // group) if b_rows else depth // bstep)
    a_partial, b_partial = tm * depth % group != 0, b_rows and tn * depth % group != 0

    def tables(t: str) -> list[str]:
        """Split the reduction rows ``t .. t + depth`` into the local tables (``depth`` work-items)."""
        return [
            f"for (int r = tid; r < {depth}; r += {group}) {{",
            f"  {itype} gk = {t} + r;",
            "  if (gk < kend) {",
            *_indent(pieces["row"], 2),
            f"    Rt[r] = {_vector4(itype, 'roff', 'rk', nd)};",
            *(["    Aoff[r] = aoff;"] if has_aoff else []),
            "  }",
            "}",
        ]

    def loads(t: str) -> list[str]:
        """Read this work-item's share of the A and B slices at reduction step ``t`` into registers."""
        step = [] if tabled else [f"{itype} tk = {t};", *pieces["step"]]  # the table-free variants' step
        return [*step, *loads_a(t), *loads_b(t)]

    def loads_a(t: str) -> list[str]:
        """This work-item's A elements of the slice at reduction step ``t``, into ``ra``."""
        return [
            f"for (int l = 0; l < {n_a}; l++) {{",
            f"  int e = tid + l * {group};",
            f"  int am = e / {depth}, ak = e % {depth};",
            f"  {itype} gm = row0 + am, gk = {t} + ak;",
            f"  {acc_t} va = {zero};",
            f"  if ({'e < ' + str(tm * depth) + ' && ' if a_partial else ''}gm < M && gk < kend) {{",
            *_indent(pieces["load_a"], 2),
            "  }",
            "  ra[l] = va;",
            "}",
        ]

    def loads_b(t: str) -> list[str]:
        """This work-item's B elements of the slice at reduction step ``t``, into ``rb`` (a channels-inner kernel
        tests its column against the step's kernel offset once: ``in_window``)."""
        return [
            f"for (int l = 0; l < {n_b}; l++) {{",
            *([f"  int e = tid + l * {group};", f"  int bk = e % {depth}, bn = e / {depth};"] if b_rows
              else [f"  int bk = brow + l * {bstep};"]),
            f"  {acc_t} vb = {zero};",
            (f"  if ({'e < ' + str(tn * depth) + ' && ' if b_partial else ''}col0 + bn < N && {t} + bk < kend) {{"
             if b_rows else f"  if ({'in_window' if channels_inner else 'col_ok'} && {t} + bk < kend) {{"),
            *_indent(pieces["load_b"], 2),
            "  }",
            "  rb[l] = vb;",
            "}",
        ]

    column_table = [
        f"for (int c = tid; c < {tn}; c += {group}) {{",
        f"  {itype} gc = col0 + c;",
        "  if (gc < N) {",
        *_indent(pieces["column"], 2),
        f"    Ct[c] = {_vector4(itype, 'colbase', 'b', nd)};",
        "  }",
        "}",
    ]

    # A slice staged by rows (A always, B in the weight gradient) is stored transposed, each work-item's
    # element l at row tid % depth and column tid / depth + l * group / depth; in the TF32 kernels that column
    # is swizzled (see swizzle), one XOR per work-item, and the fragment reads undo it. The XOR (below 8)
    # commutes with adding l * group / depth only where that is a multiple of 8: smaller work-groups (a
    # device's or a kernel's lower limit) store unswizzled.
    swizzled = tf32 and group % (8 * depth) == 0
    if swizzled:
        st_row, st_col = "sk", f"sc + l * {group // depth}"
    else:
        st_row, st_col = f"e % {depth}", f"e / {depth}"
    stores = [
        f"for (int l = 0; l < {n_a}; l++) {{",
        f"  int e = tid + l * {group};",
        f"  {'if (e < ' + str(tm * depth) + ') ' if a_partial else ''}As[{st_row}][{st_col}] = {rounded}(ra[l]);",
        "}",
        *([f"for (int l = 0; l < {n_b}; l++) {{",
           f"  int e = tid + l * {group};",
           f"  {'if (e < ' + str(tn * depth) + ') ' if b_partial else ''}Bs[{st_row}][{st_col}] = "
           f"{rounded}(rb[l]);",
           "}"] if b_rows else [f"for (int l = 0; l < {n_b}; l++) Bs[brow + l * {bstep}][bcol] = {rounded}(rb[l]);"]),
    ]
    staging = [f"int sk = tid % {depth}, sc = (tid / {depth}) ^ {swizzle('sk', depth)};"] if swizzled else []
    if warps is None:
        accumulators = [f"{acc_t} acc[{wy}][{wx}];",
                        f"for (int i = 0; i < {wy}; i++) for (int j = 0; j < {wx}; j++) acc[i][j] = {zero};"]
        multiply = [
            f"for (int k = 0; k < {depth}; k++) {{",
            f"  {acc_t} bv[{wx}];",
            f"  for (int j = 0; j < {wx}; j++) bv[j] = Bs[k][tx + j * {tx}];",
            f"  for (int i = 0; i < {wy}; i++) {{",
            f"    {acc_t} av = As[k][ty + i * {ty}];",
            f"    for (int j = 0; j < {wx}; j++) acc[i][j] += av * bv[j];",
            "  }",
            "}",
        ]
        results = [
            f"for (int i = 0; i < {wy}; i++) {{",
            f"  {itype} row = row0 + ty + i * {ty};",
            "  if (row >= M) break;",
            f"  for (int j = 0; j < {wx}; j++) {{",
            f"    {itype} col = col0 + tx + j * {tx};",
            "    if (col >= N) break;",
            f"    {acc_t} v = acc[i][j];",
            *[f"    {line}" for line in pieces["store"]],
            "  }",
            "}",
        ]
    else:
        accumulators, multiply, results = _mma_pieces(tm // warps[0], tn // warps[1], warps[1], depth, itype,
                                                      pieces["store"], swizzled, swizzled and b_rows)
    lines = [
        "int tx = get_local_id(0), ty = get_local_id(1);",
        f"int tid = ty * {tx} + tx;",
        f"{itype} col0 = ({itype})get_group_id(0) * {tn};",
        f"{itype} row0 = ({itype})get_group_id(1) * {tm};",
        f"{itype} grp = ({itype})get_group_id(2) % groups, split = ({itype})get_group_id(2) / groups;",
        f"{itype} kbeg = split * kchunk, kend = min(K, kbeg + kchunk);",
        *_strides("Ss", "S", nd, itype),
        *_strides("Os", "O", nd, itype),
        *(_strides("Ks", "K", nd, itype) if op == "dgrad" else []),
        f"__local {acc_t} As[{depth}][{tm + pad}];",
        f"__local {acc_t} Bs[{depth}][{tn + pad if b_rows or tf32 else tn}];",
        *([f"__local {itype}4 Ct[{tn}];"] if b_rows else []),
        *([f"__local {itype}4 Rt[{depth}];"] if tabled else []),
        *([f"__local {itype} Aoff[{depth}];"] if has_aoff else []),
        *accumulators,
        *staging,
        # this work-item's B column, fixed for the whole K loop (or, staged by rows, every column's in a table)
        *([] if b_rows else [
            f"int bcol = tid % {tn}, brow = tid / {tn};",
            f"{itype} gc = col0 + bcol;",
            "bool col_ok = gc < N;",
            "if (!col_ok) gc = 0;",
            *pieces["column"],
        ]),
        f"{acc_t} ra[{n_a}], rb[{n_b}];",
        *([f"{itype}4 Cr[{n_b}];"] if b_rows else []),
        "if (kbeg < kend) {",
        *(_indent(column_table, 1) if b_rows else []),
        *(_indent(tables("kbeg"), 1) if tabled else []),
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        # staged by rows, each work-item's B elements keep their columns for the whole K loop: their table
        # entries are read from local memory once, into registers
        *([f"  for (int l = 0; l < {n_b}; l++) {{",
           f"    int e = tid + l * {group};",
           f"    {'if (e < ' + str(tn * depth) + ') ' if b_partial else ''}Cr[l] = Ct[e / {depth}];",
           "  }"] if b_rows else []),
        *_indent(loads("kbeg"), 1),
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        "}",
        f"for ({itype} t0 = kbeg; t0 < kend; t0 += {depth}) {{",
        # stage the slice loaded last step; split the next step's rows; load the next slice (its latency
        # overlaps this step's arithmetic); multiply
        *_indent(stores, 1),
        f"  bool more = t0 + {depth} < kend;",
        *(["  if (more) {", *_indent(tables(f"t0 + {depth}"), 2), "  }"] if tabled else []),
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        "  if (more) {",
        *_indent(loads(f"t0 + {depth}"), 2),
        "  }",
        *_indent(multiply, 1),
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        "}",
        *results,
    ]
    store = emitter.convert("(x)", acc_dtype, dtype)
    preamble = f"#define STORE(x) {store}\n" + (_TF32_HELPER if tf32 else "")
    return assemble(f"fg_conv_{op}", emitter, {dtype, acc_dtype}, params, lines, preamble=preamble)


def _mma_pieces(wm: int, wn: int, warp_cols: int, depth: int, itype: str,
                store: list[str], a_swizzled: bool, b_swizzled: bool) -> tuple[list[str], list[str], list[str]]:
    """The TF32 kernel's accumulators, its multiply of one staged step and its result stores: each warp owns a
    ``wm x wn`` block of the tile (warps laid out ``warp_cols`` to a row of blocks), ``wm / 16 x wn / 8``
    fragments of four float32 accumulators per lane. Fragment layouts are PTX's for ``m16n8k8`` TF32: lane
    ``4 * gq + tq`` holds A at rows ``gq, gq + 8`` and reduction steps ``tq, tq + 4``, B at column ``gq`` and
    steps ``tq, tq + 4``, and accumulators at rows ``gq, gq + 8``, columns ``2 * tq, 2 * tq + 1``. Written out
    in full (no loops), so every fragment and accumulator is a register. Where a slice is swizzled (A's,
    and B's in the weight gradient: :func:`swizzle`), each fragment read's column is a base XORed once per
    work-item (``wr ^ x`` for each constant ``x`` the slice's rows use) plus a multiple of 8: an XOR with a
    value below 8 commutes with adding a multiple of 8, so every read is still a base register plus a constant."""
    xors = sorted({swizzle(k, depth) for k in range(0, depth, 4)} - {0})

    def column(base: str, offset: str, k: int, swizzled: bool) -> str:
        xor = swizzle(k, depth) if swizzled else 0
        return f"{base}{xor if xor else ''} + {offset}"

    mt, nt = wm // MMA_M, wn // MMA_N
    frags = [(i, j) for i in range(mt) for j in range(nt)]
    accumulators = [
        "int lane = tid % 32, warp = tid / 32, gq = lane >> 2, tq = lane & 3;",
        f"int wr = (warp / {warp_cols}) * {wm} + gq, wc = (warp % {warp_cols}) * {wn} + gq;",
        *[f"int wr{x} = wr ^ {x};" for x in xors if a_swizzled],
        *[f"int wc{x} = wc ^ {x};" for x in xors if b_swizzled],
        *[f"float c{i}_{j}_{r} = 0.0f;" for i, j in frags for r in range(4)],
    ]
    multiply = []
    for k in range(0, depth, MMA_K):
        for i in range(mt):
            multiply += [f"uint a{i}_{r}_{k} = as_uint(As[{k} + tq{' + 4' if r >= 2 else ''}]"
                         f"[{column('wr', str(i * MMA_M + 8 * (r % 2)), k + 4 * (r >= 2), a_swizzled)}]);"
                         for r in range(4)]
        for j in range(nt):
            multiply += [f"uint b{j}_{r}_{k} = as_uint(Bs[{k} + tq{' + 4' if r else ''}]"
                         f"[{column('wc', str(j * MMA_N), k + 4 * r, b_swizzled)}]);" for r in range(2)]
        for i, j in frags:
            acc = ", ".join(f'"+f"(c{i}_{j}_{r})' for r in range(4))
            a = ", ".join(f'"r"(a{i}_{r}_{k})' for r in range(4))
            b = ", ".join(f'"r"(b{j}_{r}_{k})' for r in range(2))
            multiply.append('asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, '
                            f'{{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};" : {acc} : {a}, {b});')
    results = [f"{itype} row_w = row0 + wr, col_w = col0 + wc - gq + 2 * tq;"]
    for i, j in frags:
        for r in range(4):
            results += [
                "{",
                f"  {itype} row = row_w + {i * MMA_M + (8 if r >= 2 else 0)}, col = col_w + {j * MMA_N + r % 2};",
                "  if (row < M && col < N) {",
                f"    float v = c{i}_{j}_{r};",
                *[f"    {line}" for line in store],
                "  }",
                "}",
            ]
    return accumulators, multiply, results


class ConvGeometry(NamedTuple):
    """The sizes of one convolution, checked: batch, channels, spatial sizes of input and output, kernel, stride,
    padding, dilation and groups (per-dim tuples of ``nd`` ints)."""

    nd: int
    batch: int
    c_in: int
    c_out: int
    groups: int
    spatial: tuple[int, ...]
    out: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @property
    def c_in_g(self) -> int:
        """Input channels per group."""
        return self.c_in // self.groups

    @property
    def c_out_g(self) -> int:
        """Output channels per group."""
        return self.c_out // self.groups

    @property
    def in_size(self) -> int:
        """``prod(S)``."""
        return math.prod(self.spatial)

    @property
    def out_size(self) -> int:
        """``prod(out)``."""
        return math.prod(self.out)

    @property
    def kernel_size(self) -> int:
        """``prod(K)``."""
        return math.prod(self.kernel)

    @classmethod
    def of(cls, where: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
           padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> ConvGeometry:
        """The geometry of a convolution of an input of ``x_shape`` with a weight of ``w_shape``, or a
        ShapeError naming what does not fit. Remembered per sizes (a training step asks for each layer's at
        every forward and backward call; a refused one raises again, naming ``where``)."""
        try:
            key = (x_shape, w_shape, stride, padding, dilation, groups)
            found = _GEOMETRIES.get(key)
        except TypeError:  # a list among the sizes: not a key
            return cls._checked(where, x_shape, w_shape, stride, padding, dilation, groups)
        if found is None:
            found = cls._checked(where, x_shape, w_shape, stride, padding, dilation, groups)
            if len(_GEOMETRIES) >= 1024:
                _GEOMETRIES.clear()
            _GEOMETRIES[key] = found
        return found

    @classmethod
    def _checked(cls, where: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> ConvGeometry:
        """``of``'s work: the sizes checked and worked out."""
        nd = len(x_shape) - 2
        if not 1 <= nd <= 3 or len(w_shape) != nd + 2:
            raise ShapeError(f"{where}: input shape {x_shape} and weight shape {w_shape} must be (N, C_in, *S) and "
                             "(C_out, C_in / groups, *K) with 1-3 spatial dims")
        geometry = {"stride": stride, "padding": padding, "dilation": dilation}
        for name, value in geometry.items():
            if len(value) != nd:
                raise ShapeError(f"{where}: {name} {tuple(value)} must have one entry per spatial dim ({nd})")
        if any(s < 1 for s in stride) or any(d < 1 for d in dilation) or any(p < 0 for p in padding):
            raise ShapeError(f"{where}: stride {tuple(stride)} and dilation {tuple(dilation)} must be >= 1 and "
                             f"padding {tuple(padding)} >= 0")
        batch, c_in = x_shape[:2]
        c_out, c_in_g = w_shape[:2]
        if groups < 1 or c_in % groups or c_out % groups or c_in_g * groups != c_in:
            raise ShapeError(f"{where}: groups={groups} must divide C_in={c_in} and C_out={c_out}, and the weight "
                             f"{w_shape} must have C_in / groups = {c_in // max(groups, 1)} input channels")
        kernel, spatial = tuple(w_shape[2:]), tuple(x_shape[2:])
        out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                    for s, p, d, k, st in zip(spatial, padding, dilation, kernel, stride))
        if any(o <= 0 for o in out):
            raise ShapeError(f"{where}: input of spatial size {spatial} (padding {tuple(padding)}) is smaller than "
                             f"the kernel's extent (kernel {kernel}, dilation {tuple(dilation)})")
        return cls(nd, batch, c_in, c_out, groups, spatial, out, kernel, tuple(stride), tuple(padding),
                   tuple(dilation))

    def check_output(self, where: str, name: str, shape: tuple[int, ...]) -> None:
        """A ShapeError unless ``shape`` is this convolution's output shape ``(N, C_out, *out)``."""
        expected = (self.batch, self.c_out) + self.out
        if tuple(shape) != expected:
            raise ShapeError(f"{where}: {name} has shape {tuple(shape)}; this convolution's output is {expected}")


#: ``ConvGeometry.of``'s answers by sizes.
_GEOMETRIES: dict[tuple, ConvGeometry] = {}
