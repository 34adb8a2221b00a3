"""One backend written against an array namespace ``xp`` (NumPy or CuPy), as Thinc's ``Ops`` are.

The NumPy backend is this class with ``xp = numpy``; the CuPy backend subclasses it and overrides only
what it does better (fused kernels, its own cuBLAS handle under capture, the memory pool).
Elementwise primitives are bound straight to the namespace's ufuncs in ``__init__`` so a call costs one
attribute lookup: the host cost per op decides small-model speed.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError
from .base import Array, Backend, Shape
from .fusion import is_host_scalar


def _float_ndarrays(*arrays: Any) -> bool:
    """Whether every argument is a NumPy array of one float dtype (the NumPy composites' fast-path condition)."""
    first = arrays[0]
    return (all(type(a) is np.ndarray for a in arrays) and first.dtype.kind == "f"
            and all(a.dtype == first.dtype for a in arrays))


@functools.lru_cache(maxsize=256)
def _phase_spans(stride: tuple, q: tuple, kept: tuple, low: tuple) -> tuple:
    """Where the stride phases of ``_conv_phase_transpose``'s GEMM result ``(C_in, s1..sd, Q1..Qd, N)`` go in
    its cropped output ``(C_in, *kept, N)``: per combination of phases, ``(phase, (q0, q1, u0), (dst, src))``,
    ``phase`` the phase per dim, ``q0:q1`` its rows along the first dim that land in the output (every
    ``s1``-th output row from ``u0`` on), ``dst`` and ``src`` the slices of the other dims in the output and in
    the result. Output position ``u`` of a dim is row ``(u + low) // s`` of phase ``(u + low) % s`` (``low``: what
    the crop takes off that dim's start)."""
    per_dim = []
    for s, rows, k, lo in zip(stride, q, kept, low):
        spans = []
        for r in range(s):
            q0 = max(0, -((r - lo) // s))  # the first row with s*q + r - lo >= 0
            q1 = min(rows, (k - 1 + lo - r) // s + 1)  # past the last with s*q + r - lo <= k - 1
            if q1 > q0:
                spans.append((r, q0, q1, s * q0 + r - lo))
        per_dim.append(spans)
    result = []
    for combo in itertools.product(*per_dim):
        (_, q0, q1, u0), rest = combo[0], combo[1:]
        dst = tuple(slice(u, u + (b - a - 1) * s + 1, s) for (_, a, b, u), s in zip(rest, stride[1:]))
        src = tuple(slice(a, b) for (_, a, b, _) in rest)
        result.append((tuple(c[0] for c in combo), (q0, q1, u0), (dst, src)))
    return tuple(result)


@functools.lru_cache(maxsize=1024)
def _conv_offsets_padded(x_shape: tuple, kernel: tuple, stride: tuple, dilation: tuple, out: tuple, r0: int,
                         r1: int, padding: tuple) -> tuple:
    """Per kernel offset of an im2col over an unpadded batch-last ``x`` ``(C, *S, N)`` with zero ``padding``
    (``(low, high)`` per spatial dim), for output rows ``r0:r1``: ``(src, dst, zeros)``, the index of the
    part of ``x`` the window reads (None when it reads only padding), the index of where that part goes in the
    offset's block ``(C, r1 - r0, *out[1:], N)``, and the indices of the block's slabs that read padding.

    Per dim, window element ``i`` sits at padded coordinate ``b + i * s`` (``b`` the offset's start); it is in
    ``x`` for ``i`` in ``[i0, i1)``. The zero slabs cover the rest of the block once: for each dim ``d``, the
    elements outside ``[i0, i1)`` in ``d`` and inside it in every dim before ``d``. Cached like
    ``Backend._conv_offsets``: a step asks for the same few index lists at every call."""
    sizes = x_shape[1:-1]
    counts = (r1 - r0,) + tuple(out[1:])
    every = (slice(None),)
    result = []
    for off in itertools.product(*(range(k) for k in kernel)):
        src: list[slice] = []
        ranges: list[tuple[int, int]] = []
        for d, (o, dil, s, count, size, (lo, _)) in enumerate(zip(off, dilation, stride, counts, sizes, padding)):
            b = o * dil + (r0 * s if d == 0 else 0)
            i0 = max(0, -((b - lo) // s))  # ceil((lo - b) / s): the first element inside x
            i1 = min(count, (size - 1 + lo - b) // s + 1)
            i1 = max(i1, i0)
            u0 = b + i0 * s - lo
            src.append(slice(u0, u0 + (i1 - i0 - 1) * s + 1, s))
            ranges.append((i0, i1))
        if any(i1 == i0 for i0, i1 in ranges):
            result.append((None, None, (every,)))  # the window reads only padding here: all zeros
            continue
        zeros = []
        for d, (i0, i1) in enumerate(ranges):
            before = tuple(slice(a, z) for a, z in ranges[:d])
            for part in ((slice(0, i0),) if i0 > 0 else ()) + ((slice(i1, counts[d]),) if i1 < counts[d] else ()):
                zeros.append(every + before + (part,))
        dst = every + tuple(slice(a, z) for a, z in ranges)
        result.append((every + tuple(src), dst, tuple(zeros)))
    return tuple(result)


class ArrayBackend(Backend):
    """The protocol implemented with a NumPy-compatible array namespace ``xp``."""

    #: NumPy and CuPy arrays speak DLPack: ``fg.from_dlpack`` and ``Tensor.__dlpack__`` are zero-copy.
    supports_dlpack = True

    def __init__(self, xp: Any, name: str, device: str):
        self.xp = xp
        self.name = name
        self.device = device
        ufuncs = {
            "neg": xp.negative, "exp": xp.exp, "log": xp.log, "sqrt": xp.sqrt, "sin": xp.sin,
            "cos": xp.cos, "tanh": xp.tanh, "abs": xp.abs, "sign": xp.sign,
            "reciprocal": xp.reciprocal, "log1p": xp.log1p, "expm1": xp.expm1, "floor": xp.floor,
            "ceil": xp.ceil, "round": xp.round, "logical_not": xp.logical_not, "isnan": xp.isnan,
            "isinf": xp.isinf,
            "add": xp.add, "sub": xp.subtract, "mul": xp.multiply, "div": xp.true_divide,
            "pow": xp.power, "maximum": xp.maximum, "minimum": xp.minimum,
            "floor_divide": xp.floor_divide, "remainder": xp.remainder, "atan2": xp.arctan2,
            "eq": xp.equal, "ne": xp.not_equal, "lt": xp.less, "le": xp.less_equal,
            "gt": xp.greater, "ge": xp.greater_equal, "logical_and": xp.logical_and,
            "logical_or": xp.logical_or, "logical_xor": xp.logical_xor,
        }
        # Instance attributes shadow the abstract stubs: a primitive call is a plain ufunc call.
        self.__dict__.update(ufuncs)
        self.seed(0)

    # erf is not a NumPy ufunc (SciPy is not a dependency); NumPy and CuPy share this one.
    #: float32 erf as ``x * P(x^2) / Q(x^2)`` on x clamped to [-4, 4] (beyond, erf rounds to +-1 in float32):
    #: Eigen's ``generic_fast_erf_float`` coefficients (numerator odd, degree 13; denominator even, degree 8),
    #: highest power first. Max error 4.5e-7 absolute (as the erfc fit it replaced) and a few ulp relative
    #: near 0, where the erfc fit cancelled to 0; 24 array passes and no ``exp``: 0.84 -> 0.50 ms on a
    #: (32, 32, 256) float32 array (one thread), which GELU's forward pays on every call.
    _ERF32_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
    _ERF32_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                -1.42647390514189e-02)

    def erf(self, a: Array) -> Array:
        """Error function: for float16/32 (computed in float32) Eigen's rational fit (``_ERF32_P``); for
        float64 the Maclaurin series below |x| = 2.5 (error ~1e-14) joined to a Chebyshev-fitted erfc (relative
        error < 1.2e-7) above it."""
        xp = self.xp
        if a.ndim == 0:  # ufuncs return scalars for 0-d arrays; the in-place passes need an array
            return self.erf(a.reshape(1)).reshape(())
        if a.dtype != np.float64:
            x = xp.clip(a, -4.0, 4.0) if a.dtype == np.float32 else xp.clip(a.astype(np.float32), -4.0, 4.0)
            p = xp.empty_like(x)
            self._erf32_into(x, p, xp.empty_like(x), xp.empty_like(x))
            return p.astype(a.dtype, copy=False)
        ax = xp.abs(a)
        t = ax * 0.5
        t += 1.0
        xp.reciprocal(t, out=t)
        p = t * 0.17087277
        for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
                  1.00002368):
            p += c
            p *= t
        p += -1.26551223
        p -= ax * ax
        xp.exp(p, out=p)
        p *= t
        y = xp.subtract(1.0, p, out=p)
        small = ax < 2.5
        xs = xp.where(small, ax, 0.0)
        x2 = xs * xs
        term = xs
        series = xs
        for n in range(1, 64):
            term = term * (-x2) / n
            series = series + term / (2 * n + 1)
        y = xp.where(small, series * (2.0 / np.sqrt(np.pi)), y)
        xp.copysign(y, a, out=y)  # erf is odd: one pass instead of a compare, a negation and a select
        return y

    def _erf32_into(self, x: Array, out: Array, x2: Array, q: Array) -> None:
        """float32 ``erf`` of ``x`` (clamped to [-4, 4] already) into ``out``: Horner's rule written in place,
        with ``x2`` and ``q`` (arrays of ``x``'s shape) as scratch instead of a fresh array per operation."""
        xp, f32 = self.xp, np.float32
        xp.multiply(x, x, out=x2)
        p = xp.multiply(x2, f32(self._ERF32_P[0]), out=out)
        for c in self._ERF32_P[1:-1]:
            p += f32(c)
            p *= x2
        p += f32(self._ERF32_P[-1])
        p *= x
        xp.multiply(x2, f32(self._ERF32_Q[0]), out=q)
        for c in self._ERF32_Q[1:-1]:
            q += f32(c)
            q *= x2
        q += f32(self._ERF32_Q[-1])
        p /= q

    # ----------------------------------------------------------------- host exchange and creation
    def from_host(self, array: np.ndarray) -> Array:
        return self.xp.asarray(array)

    def to_host(self, a: Array) -> np.ndarray:
        return np.asarray(a)

    def from_dlpack(self, obj: Any) -> Array:
        """Zero-copy import of a DLPack-capable array on this device."""
        return self.xp.from_dlpack(obj)

    def to_dlpack(self, a: Array, *args: Any, **kwargs: Any) -> Any:
        """A DLPack capsule for ``a`` (``Tensor.__dlpack__``)."""
        return self.xp.asarray(a).__dlpack__(*args, **kwargs)

    def dlpack_device(self, a: Array) -> tuple[int, int]:
        """``(device_type, index)`` for ``Tensor.__dlpack_device__``."""
        return self.xp.asarray(a).__dlpack_device__()

    def full(self, shape: Shape, value: float | int | bool, dtype: np.dtype) -> Array:
        return self.xp.full(shape, value, dtype=dtype)

    def arange(self, start: float, stop: float, step: float, dtype: np.dtype) -> Array:
        return self.xp.arange(start, stop, step, dtype=dtype)

    # ----------------------------------------------------------------- random
    def seed(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.Philox(seed))

    def get_rng_state(self) -> np.ndarray:
        # Philox's whole state as 13 uint64 words: counter (4), key (2), buffer (4), buffer_pos, has_uint32,
        # uinteger (NumPy's state dict has no flat form of its own).
        st = self._rng.bit_generator.state
        words = [*st["state"]["counter"], *st["state"]["key"], *st["buffer"], st["buffer_pos"], st["has_uint32"],
                 st["uinteger"]]
        return np.array(words, dtype=np.uint64).view(np.int64)

    def set_rng_state(self, state: np.ndarray) -> None:
        w = np.ascontiguousarray(state, dtype=np.int64).view(np.uint64)
        bit_generator = np.random.Philox()
        bit_generator.state = {
            "bit_generator": "Philox",
            "state": {"counter": w[0:4].copy(), "key": w[4:6].copy()},
            "buffer": w[6:10].copy(), "buffer_pos": int(w[10]), "has_uint32": int(w[11]), "uinteger": int(w[12]),
        }
        self._rng = np.random.Generator(bit_generator)

    #: Random bits per uniform sample of a 16-bit float: as many as its significand holds, so every sample is
    #: exactly representable and none rounds up to 1.0 (a float32 or float64 sample cast down does, about once
    #: in 2,000 draws for float16 and 250 for bfloat16).
    _UNIFORM_BITS = {"float16": 11, "bfloat16": 8}

    def uniform(self, shape: Shape, dtype: np.dtype) -> Array:
        """Uniform samples in [0, 1): NumPy's float64 (53 bits) or float32 (24 bits) draws, or for 16-bit
        floats ``k / 2**bits`` (``_UNIFORM_BITS``), as CUDA's and OpenCL's kernels draw them. (A float64 draw
        cast down can round to 1.0, and made a float64 array for every float32 dropout mask.)"""
        dtype = np.dtype(dtype)
        if dtype == np.float64 or dtype == np.float32:
            return self.from_host(self._rng.random(shape, dtype=dtype))
        bits = self._UNIFORM_BITS.get(dtype.name)
        if bits is None:
            raise BackendError(f"uniform: needs a float dtype (float16, bfloat16, float32, float64), got {dtype}")
        draws = self._rng.random(shape, dtype=np.float32)
        draws *= float(1 << bits)
        np.floor(draws, out=draws)
        draws *= 1.0 / (1 << bits)
        return self.from_host(draws.astype(dtype, copy=False))

    def normal(self, shape: Shape, dtype: np.dtype) -> Array:
        out = self._rng.standard_normal(shape, dtype=np.float64)
        return self.from_host(out.astype(dtype, copy=False))

    def randint(self, low: int, high: int, shape: Shape, dtype: np.dtype) -> Array:
        return self.from_host(self._rng.integers(low, high, size=shape, dtype=np.int64).astype(dtype))

    # ----------------------------------------------------------------- elementwise
    def where(self, cond: Array, a: Array, b: Array) -> Array:
        out = self.xp.where(cond, a, b)
        if isinstance(a, (int, float, bool)) and not isinstance(b, (int, float, bool)):
            return out.astype(b.dtype, copy=False)
        if isinstance(b, (int, float, bool)) and not isinstance(a, (int, float, bool)):
            return out.astype(a.dtype, copy=False)
        return out

    def cast(self, a: Array, dtype: np.dtype) -> Array:
        return a.astype(dtype, copy=False)

    # ----------------------------------------------------------------- reductions
    def sum(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.sum(a, axis=axes, keepdims=keepdims, dtype=a.dtype if a.dtype.kind == "f" else None)

    def prod(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.prod(a, axis=axes, keepdims=keepdims)

    def max(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.max(a, axis=axes, keepdims=keepdims)

    def min(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.min(a, axis=axes, keepdims=keepdims)

    def any(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.any(a, axis=axes, keepdims=keepdims)

    def all(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self.xp.all(a, axis=axes, keepdims=keepdims)

    def argmax(self, a: Array, axis: int, keepdims: bool) -> Array:
        return self.xp.argmax(a, axis=axis, keepdims=keepdims).astype(np.int64, copy=False)

    def argmin(self, a: Array, axis: int, keepdims: bool) -> Array:
        return self.xp.argmin(a, axis=axis, keepdims=keepdims).astype(np.int64, copy=False)

    def cumsum(self, a: Array, axis: int) -> Array:
        return self.xp.cumsum(a, axis=axis, dtype=a.dtype)

    # ----------------------------------------------------------------- movement
    def reshape(self, a: Array, shape: Shape) -> Array:
        return a.reshape(shape)

    def permute(self, a: Array, axes: Sequence[int]) -> Array:
        return a.transpose(axes)

    def expand(self, a: Array, shape: Shape) -> Array:
        return self.xp.broadcast_to(a, shape)

    def slice(self, a: Array, index: tuple[slice, ...]) -> Array:
        return a[index]

    def flip(self, a: Array, axes: Sequence[int]) -> Array:
        return self.xp.flip(a, axis=tuple(axes))

    def pad(self, a: Array, widths: Sequence[tuple[int, int]], value: float) -> Array:
        # A filled buffer and one slice assignment: 1.3-4x faster than ``pad`` (which fills each border
        # strip separately) on a convolution's (C, *S, N) inputs.
        shape = tuple(n + lo + hi for n, (lo, hi) in zip(a.shape, widths))
        if value == 0 and math.copysign(1.0, value) > 0:  # calloc'd zeros (a -0.0 fill keeps its sign)
            out = self.xp.zeros(shape, dtype=a.dtype)
        else:
            out = self.xp.full(shape, value, dtype=a.dtype)
        out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(a.shape, widths))] = a
        return out

    def concatenate(self, arrays: Sequence[Array], axis: int) -> Array:
        return self.xp.concatenate(arrays, axis=axis)

    def contiguous(self, a: Array) -> Array:
        # asarray(order="C") keeps 0-d arrays 0-d (ascontiguousarray returns at least 1-d).
        return self.xp.asarray(a, order="C")

    def is_contiguous(self, a: Array) -> bool:
        return bool(a.flags.c_contiguous)

    def _strides(self, a: Array) -> tuple[int, ...] | None:
        return a.strides

    def assign(self, dst: Array, src: Array | float) -> Array:
        if isinstance(dst, self.xp.ndarray) and dst.flags.writeable:
            self.xp.copyto(dst, src, casting="unsafe")
            return dst
        # A 0-d op result (a NumPy scalar) or a read-only broadcast: give the tensor fresh storage.
        out = self.xp.empty(dst.shape, dtype=dst.dtype)
        self.xp.copyto(out, src, casting="unsafe")
        return out

    # ----------------------------------------------------------------- linear algebra
    def matmul(self, a: Array, b: Array) -> Array:
        out = self.xp.matmul(a, b)
        # ml_dtypes' bfloat16 matmul accumulates and returns float32: keep the protocol's same-dtype rule.
        return out if out.dtype == a.dtype else out.astype(a.dtype)

    # ----------------------------------------------------------------- indexing
    def argsort(self, a: Array, axis: int, descending: bool) -> Array:
        xp = self.xp
        if a.ndim == 0:
            return xp.zeros((), dtype=np.int64)
        if a.dtype.kind == "b" or a.dtype.name == "bfloat16" or a.dtype.kind == "u":
            a = a.astype(np.float32 if a.dtype.name == "bfloat16" else np.int64)
        if descending:
            # stable descending with NaN first: sort the negated values, NaN mapped below everything
            key = -a
            if a.dtype.kind == "f":
                key = xp.where(xp.isnan(a), -xp.inf, key)
            a = key
        return xp.argsort(a, axis=axis, kind="stable").astype(np.int64, copy=False)

    def gather(self, a: Array, axis: int, index: Array) -> Array:
        return self.xp.take_along_axis(a, index, axis=axis)

    def _full_index(self, index: Array, axis: int) -> tuple:
        """Open-grid index tuple addressing every element of ``index`` with ``index`` on ``axis``."""
        grids = list(self.xp.indices(index.shape, sparse=True))
        grids[axis] = index
        return tuple(grids)

    def scatter_add(self, a: Array, axis: int, index: Array, src: Array) -> Array:
        out = a.copy()
        self.xp.add.at(out, self._full_index(index, axis), self.xp.broadcast_to(src, index.shape))
        return out

    def scatter(self, a: Array, axis: int, index: Array, src: Array) -> Array:
        out = a.copy()
        out[self._full_index(index, axis)] = self.xp.broadcast_to(src, index.shape)
        return out

    def memory_stats(self) -> dict[str, int]:
        return {}


class NumpyBackend(ArrayBackend):
    """The CPU backend: NumPy arrays, NumPy's BLAS for matmul."""

    #: Convolutions lay the batch out last, ``(C, *S, N)`` (see ``nn.conv``): window copies run over
    #: ``out_w * N`` elements instead of ``out_w``, which is what NumPy's one-op-at-a-time passes need.
    conv_batch_last = True

    def __init__(self, device: str = "cpu"):
        super().__init__(np, "cpu", "cpu")
        # Overflow to inf, 0/0 and log(0) are values here, as in PyTorch, not warnings.
        np.seterr(all="ignore")

    @staticmethod
    def list_devices() -> list[str]:
        """The CPU device."""
        return ["cpu"]

    #: Elements per block of a multi-pass elementwise chain (erf's 24 passes, GELU's): 256 KiB of float32, so
    #: every pass after the first reads L2 instead of memory. On nanoGPT's (32, 32, 256) float32 activations
    #: (best of 7 runs, 2-core VM): erf 2.57 -> 0.93 ms, GELU forward 3.10 -> 1.46 ms, backward 0.53 -> 0.46 ms.
    _EW_BLOCK = 65536

    def _blocks(self, n: int):
        """``(start, stop)`` of the ``_EW_BLOCK`` blocks of ``range(n)``."""
        step = self._EW_BLOCK
        return ((i, min(n, i + step)) for i in range(0, n, step))

    def _blocked(self, *arrays: Array) -> bool:
        """Whether a chain over these arrays runs block by block: NumPy arrays, C-contiguous, larger than a
        block (a smaller one is one block already)."""
        return all(type(a) is np.ndarray and a.flags.c_contiguous for a in arrays) and arrays[0].size > \
            self._EW_BLOCK

    def erf(self, a: Array) -> Array:
        """``ArrayBackend.erf``, block by block for a large contiguous float32 array (``_EW_BLOCK``): the same
        operations in the same order, so the same bits."""
        if a.dtype != np.float32 or not self._blocked(a):
            return super().erf(a)
        flat, out = a.reshape(-1), np.empty(a.shape, np.float32)
        self._erf32_blocks(flat, out.reshape(-1), lambda i, j, xb: np.clip(flat[i:j], -4.0, 4.0, out=xb))
        return out

    def _erf32_blocks(self, flat: np.ndarray, out: np.ndarray, load) -> None:
        """float32 erf over ``out``'s blocks: ``load(i, j, xb)`` writes block ``i:j`` of the (clamped) input into
        the scratch ``xb`` and returns it."""
        m = min(flat.size, self._EW_BLOCK)
        xb, x2, q = (np.empty(m, np.float32) for _ in range(3))
        for i, j in self._blocks(flat.size):
            k = j - i
            self._erf32_into(load(i, j, xb[:k]), out[i:j], x2[:k], q[:k])

    #: float32 exact GELU: ``Phi(-|x|) = erfc(|x| / sqrt(2)) / 2`` as ``P(t) * exp(-x*x/2)`` with
    #: ``t = 1 / (1 / p + |x|)``, ``P`` of degree 5 without a constant term (Abramowitz & Stegun 7.1.26, their
    #: ``t`` scaled by ``p``: erfc's absolute error <= 1.5e-7; coefficients halved and scaled by powers of ``p``,
    #: lowest power first). The exponential is the normal density's too, so the derivative
    #: ``Phi(x) + x * pdf(x)`` costs three more passes and the backward is one multiply. Every pass is a SIMD
    #: loop of NumPy's (``np.copysign``, ``np.sign`` and ``np.where`` run 6-40x a multiply's time here: the sign
    #: is x's sign bit, xor-ed into ``1/2 - Phi(-|x|)`` as integers): (1024, 256) forward + backward 1.94 -> 1.55
    #: ms on one core (best of 30 blocks, old and new alternated) against erf's rational fit (``_ERF32_P``) with a
    #: second exponential in the backward; the sign bit instead of a clip and a multiply, 1.14 -> 1.07 ms with the
    #: derivative, 1.00 -> 0.91 ms without (best of 7 x 30, old and new alternated; the same values).
    _GELU32_INV_P = math.sqrt(2.0) / 0.3275911
    _GELU32_A = tuple(c * 0.5 * (math.sqrt(2.0) / 0.3275911) ** k for k, c in enumerate(
        (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429), start=1))

    @classmethod
    def _gelu32_into(cls, x: np.ndarray, y: np.ndarray, d: np.ndarray | None, t: np.ndarray,
                     s: np.ndarray, e: np.ndarray) -> None:
        """float32 ``y = x * Phi(x)`` and, where ``d`` is given, ``d = Phi(x) + x * pdf(x)`` for ``x`` of any
        layout, with ``t``, ``s``, ``e`` (float32 arrays of ``x``'s shape) as scratch."""
        f32, a = np.float32, cls._GELU32_A
        np.abs(x, out=t)
        t += f32(cls._GELU32_INV_P)
        np.divide(f32(1.0), t, out=t)
        np.multiply(t, f32(a[4]), out=s)
        for c in a[3:0:-1]:
            s += f32(c)
            s *= t
        s += f32(a[0])
        s *= t
        np.multiply(x, f32(-0.5), out=e)
        e *= x
        np.exp(e, out=e)
        s *= e  # Phi(-|x|)
        np.subtract(f32(0.5), s, out=s)
        # times sign(x) as x's sign bit flipped into it (two integer passes; zero keeps 1/2 - Phi(0)'s ~1e-7)
        sign = np.bitwise_and(x.view(np.uint32), np.uint32(0x80000000), out=t.view(np.uint32))
        np.bitwise_xor(s.view(np.uint32), sign, out=s.view(np.uint32))
        s += f32(0.5)  # Phi(x)
        np.multiply(x, s, out=y)
        if d is not None:
            e *= f32(1.0 / math.sqrt(2.0 * math.pi))
            e *= x
            np.add(e, s, out=d)

    @staticmethod
    def _gelu_fits(x: Any) -> bool:
        """Whether ``gelu_exact`` saves the derivative for ``x`` (a float32/float64 NumPy array), so that
        ``gelu_exact_backward`` multiplies by it; the generic default's cdf otherwise."""
        return type(x) is np.ndarray and x.dtype in (np.float32, np.float64)

    def gelu_exact(self, x: Array, grad: bool = True) -> tuple:
        """Exact GELU's ``(x * Phi(x), d)`` with ``d = Phi(x) + x * pdf(x)``, the derivative (None when
        ``grad`` is false), which ``gelu_exact_backward`` multiplies by the gradient. float32 by
        ``_GELU32_A``'s fit (absolute error ~5e-7, below float32 PyTorch's 1.1e-6 against float64), block by
        block for a large contiguous array (``_EW_BLOCK``; the same operations, so the same bits); float64
        from ``erf``. The generic default unless ``x`` is a float32/float64 NumPy array."""
        if not self._gelu_fits(x):
            return super().gelu_exact(x, grad)
        if x.ndim == 0:  # ufuncs return scalars for 0-d arrays; the in-place passes need an array
            y, d = self.gelu_exact(x.reshape(1), grad)
            return y.reshape(()), None if d is None else d.reshape(())
        if x.dtype == np.float64:
            cdf = self.erf(np.multiply(x, 1.0 / math.sqrt(2.0)))
            cdf += 1.0
            cdf *= 0.5
            y = np.multiply(x, cdf)
            if not grad:
                return y, None
            return y, self._gelu_derivative64(x, cdf)
        y = np.empty(x.shape, np.float32)
        d = np.empty(x.shape, np.float32) if grad else None
        if not self._blocked(x):
            self._gelu32_into(x, y, d, *(np.empty(x.shape, np.float32) for _ in range(3)))
            return y, d
        flat, yf, df = x.reshape(-1), y.reshape(-1), None if d is None else d.reshape(-1)
        scratch = [np.empty(self._EW_BLOCK, np.float32) for _ in range(3)]
        for i, j in self._blocks(flat.size):
            self._gelu32_into(flat[i:j], yf[i:j], None if df is None else df[i:j], *(a[:j - i] for a in scratch))
        return y, d

    _ONES: dict = {}  # (n, dtype) -> read-only vector of ones: row and column sums as BLAS matrix-vector products

    @classmethod
    def _ones(cls, n: int, dtype: np.dtype) -> np.ndarray:
        key = (n, dtype)
        ones = cls._ONES.get(key)
        if ones is None:
            if len(cls._ONES) >= 64:  # a few row and column lengths per model; bounded for varying batches
                cls._ONES.clear()
            ones = np.ones(n, dtype=dtype)
            ones.flags.writeable = False
            cls._ONES[key] = ones
        return ones

    @staticmethod
    def _layer_norm_fits(x: Any, *others: Any) -> bool:
        """The condition of the NumPy LayerNorm composites: a 2-d float32/float64 array, the others arrays of
        its dtype or None."""
        return (_float_ndarrays(x, *(t for t in others if t is not None)) and x.ndim == 2
                and x.dtype in (np.float32, np.float64))

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   residual: Array | None = None) -> tuple:
        """``Backend.layer_norm`` in about five passes over ``x``: the row means as one BLAS matrix-vector
        product, the variances as ``np.vecdot`` rows of the centred copy, which is then scaled, weighted,
        shifted (and the residual added) in place. The ``einsum`` reductions and fresh arrays of the generic
        ``standardize`` took 73 -> 46 us on a (64, 512) float32 input, 611 -> 488 us for the backward of a
        (256, 1024) one (best of 500, the project's 2-core VM). The generic default for other inputs."""
        if not self._layer_norm_fits(x, weight, bias, residual) or (
                residual is not None and residual.shape != x.shape):
            return super().layer_norm(x, weight, bias, eps, residual)
        cols = x.shape[1]
        mean = np.matmul(x, self._ones(cols, x.dtype))
        mean *= 1.0 / max(cols, 1)
        y = np.subtract(x, mean[:, None])
        rstd = np.vecdot(y, y)
        rstd *= 1.0 / max(cols, 1)
        rstd += eps
        np.sqrt(rstd, out=rstd)
        np.reciprocal(rstd, out=rstd)
        y *= rstd[:, None]
        if weight is not None:
            y *= weight
        if bias is not None:
            y += bias
        if residual is not None:
            y += residual
        return y, mean, rstd

    def bias_grad(self, g: Array) -> Array:
        """``Backend.bias_grad`` as one BLAS matrix-vector product with ones (as ``layer_norm_backward``'s
        column sums): NumPy's sum over the first axis adds row after row, about 3-15x slower at a linear
        layer's shapes (the small GPT's (1024, 256) gradient 73 -> 23 us, (1024, 64) 38 -> 6 us; this
        project's 2-core VM). The generic default unless ``g`` is a C-contiguous 2-d float32/float64 array."""
        if type(g) is np.ndarray and g.ndim == 2 and g.dtype in (np.float32, np.float64) and g.flags.c_contiguous \
                and g.shape[0] > 1:
            return np.matmul(self._ones(g.shape[0], g.dtype), g)
        return super().bias_grad(g)

    def layer_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """``Backend.layer_norm_backward`` with ``xhat`` rebuilt in one scratch array that becomes ``gx``; the
        column sums of ``gw``/``gb`` and the row means of ``gx`` as BLAS matrix-vector products and
        ``np.vecdot`` (see ``layer_norm``). The generic default for other inputs."""
        if not self._layer_norm_fits(x, g, mean, rstd, weight) or g.shape != x.shape or mean.ndim != 1:
            return super().layer_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        rows, cols = x.shape
        xhat = np.subtract(x, mean[:, None])
        xhat *= rstd[:, None]
        gx = gw = gb = None
        if need_w:
            gw = np.matmul(self._ones(rows, x.dtype), np.multiply(g, xhat))
        if need_b:
            gb = np.matmul(self._ones(rows, x.dtype), g)
        if need_x:
            gy = g if weight is None else np.multiply(g, weight)
            inv = 1.0 / max(cols, 1)
            m1 = np.matmul(gy, self._ones(cols, x.dtype))
            m1 *= inv
            m2 = np.vecdot(gy, xhat)
            m2 *= inv
            xhat *= m2[:, None]
            xhat += m1[:, None]
            gx = np.subtract(gy, xhat, out=xhat)
            gx *= rstd[:, None]
        return gx, gw, gb

    @classmethod
    def _channel_blocks(cls, a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
        """``(view, frame)``: ``a`` ``(N, C, *S)`` as a 3-d view ``(B, C, M)`` whose axis 1 is the channel and
        whose axes 0 and 2 hold every element of it, and the axis order ``a`` is laid out in (``_frame``, which
        ``_from_channel_blocks`` restores). The view is ``(1, C, N * prod(S))`` when each channel is one
        contiguous block (a batch-last convolution's output: the frame starts at the channel axis) and
        ``(N, C, prod(S))`` when ``a`` is C-contiguous; None for other layouts."""
        if a.ndim < 2:
            return None
        frame = cls._frame(a)
        if frame[0] == 1:
            b = a.transpose(frame)
            return b.reshape(1, a.shape[1], -1), frame
        if a.flags.c_contiguous:
            return a.reshape(a.shape[0], a.shape[1], -1), frame
        return None

    @classmethod
    def _from_channel_blocks(cls, v: np.ndarray, like: np.ndarray, frame: tuple[int, ...]) -> np.ndarray:
        """A ``(B, C, M)`` result of ``_channel_blocks(like)``'s layout as an array of ``like``'s shape, laid out
        as ``like`` is (a view)."""
        return v.reshape(tuple(like.shape[i] for i in frame)).transpose(cls._inverse(frame))

    def _channel_sums(self, v: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """Per channel of the ``(B, C, M)`` view ``v``: ``sum(v)``, or ``sum(v * w)`` for ``w`` of its shape, as
        BLAS matrix-vector products / ``np.vecdot`` rows summed over ``B`` (no product array)."""
        sums = np.matmul(v, self._ones(v.shape[2], v.dtype)) if w is None else np.vecdot(v, w)
        return sums[0] if sums.shape[0] == 1 else sums.sum(axis=0)

    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   running_mean: Array | None = None, running_var: Array | None = None,
                   momentum: float = 0.1, batches: Array | None = None) -> tuple:
        """``Backend.batch_norm`` in four passes over ``x``: per-channel sums as BLAS matrix-vector products on
        a ``(B, C, M)`` view (``_channel_blocks``: a batch-last convolution's output is one block per channel,
        ``B = 1``), the variance as ``np.vecdot`` of the centred copy, which is then scaled and shifted in place
        and returned in ``x``'s layout. Against the generic ``standardize`` (``einsum`` reductions, a product
        array for the weight): 0.50 -> 0.32 ms on a (32, 16, 32, 32) float32 input laid out batch-last (best of
        50, the project's 2-core VM; torch 0.57-0.70 ms). The generic default for other inputs and layouts."""
        blocks = (self._channel_blocks(x) if _float_ndarrays(x, *(t for t in (weight, bias) if t is not None))
                  and x.dtype in (np.float32, np.float64) and x.size else None)
        if blocks is None:
            return super().batch_norm(x, weight, bias, eps, running_mean, running_var, momentum, batches)
        v, frame = blocks
        count = v.shape[0] * v.shape[2]
        mean = self._channel_sums(v)
        mean *= 1.0 / count
        y = np.subtract(v, mean[:, None])
        var = self._channel_sums(y, y)
        var *= 1.0 / count
        rstd = np.add(var, eps)
        np.sqrt(rstd, out=rstd)
        np.reciprocal(rstd, out=rstd)
        y *= (rstd if weight is None else rstd * weight)[:, None]
        if bias is not None:
            y += bias[:, None]
        self._update_running(running_mean, running_var, mean, var, momentum, count / max(count - 1, 1))
        self._count_batch(batches)
        return self._from_channel_blocks(y, x, frame), mean, var, rstd

    def batch_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """``Backend.batch_norm_backward`` on the ``(B, C, M)`` views of ``batch_norm``: ``sum(g)`` and
        ``sum(g * (x - mean))`` per channel as BLAS matrix-vector products and ``np.vecdot``, then ``gx =
        s * g - s * sum(g) / n - (x - mean) * s * rstd^2 * sum(g * (x - mean)) / n`` (``s = rstd * weight``) in
        three in-place passes over the centred copy. The generic default unless ``g`` has ``x``'s layout."""
        blocks = (self._channel_blocks(x) if _float_ndarrays(x, g, mean, rstd, *(() if weight is None else (weight,)))
                  and x.dtype in (np.float32, np.float64) and x.size and g.shape == x.shape else None)
        if blocks is None:
            return super().batch_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        g_blocks = self._channel_blocks(g)
        if g_blocks is None or g_blocks[1] != blocks[1]:
            # A gradient laid out otherwise (convnet's last block: a flatten's (N, C*H*W) gradient against a
            # batch-last input) is copied into the input's layout once, as the pooling backward does, instead of
            # taking the generic default's einsum passes.
            frame = blocks[1]
            g = self._copy_in_frame(g, frame)
            g_blocks = self._channel_blocks(g)
        if g_blocks is None or g_blocks[1] != blocks[1] or g_blocks[0].shape != blocks[0].shape:
            return super().batch_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        (v, frame), gv = blocks, g_blocks[0]
        count = v.shape[0] * v.shape[2]
        centred = np.subtract(v, mean[:, None])
        sg = self._channel_sums(gv)
        sgx = self._channel_sums(gv, centred)
        sgx *= rstd  # sum(g * xhat)
        gx = None
        if need_x:
            scale = rstd if weight is None else rstd * weight
            gx = np.multiply(gv, scale[:, None])
            centred *= (scale * rstd * sgx * (1.0 / count))[:, None]
            gx -= centred
            gx -= (scale * sg * (1.0 / count))[:, None]
            gx = self._from_channel_blocks(gx, x, frame)
        return gx, sgx if need_w else None, sg if need_b else None

    def native_sdpa(self, dtype: np.dtype, head_dim: int) -> bool:
        """True for float32: ``F.scaled_dot_product_attention`` (no mask or the square causal one, no dropout)
        runs as ``sdpa_forward`` / ``sdpa_backward`` below, each one call of in-place passes, instead of the
        composed matmul, masked fill (two selects for fully masked rows) and softmax, each a fresh array per
        op and autograd node (the small GPT of ``benchmarks/ports.py``: its replayed step 36.3 -> 34.4 ms of
        one thread's CPU time). Other dtypes keep the composed path (the protocol's ``stats`` are float32)."""
        return dtype == np.float32

    #: NumPy's matmul reads permuted heads (a (B, L, H, D) projection viewed as (B, H, L, D)) through BLAS
    #: strides: no contiguous copies of q, k, v (and the output gradient) per call.
    sdpa_strided_inputs = True

    _CAUSAL_BIASES: dict = {}  # (L, S, dtype) -> read-only (L, S) bias: 0 on and below the diagonal, -inf above

    @classmethod
    def _causal(cls, length: int, keys: int, dtype: np.dtype) -> np.ndarray:
        key = (length, keys, np.dtype(dtype))
        bias = cls._CAUSAL_BIASES.get(key)
        if bias is None:
            bias = np.where(np.arange(keys)[None, :] <= np.arange(length)[:, None], 0.0, -np.inf).astype(dtype)
            bias.flags.writeable = False
            cls._CAUSAL_BIASES[key] = bias
        return bias

    def _probabilities(self, q: np.ndarray, k: np.ndarray, scale: float, causal: bool) -> np.ndarray:
        """The scaled (and causally biased) scores ``q k^T * scale`` in a fresh array, to be finished in place."""
        scores = np.matmul(q, k.swapaxes(-1, -2))
        scores *= scale
        if causal:
            scores += self._causal(q.shape[-2], k.shape[-2], scores.dtype)
        return scores

    #: A max over a last axis at most this long, of at least as many rows, reduces a transposed copy instead.
    _SHORT_ROW = 128

    def _row_max(self, a: np.ndarray) -> np.ndarray:
        """``max(a, axis=-1, keepdims=True)``. NumPy's maximum over a short contiguous last axis pays about
        120 ns a row whatever its length; over the first axis of the transposed copy it is one elementwise
        pass per column of the original: the small GPT's (32, 4, 32, 32) attention scores 483 -> 166 us, the
        copy included, and its causal ``sdpa_forward`` 1,334-1,568 -> 840-1,053 us (old and new code
        alternated, this project's 2-core VM). The maximum is exact, so the values are the same."""
        n = a.shape[-1] if a.ndim else 0
        rows = a.size // n if n else 0
        if 1 < n <= self._SHORT_ROW and rows >= n and a.dtype.kind == "f" and a.flags.c_contiguous:
            top = np.maximum.reduce(np.ascontiguousarray(a.reshape(rows, n).T), axis=0)
            return top.reshape(a.shape[:-1] + (1,))
        return np.max(a, axis=-1, keepdims=True)

    #: The most elements a sum over trailing or leading axes adds per result as a BLAS product (``sum``); longer
    #: ones keep NumPy's pairwise sum, more accurate over long runs than BLAS's few running sums.
    _SUM_ROW_MAX = 4096

    def sum(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        """``ArrayBackend.sum``; a float sum over the trailing axes of a C-contiguous array (a softmax's, a row
        mean's, an expert mix's) or over its leading axes (a broadcast operand's gradient) as one BLAS
        matrix-vector product with ones (as ``layer_norm``'s means and ``bias_grad``): NumPy's reduction pays ~20
        ns a row over a short last axis and adds row after row over the first. gated_routing's (64, 128, 8)
        expert sum 207 -> 10 us, (1000, 200) rows 87 -> 20 us, (1024, 256) columns 53 -> 18 us, (4000, 3) columns
        82 -> 5 us (best of 5 x 300, this project's 2-core VM). The sums round differently from NumPy's pairwise
        ones in the last bits, as PyTorch's own do."""
        if type(a) is np.ndarray and axes and a.ndim >= 2 and a.dtype in (np.float32, np.float64) \
                and a.flags.c_contiguous:
            nd, k = a.ndim, len(axes)
            reduced = sorted(x % nd for x in axes)
            if k < nd and reduced == list(range(nd - k, nd)):  # trailing: rows of n summed
                n = math.prod(a.shape[nd - k:])
                if 0 < n <= self._SUM_ROW_MAX and a.size > n:
                    out = np.matmul(a.reshape(-1, n), self._ones(n, a.dtype)).reshape(a.shape[:nd - k])
                    return out.reshape(out.shape + (1,) * k) if keepdims else out
            elif k < nd and reduced == list(range(k)):  # leading: m rows added
                m = math.prod(a.shape[:k])
                if 0 < m <= self._SUM_ROW_MAX and a.size > m:
                    out = np.matmul(self._ones(m, a.dtype), a.reshape(m, -1)).reshape(a.shape[k:])
                    return out.reshape((1,) * k + out.shape) if keepdims else out
        return super().sum(a, axes, keepdims)

    def max(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        """``ArrayBackend.max``; a max over the last axis alone of a NumPy array (a softmax's, a log-sum-exp's)
        through ``_row_max``."""
        if type(a) is np.ndarray and a.ndim and len(axes) == 1 and axes[0] % a.ndim == a.ndim - 1:
            top = self._row_max(a)
            return top if keepdims else top.reshape(a.shape[:-1])
        return super().max(a, axes, keepdims)

    def sdpa_forward(self, q: Array, k: Array, v: Array, scale: float, causal: bool) -> tuple[Array, Array]:
        """``Backend.sdpa_forward`` with the softmax finished in place in the scores' buffer (the generic
        default's operations); the rows' sums as one BLAS matrix-vector product with ones (NumPy's reduction
        over a short last axis pays per row: the small GPT's (32, 4, 32, 32) scores, 128 -> 22 us). The
        generic default unless q, k, v are float32 NumPy arrays."""
        if not _float_ndarrays(q, k, v) or q.dtype != np.float32:
            return super().sdpa_forward(q, k, v, scale, causal)
        p = self._probabilities(q, k, scale, causal)
        top = self._row_max(p)
        p -= top
        np.exp(p, out=p)
        keys = p.shape[-1]
        total = np.matmul(p.reshape(math.prod(p.shape[:-1]), keys), self._ones(keys, p.dtype)).reshape(top.shape)
        p /= total
        stats = np.log(total)
        stats += top
        return np.matmul(p, v), stats

    def sdpa_backward(self, q: Array, k: Array, v: Array, out: Array, dout: Array, stats: Array, scale: float,
                      causal: bool) -> tuple[Array, Array, Array]:
        """``Backend.sdpa_backward`` in place: the weights rebuilt in the scores' buffer, ``dS`` in the
        ``dO V^T`` buffer, the rows' ``dO . O`` by ``einsum`` (no product array; the small GPT's strided
        (32, 4, 32, 16) heads: 124 -> 33 us); the generic default unless every array is a float32 NumPy
        array."""
        if not _float_ndarrays(q, k, v, out, dout, stats) or q.dtype != np.float32:
            return super().sdpa_backward(q, k, v, out, dout, stats, scale, causal)
        p = self._probabilities(q, k, scale, causal)
        p -= stats
        np.exp(p, out=p)
        dv = np.matmul(p.swapaxes(-1, -2), dout)
        ds = np.matmul(dout, v.swapaxes(-1, -2))
        ds -= np.einsum("...d,...d->...", dout, out)[..., None]
        ds *= p
        ds *= scale
        return np.matmul(ds, k), np.matmul(ds.swapaxes(-1, -2), q), dv

    @staticmethod
    def _rows_index(index: Any, axis: int, shape: tuple) -> np.ndarray | None:
        """The 1-d index of an ``index_select`` / ``index_add`` (an embedding's forward and backward): an integer
        NumPy array broadcast (stride 0) along every axis but ``axis``, as long as ``shape`` there; None for any
        other index."""
        if type(index) is not np.ndarray or index.ndim != len(shape) or index.dtype.kind not in "iu":
            return None
        for d, (stride, n, m) in enumerate(zip(index.strides, index.shape, shape)):
            if d != axis and (n != m or n == 0 or (stride and n != 1)):
                return None
        return index[tuple(slice(None) if d == axis else 0 for d in range(index.ndim))]

    def gather(self, a: Array, axis: int, index: Array) -> Array:
        """``ArrayBackend.gather``; an ``index_select``'s index (``_rows_index``) as one ``np.take`` of whole rows
        instead of ``take_along_axis``'s element-by-element gather: the small GPT's token embedding, (1024, 64)
        from (65, 64), 308 -> 14 us (the same values)."""
        rows = self._rows_index(index, axis, a.shape) if type(a) is np.ndarray else None
        if rows is not None:
            return np.take(a, rows, axis=axis)
        return super().gather(a, axis, index)

    def scatter_add(self, a: Array, axis: int, index: Array, src: Array) -> Array:
        """``ArrayBackend.scatter_add`` for float arrays in range without ``np.add.at`` (which walks its index
        grids element by element): an ``index_add``'s index (``_rows_index``: an embedding's backward) by whole
        rows (``_add_rows``), any other as one ``np.bincount`` over flat destination indices ((1024, 64) rows into
        (65, 64): add.at 0.76 ms, bincount 0.18-0.30, rows 0.14). The sums may differ from ``add.at``'s running
        sums in the last bits, as PyTorch's own order does. Other dtypes, and indices out of range (which
        ``add.at`` reports), take the generic path."""
        if (type(a) is not np.ndarray or a.dtype.kind != "f" or type(index) is not np.ndarray or index.size == 0
                or index.ndim != a.ndim
                or any(i > n for d, (i, n) in enumerate(zip(index.shape, a.shape)) if d != axis)):
            return super().scatter_add(a, axis, index, src)
        rows = self._rows_index(index, axis, a.shape)
        targets = index if rows is None else rows  # a row index is range-checked once, not per broadcast copy
        if targets.min() < 0 or targets.max() >= a.shape[axis]:
            return super().scatter_add(a, axis, index, src)
        values = np.broadcast_to(src, index.shape)
        if rows is not None:
            return self._add_rows(a, axis, rows, values)
        flat = np.multiply(index, math.prod(a.shape[axis + 1:]), dtype=np.intp)
        for d, n in enumerate(index.shape):
            if d != axis:
                step = math.prod(a.shape[d + 1:])
                flat += np.arange(0, n * step, step, dtype=np.intp).reshape((-1,) + (1,) * (a.ndim - 1 - d))
        sums = np.bincount(flat.ravel(), weights=values.ravel(), minlength=a.size).reshape(a.shape)
        sums += a
        return sums.astype(a.dtype)

    @staticmethod
    def _add_rows(a: np.ndarray, axis: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A copy of ``a`` with slice ``i`` of ``values`` along ``axis`` added at ``rows[i]`` (in range): the rows
        sorted stably by destination, each destination's run summed in order by one ``np.add.reduceat``, and the
        sums added to their rows at once."""
        order = np.argsort(rows, kind="stable")
        dest = rows[order]
        starts = np.flatnonzero(np.concatenate(([True], dest[1:] != dest[:-1])))
        sums = np.add.reduceat(np.take(values, order, axis=axis), starts, axis=axis)
        out = a.copy()
        out[(slice(None),) * axis + (dest[starts],)] += sums
        return out

    _TRANSPOSE_BLOCK = 128  # elements per run in the two-stage transposing copy (16-256 measured alike)
    _TRANSPOSE_BLOCK_BYTES = 1 << 18  # the largest block transposed in one piece (L2-resident)

    @classmethod
    def _c_copy(cls, a: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of ``a`` (``a`` itself when it already is one).

        Where ``a`` is a permuted view of a contiguous buffer whose copy amounts to a 2-d transpose (a batch-last
        convolution layout ``(C, *S, N)`` read as ``(N, C, *S)`` or back), the copy runs in two stages: runs of
        ``_TRANSPOSE_BLOCK`` contiguous elements moved as blocks, then each small block transposed while it sits
        in L1. NumPy's one-stage copy reads the source with a large stride per element: a (32, 3*64*64) float32
        transpose 0.69 -> 0.18 ms (torch: 0.26 ms). Other layouts: ``np.ascontiguousarray``."""
        if a.flags.c_contiguous:
            return a
        frame = cls._frame(a)
        nd = a.ndim
        k = next((k for k in range(1, nd) if frame == tuple(range(k, nd)) + tuple(range(k))), None)
        b = cls._TRANSPOSE_BLOCK
        if k is None or a.size < 4 * b * b:
            return np.ascontiguousarray(a)
        rows, cols = math.prod(a.shape[:k]), math.prod(a.shape[k:])  # the copy is src (cols, rows) -> (rows, cols)
        src = a.transpose(frame).reshape(cols, rows)
        cache = cls._TRANSPOSE_BLOCK_BYTES // (b * a.itemsize)  # the small dim a block transpose keeps in cache
        if rows % b == 0 and cols <= min(rows, cache):  # blocks of b destination rows: (cols, b) block transposes
            staged = np.ascontiguousarray(src.reshape(cols, rows // b, b).transpose(1, 0, 2))
            out = np.ascontiguousarray(staged.transpose(0, 2, 1))
        elif cols % b == 0 and rows <= cache:  # blocks of b destination columns: (b, rows) block transposes
            staged = np.ascontiguousarray(src.reshape(cols // b, b, rows).transpose(0, 2, 1))
            out = np.ascontiguousarray(staged.transpose(1, 0, 2))
        else:
            return np.ascontiguousarray(a)
        return out.reshape(a.shape)

    @classmethod
    def _copy_in_frame(cls, a: np.ndarray, frame: tuple[int, ...]) -> np.ndarray:
        """A copy of ``a`` laid out in the axis order ``frame`` (``_frame``'s form), returned with ``a``'s shape:
        ``_c_copy``'s two-stage transposing copy where the change of layout is a 2-d transpose."""
        return cls._c_copy(a.transpose(frame)).transpose(cls._inverse(frame))

    #: Elements from which a replayed two-operand ufunc with operands in two layouts relays one first.
    _RELAY_MIN = 1 << 16

    def replay_call(self, fn: Callable[..., Any], args: tuple, kwargs: dict, out: Any) -> Callable[..., Any]:
        """``Backend.replay_call``: a two-operand ufunc whose operands are laid out in two different axis orders
        (a batch-last convolution's output against an NCHW target or dropout mask) reads one of them across
        its layout, a large stride per element. Its replays copy that operand into the result's layout first,
        by ``_c_copy``'s two-stage transposing copy, and run the ufunc on one layout. The values are the
        same, and so is the result's layout (NumPy lays a result out as its operands are when they agree).
        Only for same-shape array operands of at least ``_RELAY_MIN`` elements, each contiguous in some axis
        order, one of them in the result's; ``fn`` itself otherwise."""
        if (type(fn) is not np.ufunc or fn.nin != 2 or len(args) != 2 or kwargs or type(out) is not np.ndarray
                or out.ndim < 2 or out.size < self._RELAY_MIN):
            return fn
        a, b = args
        if type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != out.shape or b.shape != out.shape:
            return fn
        frame = self._frame(out)
        in_frame = [x.transpose(frame).flags.c_contiguous for x in (out, a, b)]
        if not in_frame[0] or in_frame[1] == in_frame[2]:
            return fn
        other = b if in_frame[1] else a
        if not other.transpose(self._frame(other)).flags.c_contiguous:
            return fn
        relay = self._copy_in_frame
        if in_frame[1]:
            def call(x: np.ndarray, y: np.ndarray) -> np.ndarray:
                return fn(x, relay(y, frame))
        else:
            def call(x: np.ndarray, y: np.ndarray) -> np.ndarray:
                return fn(relay(x, frame), y)
        call.__qualname__ = f"relaid {fn.__name__}"
        return call

    def contiguous(self, a: Array) -> Array:
        """``ArrayBackend.contiguous`` with the two-stage transposing copy (``_c_copy``) for NumPy arrays."""
        if type(a) is np.ndarray and a.ndim >= 2:
            return self._c_copy(a)
        return super().contiguous(a)

    def reshape(self, a: Array, shape: Shape) -> Array:
        """A view where NumPy can make one; otherwise the copy is ``_c_copy``'s (a flatten of a batch-last
        convolution output is a 2-d transpose)."""
        if type(a) is np.ndarray and not a.flags.c_contiguous and a.ndim >= 2:
            try:
                return np.reshape(a, shape, copy=False)
            except ValueError:  # not expressible as a view
                return self._c_copy(a).reshape(shape)
            except TypeError:  # NumPy < 2.1: no copy argument
                return a.reshape(shape)
        return a.reshape(shape)

    def pad(self, a: Array, widths: Sequence[tuple[int, int]], value: float) -> Array:
        """``ArrayBackend.pad`` of ``_c_copy(a)`` when ``a`` is a transposed layout (a convolution's NCHW input
        read batch-last): the fill copy then reads contiguous runs."""
        if type(a) is np.ndarray and not a.flags.c_contiguous and a.ndim >= 2:
            a = self._c_copy(a)
        return super().pad(a, widths, value)

    _WHERE_MIN = 1 << 14  # elements from which the bitwise select beats np.where's per-element branch
    _WHERE_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}

    def where(self, cond: Array, a: Array, b: Array) -> Array:
        """``where`` as a branch-free select on the values' bits, ``b ^ ((a ^ b) * cond)`` in unsigned integers
        (``cond``'s 0 or 1 multiplies a whole bit pattern): three vectorised passes instead of ``np.where``'s
        per-element branch, which a random mask mispredicts half the time (a 2-MiB LeakyReLU input: 2.1 ->
        0.3 ms); with ``b`` a scalar +0 the select is the one pass ``a * cond`` (ReLU's backward). Multiplying
        by the boolean itself replaced an all-ones mask built from it (two more passes): ReLU's backward on
        mnist's (64, 64, 24, 24) activation 4.5 -> 2.2 ms with its ``x > 0``. Bit copies, so the values (NaN
        payloads, signed zeros) are exactly ``np.where``'s. The generic path unless ``cond`` is a boolean array
        of at least ``_WHERE_MIN`` elements and ``a``/``b`` are float arrays of one dtype or a Python number
        with one such array."""
        arrays = [v for v in (a, b) if type(v) is np.ndarray]
        if (type(cond) is not np.ndarray or cond.dtype != np.bool_ or cond.size < self._WHERE_MIN or not arrays
                or arrays[0].dtype.kind != "f" or any(v.dtype != arrays[0].dtype for v in arrays)
                or any(type(v) is not np.ndarray and not isinstance(v, (int, float)) for v in (a, b))
                or isinstance(a, bool) or isinstance(b, bool)):
            return super().where(cond, a, b)
        dtype = arrays[0].dtype
        bits = self._WHERE_BITS[dtype.itemsize]
        a_bits, b_bits = (np.asarray(v, dtype=dtype).view(bits) for v in (a, b))
        if type(b) is not np.ndarray and not b_bits.any():  # b is +0 (ReLU's backward): a * cond, one pass
            return np.multiply(a_bits, cond, dtype=bits).view(dtype)
        out = np.bitwise_xor(a_bits, b_bits)
        fits = out.shape == np.broadcast_shapes(out.shape, cond.shape)
        out = np.multiply(out, cond, out=out if fits else None, dtype=bits)
        np.bitwise_xor(out, b_bits, out=out)
        return out.view(dtype)

    def leaky_relu_backward(self, g: Array, y: Array, slope: float) -> Array:
        """``Backend.leaky_relu_backward`` for ``0 <= slope <= 1`` as ``g * factor``, the factor 1 where ``y > 0``
        and ``slope`` elsewhere (NaN included, as the generic default's ``y > 0`` is false there) built on the
        values' bits: ``slope + (y > 0) * (1 - slope)`` in unsigned integers, exact for any slope (non-negative
        floats order as their bit patterns). Branch-free passes: the generic select of two scalars is
        ``np.where``'s per-element branch, which mispredicts on an activation's signs (dcgan_d's first LeakyReLU
        backward, (32, 16, 32, 32) float32, 2.9 -> 0.42 ms as ``g * fmax(sign(y), slope)``), and ``np.sign`` is
        not vectorised (that form 629-888 -> 573-667 us; best of 7 x 30, the project's 2-core VM). The generic
        default for other slopes and inputs."""
        if not (_float_ndarrays(g, y) and g.shape == y.shape and y.ndim and 0 <= slope <= 1):
            return super().leaky_relu_backward(g, y, slope)
        bits = self._WHERE_BITS[y.dtype.itemsize]
        one, low = (np.array(v, dtype=y.dtype).view(bits)[()] for v in (1.0, slope))
        factor = np.multiply(np.greater(y, 0), one - low, dtype=bits)
        factor += low
        factor = factor.view(y.dtype)
        factor *= g
        return factor

    def gelu_exact_backward(self, g: Array, x: Array, d: Array | None) -> Array:
        """``g * d``: ``d`` is the derivative ``gelu_exact`` saved for such an ``x`` (``_gelu_fits``; one pass);
        the generic default, from ``x``, when nothing was saved or ``g`` is not a NumPy array of its dtype, and
        from the generic forward's cdf for other inputs."""
        if not self._gelu_fits(x):
            return super().gelu_exact_backward(g, x, d)
        if d is None or type(g) is not np.ndarray or g.dtype != d.dtype:
            return super().gelu_exact_backward(g, x, None)
        return np.multiply(g, d)

    @staticmethod
    def _gelu_derivative64(x: np.ndarray, cdf: np.ndarray) -> np.ndarray:
        """``cdf + x * exp(-x*x/2) / sqrt(2*pi)`` in one new array, one pass per operation."""
        t = np.multiply(x, x)
        t *= -0.5
        np.exp(t, out=t)
        t *= 1.0 / math.sqrt(2.0 * math.pi)
        t *= x
        t += cdf
        return t

    # im2col blocks, measured on this project's 2-core VM (2 MiB of L2 per core). Every convolution call of one
    # training step replayed under each setting, settings alternated: whole up to 8 MiB instead of 4, convnet's
    # calls 12.9 -> 11.8 ms (its 16 -> 32 channel layer's 4.7 MiB im2col is one block and one GEMM), dcgan's 2%
    # less; chunks of 4 MiB instead of 1 (mnist: 1.8 MiB an output row), mnist's calls 54.7 -> 50.3 ms. Whole
    # fg.jit steps, the settings toggled in one process: mnist 112 -> 102 ms (median of 6 blocks), convnet and
    # dcgan within 1%.
    _CONV_CHUNK_BYTES = 4 << 20  # im2col rows built at a time when the whole im2col is larger
    _CONV_WHOLE_BYTES = 8 << 20  # an im2col up to this size is built whole (small layers: fewer, larger copies)

    def _conv_rows(self, x: np.ndarray, k: int, out: tuple[int, ...]) -> int:
        """Output rows (first spatial dim) per chunk for an input ``x``."""
        return self._conv_rows_of(x.shape[0] * k, out, x.shape[-1], x.itemsize)

    def _conv_rows_of(self, cols_rows: int, out: tuple[int, ...], batch: int, itemsize: int) -> int:
        """Output rows (first spatial dim) per chunk: an im2col block of about ``_CONV_CHUNK_BYTES``, or all of
        them when the whole ``(cols_rows, *out, batch)`` im2col is at most ``_CONV_WHOLE_BYTES``."""
        row = cols_rows * math.prod(out[1:]) * batch * itemsize
        if row * out[0] <= self._CONV_WHOLE_BYTES:
            return out[0]
        return max(1, min(out[0], self._CONV_CHUNK_BYTES // max(row, 1)))

    def conv_gemm(self, x: Array, w: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                  dilation: tuple[int, ...], out: tuple[int, ...],
                  padding: tuple[tuple[int, int], ...] | None = None) -> Array:
        """``Backend.conv_gemm`` a cache-sized block of output rows at a time: each block's im2col is copied
        into one reused buffer and multiplied straight into its rows of the result, so no ``C_in * K``-times
        input-sized buffer exists (mnist's second conv, forward: 16.8 -> 11 ms). The padding is written by the
        im2col itself (``_conv_cols_into``): no padded copy of ``x``. The generic default unless ``x`` and
        ``w`` are NumPy arrays of one float dtype."""
        if not _float_ndarrays(x, w):
            return super().conv_gemm(x, w, kernel, stride, dilation, out, padding)
        padding = None if padding is None else tuple(map(tuple, padding))  # hashable: the im2col's cache key
        x = self._c_copy(x)  # a permuted view (an NCHW input read batch-last): the im2col reads contiguous runs
        k = math.prod(kernel)
        rows = self._conv_rows(x, k, out)
        result = np.empty((w.shape[0],) + tuple(out) + (x.shape[-1],), dtype=x.dtype)
        buf = None
        for r0 in range(0, out[0], rows):
            r1 = min(out[0], r0 + rows)
            buf = self._conv_cols_into(buf, x, kernel, stride, dilation, out, r0, r1, padding)
            self._gemm_into(w, buf, result[:, r0:r1].reshape(w.shape[0], -1))
        return result

    _SHORT_K = 64  # a GEMM reducing over fewer rows than this runs in pieces of _SHORT_K_COLUMNS columns
    _SHORT_K_COLUMNS = 1024

    def _gemm_into(self, w: np.ndarray, cols: np.ndarray, dst: np.ndarray) -> None:
        """``dst = w @ cols``; with a short reduction (a first layer's ``C_in * K`` of 9-48) in pieces of
        ``_SHORT_K_COLUMNS`` columns, which OpenBLAS runs about twice as fast as one wide product there (convnet's
        first conv 0.85 -> 0.51 ms, dcgan_d's 1.39 -> 1.08 ms; no gain from 64 rows on, so whole there)."""
        if w.shape[1] >= self._SHORT_K:
            np.matmul(w, cols, out=dst)
            return
        step = self._SHORT_K_COLUMNS
        for j in range(0, cols.shape[1], step):
            np.matmul(w, cols[:, j:j + step], out=dst[:, j:j + step])

    _GW_MIN_ROWS = 16  # im2col rows from which a weight gradient is taken as (cols @ g^T)^T

    @classmethod
    def _rows_times_cols_t(cls, g2: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """A weight gradient's ``g2 @ cols^T`` (``(C_out, M) @ (M, C_in * K)``), as ``(cols @ g2^T)^T`` unless the
        im2col has fewer than ``_GW_MIN_ROWS`` rows. On every convolution GEMM of the CPU benchmarks OpenBLAS runs
        that orientation 10-40% faster whatever the ratio of columns to rows (the rule it replaces took it only
        from 4 columns per row on: dcgan_d's 64 -> 128 layer 1.61 -> 1.39 ms, convnet's 64 -> 128 0.94 -> 0.81
        ms, 128 -> 128 0.46 -> 0.41 ms), and 15% slower only at 9 rows (mnist's first layer: 0.86 vs 1.03 ms).
        Both are one BLAS call over the same products; only the blocking of the sums differs."""
        if cols.shape[0] < cls._GW_MIN_ROWS:
            return g2 @ cols.T
        return (cols @ g2.T).T

    def conv_gemm_transpose_backward(self, x: Array, w: Array, g: Array, kernel: tuple[int, ...],
                                     stride: tuple[int, ...], dilation: tuple[int, ...], need_x: bool,
                                     need_w: bool, padding: tuple[tuple[int, int], ...] | None = None) -> tuple:
        """``Backend.conv_gemm_transpose_backward`` a cache-sized block of rows at a time, each block of ``g``'s
        im2col built once and read by both GEMMs: ``gx``'s rows (``w @ cols``) and ``gw += x_rows @ cols^T``
        (dcgan_g's generator backward: one im2col per layer instead of two). The ``padding`` of a cropped
        forward is written by the im2col, as in ``conv_gemm``: no padded copy of ``g``. The generic default
        unless ``x``, ``w`` and ``g`` are NumPy arrays of one float dtype."""
        if not _float_ndarrays(x, w, g):
            return super().conv_gemm_transpose_backward(x, w, g, kernel, stride, dilation, need_x, need_w,
                                                        padding)
        padding = None if padding is None else tuple(map(tuple, padding))  # hashable: the im2col's cache key
        in_size = tuple(x.shape[1:-1])
        x, g = self._c_copy(x), self._c_copy(g)
        rows = self._conv_rows(g, math.prod(kernel), in_size)
        gx = np.empty((w.shape[0],) + in_size + (x.shape[-1],), dtype=x.dtype) if need_x else None
        gw = np.zeros(w.shape, dtype=x.dtype) if need_w else None
        buf = None
        for r0 in range(0, in_size[0], rows):
            r1 = min(in_size[0], r0 + rows)
            buf = self._conv_cols_into(buf, g, kernel, stride, dilation, in_size, r0, r1, padding)
            if need_x:
                self._gemm_into(w, buf, gx[:, r0:r1].reshape(w.shape[0], -1))
            if need_w:
                gw += self._rows_times_cols_t(x[:, r0:r1].reshape(x.shape[0], -1), buf)
        return gx, gw

    def conv_gemm_backward(self, x: Array, w: Array, g: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                           dilation: tuple[int, ...], need_x: bool, need_w: bool,
                           padding: tuple[tuple[int, int], ...] | None = None) -> tuple:
        """``Backend.conv_gemm_backward`` a cache-sized block of output rows at a time: the block's im2col is
        rebuilt into one reused buffer for the weight gradient (its padding written by the im2col, as in
        ``conv_gemm``), and its ``w^T @ g`` rows are folded into the input gradient while they are in cache
        (mnist's second conv, backward with the im2col rebuilt: 28 ms against 30 ms for the whole-buffer form
        reading a saved im2col); the input gradient is folded into the padded shape and returned as the view
        of ``x``'s part. The generic default unless ``x``, ``w`` and ``g`` are NumPy arrays of one float
        dtype."""
        if not _float_ndarrays(x, w, g):
            return super().conv_gemm_backward(x, w, g, kernel, stride, dilation, need_x, need_w, padding)
        padding = None if padding is None else tuple(map(tuple, padding))  # hashable: the im2col's cache key
        out = tuple(g.shape[1:-1])
        g = self._c_copy(g)
        if need_w:
            x = self._c_copy(x)
        k = math.prod(kernel)
        rows = self._conv_rows(x, k, out)
        gw = np.zeros(w.shape, dtype=x.dtype) if need_w else None
        gx = None
        full = x.shape if padding is None else (
            (x.shape[0],) + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[1:-1], padding)) + (x.shape[-1],))
        if need_x:
            gx = self._conv_fold_whole(g, w, kernel, stride, dilation, out, full)
            if gx is not None:
                need_x = False
            else:
                gx = np.zeros(full, dtype=x.dtype)
        wt = w.T if need_x else None  # BLAS reads the transpose in place: no (C_in * K, C_out) copy per call
        buf = gbuf = None
        for r0 in range(0, out[0], rows):
            r1 = min(out[0], r0 + rows)
            g2 = g[:, r0:r1].reshape(g.shape[0], -1)
            if need_w:
                buf = self._conv_cols_into(buf, x, kernel, stride, dilation, out, r0, r1, padding)
                gw += self._rows_times_cols_t(g2, buf)
            if need_x:
                gbuf = self._conv_fold_rows(gx, wt, g2, gbuf, kernel, stride, dilation, out, r0, r1)
        if gx is not None and padding is not None:
            gx = gx[self._unpadded_part(x.shape, padding)]
        return gx, gw

    def conv_gemm_transpose(self, g: Array, w: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                            dilation: tuple[int, ...], x_shape: tuple[int, ...],
                            crop: tuple[tuple[int, int], ...] | None = None) -> Array:
        """``Backend.conv_gemm_transpose`` a cache-sized block of ``g``'s rows at a time (each block's
        ``w^T @ g`` folded while in cache, as in ``conv_gemm_backward``). A ``crop`` is returned as a
        contiguous array, written in place by the stride-phase form (``_conv_phase_transpose``) and copied out
        otherwise: the next layer's fast paths need one (a cropped view sent DCGAN's batch norms, forward and
        backward, through the generic default). The generic default unless ``g`` and ``w`` are NumPy arrays of
        one float dtype."""
        if not _float_ndarrays(g, w):
            return super().conv_gemm_transpose(g, w, kernel, stride, dilation, x_shape, crop)
        if crop is not None and not any(lo or hi for lo, hi in crop):
            crop = None
        out = tuple(g.shape[1:-1])
        g = self._c_copy(g)
        if crop is not None and self._conv_phases_apply(kernel, stride, dilation, out, x_shape):
            return self._conv_phase_transpose(g, w, kernel, stride, x_shape, crop)
        gx = self._conv_fold_whole(g, w, kernel, stride, dilation, out, x_shape)
        if gx is None:
            gx = self._conv_fold_blocks(g, w, kernel, stride, dilation, out, x_shape)
        return gx if crop is None else np.ascontiguousarray(gx[self._cropped_part(x_shape, crop)])

    def _conv_fold_blocks(self, g: np.ndarray, w: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple,
                          out: tuple, x_shape: tuple) -> np.ndarray:
        """The col2im of ``w^T @ g`` into zeros of ``x_shape``, a cache-sized block of ``g``'s rows at a time,
        each kernel offset's rows added into its strided slice (``_conv_fold_rows``)."""
        rows = self._conv_rows_of(x_shape[0] * math.prod(kernel), out, x_shape[-1], g.itemsize)
        gx = np.zeros(x_shape, dtype=g.dtype)
        wt = w.T  # BLAS reads the transpose in place (dcgan_g's 100 -> 128 layer: 0.73 -> 0.18 ms for w^T @ g)
        gbuf = None
        for r0 in range(0, out[0], rows):
            r1 = min(out[0], r0 + rows)
            g2 = g[:, r0:r1].reshape(g.shape[0], -1)
            gbuf = self._conv_fold_rows(gx, wt, g2, gbuf, kernel, stride, dilation, out, r0, r1)
        return gx

    def _conv_fold_whole(self, g: np.ndarray, w: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple,
                         out: tuple, x_shape: tuple) -> np.ndarray | None:
        """The col2im of ``w^T @ g`` into a new array of ``x_shape`` by the form that writes the input gradient
        without strided adds: stride phases (``_conv_phases_apply``) or, at stride 1, contiguous shifts
        (``_conv_fold_flat``); None where neither applies (the caller folds block by block)."""
        if self._conv_phases_apply(kernel, stride, dilation, out, x_shape):
            return self._conv_phase_transpose(g, w, kernel, stride, x_shape)
        if all(st == 1 for st in stride):
            return self._conv_fold_flat(g, w, kernel, dilation, x_shape)
        return None

    @staticmethod
    def _conv_phases_apply(kernel: tuple, stride: tuple, dilation: tuple, out: tuple, x_shape: tuple) -> bool:
        """Whether ``_conv_phase_transpose`` takes this col2im: a strided kernel that is a multiple of its
        stride, no dilation (a padded kernel would multiply zeros), and at most 30% more GEMM columns than
        ``g`` has positions (its windows overhang ``g`` by ``m - 1`` per dim). Measured on dcgan's layers: the
        phases win at 9/8 rows per phase (2.6 -> 2.1 ms) and lose at 5/4 (2.2 -> 2.6 ms); at stride 1 the
        scattered adds win (mnist, convnet)."""
        if any(d != 1 for d in dilation) or any(k % s for k, s in zip(kernel, stride)) or all(s == 1 for s in stride):
            return False
        q = math.prod(-(-size // s) for size, s in zip(x_shape[1:-1], stride))
        return 10 * q <= 13 * math.prod(out)

    def _conv_phase_transpose(self, g: np.ndarray, w: np.ndarray, kernel: tuple, stride: tuple,
                              x_shape: tuple, crop: tuple | None = None) -> np.ndarray:
        """The col2im of ``w^T @ g`` (``conv_gemm_transpose``) as one GEMM per block of rows with no scattered
        adds, for kernels ``m * s`` (``_conv_phases_apply``).

        Input position ``s*q + r`` (phase ``r < s``) receives ``w[r + s*j]^T g[q - j]`` for ``j < m``: every
        phase reads the same window of ``m`` consecutive ``g`` positions, so the whole input gradient is
        ``W @ cols`` with ``cols`` the stride-1 im2col of ``g`` padded by ``m - 1`` (``(C_out * m^d, Q^d N)``)
        and ``W`` ``(C_in * s^d, C_out * m^d)`` the weight with its kernel split into ``(m, s)`` and ``m``
        flipped; the result ``(C_in, s..., Q..., N)`` is copied into place phase by phase (``_phase_spans``:
        one strided copy per phase, only the rows ``x_shape`` less ``crop`` keeps). Against the scattered form
        (``K`` strided read-add-writes of input-gradient-sized blocks) this writes each input element once:
        dcgan_d's second convolution, input gradient 4.8 -> 2.9 ms."""
        nd = len(kernel)
        c_out, n = g.shape[0], g.shape[-1]
        c_in = x_shape[0]
        m = tuple(k // s for k, s in zip(kernel, stride))
        q = tuple(-(-size // s) for size, s in zip(x_shape[1:-1], stride))  # rows of each phase
        widths = [(0, 0)] + [(mm - 1, qq - o) for mm, qq, o in zip(m, q, g.shape[1:-1])] + [(0, 0)]
        gp = np.pad(g, widths) if any(lo or hi for lo, hi in widths) else g
        # w (C_out, C_in, m1, s1, m2, s2, ...) -> (C_in, s1, s2, ..., C_out, m1, m2, ...), m flipped
        split = w.reshape((c_out, c_in) + tuple(v for mm, s in zip(m, stride) for v in (mm, s)))
        split = np.flip(split, axis=tuple(2 + 2 * i for i in range(nd)))
        order = (1,) + tuple(3 + 2 * i for i in range(nd)) + (0,) + tuple(2 + 2 * i for i in range(nd))
        wp = np.ascontiguousarray(split.transpose(order)).reshape(c_in * math.prod(stride), c_out * math.prod(m))
        crop = crop or ((0, 0),) * nd
        kept = tuple(size - lo - hi for size, (lo, hi) in zip(x_shape[1:-1], crop))
        result = np.empty((c_in,) + kept + (n,), dtype=g.dtype)
        spans = _phase_spans(tuple(stride), q, kept, tuple(lo for lo, _ in crop))
        rows = self._conv_rows_of(c_out * math.prod(m), q, n, g.itemsize)
        buf = res = None
        ones = (1,) * nd
        every = (slice(None),)
        s0 = stride[0]
        for r0 in range(0, q[0], rows):
            r1 = min(q[0], r0 + rows)
            buf = self._conv_cols_into(buf, gp, m, ones, ones, q, r0, r1)
            if res is None or res.shape[1] != buf.shape[1]:
                res = np.empty((wp.shape[0], buf.shape[1]), dtype=g.dtype)
            np.matmul(wp, buf, out=res)
            # GEMM result (C_in, s1..sd, rows, Q2..Qd, N): each phase's rows copied to their places
            blocks = res.reshape((c_in,) + tuple(stride) + (r1 - r0,) + q[1:] + (n,))
            for phase, (q0, q1, u0), tail in spans:
                qa, qb = max(q0, r0), min(q1, r1)
                if qa >= qb:
                    continue
                dst = (slice(u0 + (qa - q0) * s0, u0 + (qb - 1 - q0) * s0 + 1, s0),) + tail[0]
                np.copyto(result[every + dst + every], blocks[every + phase + (slice(qa - r0, qb - r0),) + tail[1]])
        return result

    def _conv_fold_flat(self, g: np.ndarray, w: np.ndarray, kernel: tuple, dilation: tuple,
                        x_shape: tuple) -> np.ndarray:
        """The col2im of ``w^T @ g`` (``conv_gemm_transpose``) for a stride-1 convolution, as contiguous adds.

        With stride 1, kernel offset ``o`` sends output position ``p`` to input position ``p + o * dilation``:
        over the flattened ``(C_in, S0 * S1 * ... * N)`` input that is one constant shift per offset when the
        output is laid out on the input's full rows (``(out0, S1, ..., N)``, the positions past ``out[i]`` in
        ``g``'s copy held at zero). Each block of ``g``'s rows is copied into that layout, multiplied by
        ``w^T`` and each offset's rows added into a plain 2-d slice of the input gradient: one run of
        contiguous memory per channel instead of a 4-d strided view. The block's last ``tail`` positions
        (past the last valid output column) are left out so no shift reads past the input. Same sums in the
        same order as the strided fold, so the same bits; mnist's second convolution's input gradient 21.8 ->
        16.6 ms (2 BLAS threads), the extra ``(S1 / out1)`` GEMM columns included."""
        c_in, n = x_shape[0], x_shape[-1]
        c_out, out = g.shape[0], tuple(g.shape[1:-1])
        spatial = tuple(x_shape[1:-1])
        steps = [math.prod(spatial[i + 1:]) * n for i in range(len(spatial))]  # flat stride of each spatial dim
        offsets = [sum(o * d * st for o, d, st in zip(off, dilation, steps))
                   for off in itertools.product(*(range(k) for k in kernel))]
        tail = sum((k - 1) * d * st for k, d, st in zip(kernel[1:], dilation[1:], steps[1:]))
        plane = steps[0]  # elements of one input row, as of one full-width output row
        k = len(offsets)
        rows = self._conv_rows_of(c_in * k, (out[0],) + spatial[1:], n, g.itemsize)
        gx = np.zeros(x_shape, dtype=g.dtype)
        flat = gx.reshape(c_in, -1)
        wt = w.T  # BLAS reads the transpose in place
        gp = np.zeros((c_out, rows) + spatial[1:] + (n,), dtype=g.dtype)  # zeros past out[1:] stay zero
        gbuf = np.empty((c_in * k, rows * plane), dtype=g.dtype)
        valid = (slice(None), slice(None)) + tuple(slice(0, o) for o in out[1:]) + (slice(None),)
        for r0 in range(0, out[0], rows):
            r1 = min(out[0], r0 + rows)
            np.copyto(gp[:, :r1 - r0][valid], g[:, r0:r1])
            m = (r1 - r0) * plane - tail
            res = gbuf[:, :m]
            np.matmul(wt, gp[:, :r1 - r0].reshape(c_out, -1)[:, :m], out=res)
            blocks = res.reshape(c_in, k, m)
            for j, shift in enumerate(offsets):
                view = flat[:, r0 * plane + shift:r0 * plane + shift + m]
                np.add(view, blocks[:, j], out=view)
        return gx

    def _conv_fold_rows(self, gx: np.ndarray, wt: np.ndarray, g2: np.ndarray, gbuf, kernel: tuple, stride: tuple,
                        dilation: tuple, out: tuple, r0: int, r1: int) -> np.ndarray:
        """``wt @ g2`` (output rows ``r0:r1``) into ``gbuf`` (new when None or of another size), each kernel
        offset's rows added into its strided slice of ``gx``; returns the buffer for the next block."""
        if gbuf is None or gbuf.shape[1] != g2.shape[1]:
            gbuf = np.empty((wt.shape[0], g2.shape[1]), dtype=gx.dtype)
        np.matmul(wt, g2, out=gbuf)
        blocks = gbuf.reshape((gx.shape[0], math.prod(kernel), r1 - r0) + tuple(out[1:]) + (gx.shape[-1],))
        for j, ix in enumerate(self._conv_offsets(gx.shape, kernel, stride, dilation, out, r0, r1)):
            view = gx[ix]
            np.add(view, blocks[:, j], out=view)
        return gbuf

    def _conv_cols_into(self, buf, x: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple, out: tuple,
                        r0: int, r1: int, padding: tuple[tuple[int, int], ...] | None = None) -> np.ndarray:
        """The im2col of output rows ``r0:r1`` copied into ``buf`` (a new one when ``buf`` is None or of
        another size), returned as ``(C_in * K, cols)``. With ``padding`` (``(low, high)`` per spatial dim)
        ``x`` is the unpadded input: each offset copies the part of its window inside ``x`` and writes zeros
        in the slabs that read the padding (``_conv_offsets_padded``), so no padded copy of ``x`` is made."""
        c, n = x.shape[0], x.shape[-1]
        k = math.prod(kernel)
        shape = (c, k, r1 - r0) + tuple(out[1:]) + (n,)
        if buf is None or buf.size != math.prod(shape):
            buf = np.empty(shape, dtype=x.dtype)
        blocks = buf.reshape(shape)
        if padding is None:
            for j, ix in enumerate(self._conv_offsets(x.shape, kernel, stride, dilation, out, r0, r1)):
                np.copyto(blocks[:, j], x[ix])
        else:
            offsets = _conv_offsets_padded(x.shape, kernel, stride, dilation, tuple(out), r0, r1, padding)
            for j, (src, dst, zeros) in enumerate(offsets):
                block = blocks[:, j]
                for z in zeros:
                    block[z] = 0
                if src is not None:
                    np.copyto(block[dst], x[src])
        return blocks.reshape(c * k, -1)

    _ADAM_CHUNK = 65536  # elements per chunk of adam_step: 256 KiB per float32 buffer, ~1.5 MiB in flight

    def add_into(self, dst: Array, src: Array) -> Array:
        """Optional composite: ``dst + src`` written into ``dst`` and returned when ``dst`` is a writable
        array (the autograd engine's accumulation into a sum it made itself, a linear layer's bias into its
        GEMM's output; ``src`` has ``dst``'s dtype and shape or broadcasts to it); a new sum otherwise (a 0-d
        result is a NumPy scalar)."""
        if type(dst) is np.ndarray and dst.flags.writeable:
            return np.add(dst, src, out=dst)
        return np.add(dst, src)

    #: Parameters of at most this many elements are updated together by ``adam_step_multi``: copied into one
    #: buffer per operand, one set of passes, copied back (seven copies against twelve ufunc calls a tensor).
    _ADAM_SMALL = 2048

    @staticmethod
    def _adam_in_place(p: Any, g: Any, m: Any, v: Any) -> bool:
        """Whether ``adam_step``'s in-place passes take these operands: NumPy arrays of one dtype and shape,
        ``p``, ``m`` and ``v`` writable and contiguous (the step scalars are checked by ``_adam_host_scalars``)."""
        nd = np.ndarray
        if type(p) is not nd or type(g) is not nd or type(m) is not nd or type(v) is not nd:
            return False
        dtype = p.dtype
        if g.dtype != dtype or m.dtype != dtype or v.dtype != dtype or p.shape != g.shape:
            return False
        fp, fm, fv = p.flags, m.flags, v.flags
        return fp.writeable and fm.writeable and fv.writeable and fp.c_contiguous and fm.c_contiguous and \
            fv.c_contiguous

    @staticmethod
    def _adam_host_scalars(step_size: Any, eps_hat: Any, decay: Any) -> bool:
        """Whether the step scalars are host numbers (inside ``fg.capture`` they are 0-d device arrays, which
        the generic default takes)."""
        return is_host_scalar(step_size) and is_host_scalar(eps_hat) and is_host_scalar(decay)

    @staticmethod
    def _adam_gradient(g: np.ndarray, p: np.ndarray, l2: float, maximize: bool) -> np.ndarray:
        """The gradient ``adam_step`` updates with, flat: ``-g`` with ``maximize``, plus ``l2 * p`` with L2
        decay (``g`` and ``p`` of one size, each flattened in C order)."""
        g = np.ravel(g)
        if maximize:
            g = -g
        if l2:
            g = g + l2 * p.reshape(-1)
        return g

    def adam_step(self, p: Array, g: Array, m: Array, v: Array, beta1: float, beta2: float, step_size: Any,
                  eps_hat: Any, l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                  v_max: Array | None = None) -> tuple:
        """One Adam/AdamW update written in place with ufunc ``out=`` arguments (see ``Backend.adam_step``).

        ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*g*g``; ``p = p*decay - step_size*m/(sqrt(v)+eps_hat)``
        (``g`` is ``-g`` with ``maximize`` and ``g + l2*p`` with L2 decay). The generic tensor-op update costs
        a fresh array per op plus a copy per buffer; this does ~12 in-place passes per cache-sized chunk with
        two chunk-sized scratch arrays (``_adam_passes``). The generic default runs instead with AMSGrad
        (``v_max``), device scalars, or any buffer that is not a writable, contiguous array of one dtype and
        shape.
        """
        if v_max is not None or not (self._adam_in_place(p, g, m, v)
                                     and self._adam_host_scalars(step_size, eps_hat, decay)):
            return super().adam_step(p, g, m, v, beta1, beta2, step_size, eps_hat, l2, decay, maximize, v_max)
        self._adam_passes(p.reshape(-1), self._adam_gradient(g, p, l2, maximize), m.reshape(-1), v.reshape(-1),
                          beta1, beta2, step_size, eps_hat, decay)
        return p, m, v, None

    def _adam_passes(self, p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, beta1: float,
                     beta2: float, step_size: Any, eps_hat: Any, decay: Any) -> None:
        """The update of ``adam_step`` on flat contiguous arrays, in place, a cache-sized chunk at a time (the
        twelve passes of one chunk stay in L2 instead of streaming every buffer through memory twelve times:
        2.2x faster on a 512x512 weight, bitwise the same result)."""
        n = p.size
        chunk = max(1, min(n, self._ADAM_CHUNK))  # an empty parameter: no pass at all
        scratch, denom_buf = np.empty(chunk, dtype=p.dtype), np.empty(chunk, dtype=p.dtype)
        c1, c2 = 1.0 - beta1, 1.0 - beta2
        mul, add = np.multiply, np.add
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            pc, gc, mc, vc = p[start:stop], g[start:stop], m[start:stop], v[start:stop]
            if stop - start == chunk:
                tmp, denom = scratch, denom_buf
            else:
                tmp, denom = scratch[: stop - start], denom_buf[: stop - start]
            mul(gc, c1, out=tmp)
            mul(mc, beta1, out=mc)
            add(mc, tmp, out=mc)
            mul(gc, gc, out=tmp)
            mul(tmp, c2, out=tmp)
            mul(vc, beta2, out=vc)
            add(vc, tmp, out=vc)
            np.sqrt(vc, out=denom)
            add(denom, eps_hat, out=denom)
            mul(mc, step_size, out=tmp)
            np.divide(tmp, denom, out=tmp)
            if decay != 1.0:
                mul(pc, decay, out=pc)
            np.subtract(pc, tmp, out=pc)

    def adam_step_multi(self, params: Sequence[Array], grads: Sequence[Array], ms: Sequence[Array],
                        vs: Sequence[Array], beta1: float, beta2: float, step_size: Any, eps_hat: Any,
                        l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                        v_maxs: Sequence[Array] | None = None) -> tuple[list, list, list, list | None]:
        """``Backend.adam_step_multi`` with the small tensors (``_ADAM_SMALL``: biases, norm weights) of a
        dtype updated together: their operands copied into one flat buffer each, ``adam_step``'s passes run
        once over them (``_adam_passes``), ``p``, ``m`` and ``v`` copied back. Elementwise passes give each
        element the same result wherever it sits, so every tensor gets what ``adam_step`` gives it, bit for
        bit; twelve ufunc calls per small tensor become seven copies. A step of the CPU benchmarks' Adam (old and
        new code alternated, this project's 2-core VM): gated_routing (38 tensors, 28 of them small) 1.09-1.20 ->
        0.74-0.76 ms, residual_tower (52, 38) 3.02-3.12 -> 2.68-2.77 ms, mlp (18, 13) 3.02-3.10 -> 2.63-2.73
        ms. Larger tensors, and anything ``adam_step`` would not update in place, go one by one."""
        if v_maxs is not None or not self._adam_host_scalars(step_size, eps_hat, decay):
            return super().adam_step_multi(params, grads, ms, vs, beta1, beta2, step_size, eps_hat, l2, decay,
                                           maximize, v_maxs)
        out_p, out_m, out_v = list(params), list(ms), list(vs)
        small: dict[np.dtype, list[int]] = {}
        limit = self._ADAM_SMALL
        in_place = self._adam_in_place
        scalars = (beta1, beta2, step_size, eps_hat, decay)
        for i, p in enumerate(params):
            g, m, v = grads[i], ms[i], vs[i]
            if not in_place(p, g, m, v):
                out_p[i], out_m[i], out_v[i], _ = self.adam_step(p, g, m, v, beta1, beta2, step_size, eps_hat, l2,
                                                                 decay, maximize)
            elif 0 < p.size <= limit:
                members = small.get(p.dtype)
                if members is None:
                    small[p.dtype] = [i]
                else:
                    members.append(i)
            else:  # checked above: the passes directly, as adam_step would run them
                self._adam_passes(p.reshape(-1), self._adam_gradient(g, p, l2, maximize), m.reshape(-1),
                                  v.reshape(-1), *scalars)
        for members in small.values():
            if len(members) == 1:
                i = members[0]
                p, m, v = params[i], ms[i], vs[i]
                self._adam_passes(p.reshape(-1), self._adam_gradient(grads[i], p, l2, maximize), m.reshape(-1),
                                  v.reshape(-1), *scalars)
                continue
            # one flat buffer per operand (axis=None flattens each piece in C order, a transposed gradient too)
            flat_p = np.concatenate([params[i] for i in members], axis=None)
            flat_m = np.concatenate([ms[i] for i in members], axis=None)
            flat_v = np.concatenate([vs[i] for i in members], axis=None)
            flat_g = self._adam_gradient(np.concatenate([grads[i] for i in members], axis=None), flat_p, l2,
                                         maximize)
            self._adam_passes(flat_p, flat_g, flat_m, flat_v, *scalars)
            start = 0
            for i in members:
                p = params[i]
                stop = start + p.size
                np.copyto(p.reshape(-1), flat_p[start:stop])
                np.copyto(ms[i].reshape(-1), flat_m[start:stop])
                np.copyto(vs[i].reshape(-1), flat_v[start:stop])
                start = stop
        return out_p, out_m, out_v, None

    @staticmethod
    def _einsum_reduce(operands: tuple, axes: tuple[int, ...], shape: tuple[int, ...] | None = None) -> Array:
        """``sum(prod(operands), axes)`` in one ``einsum`` pass (no product temporary; ~2x a ``sum`` of
        one array), reshaped to ``shape`` or keeping the reduced dims as 1."""
        full = operands[0].shape
        if shape is None:
            shape = tuple(1 if i in axes else n for i, n in enumerate(full))
        frame = NumpyBackend._frame(operands[0])
        if frame != tuple(range(len(full))):
            # A permuted view (a convolution's batch-last output): reduce in its memory order, where the
            # passes stream contiguously; the kept dims are then permuted back (a tiny array).
            kept_axes = [f for f in frame if f not in axes]  # original axis of each kept dim, in frame order
            operands = tuple(o.transpose(frame) for o in operands)
            axes = tuple(j for j, f in enumerate(frame) if f in axes)
            letters = "abcdefghijklmnopqrstuvwxyz"[: len(full)]
            kept = "".join(c for i, c in enumerate(letters) if i not in axes)
            out = np.einsum(",".join([letters] * len(operands)) + "->" + kept, *operands)
            order = sorted(range(len(kept_axes)), key=lambda i: kept_axes[i])
            return out.transpose(order).reshape(shape)
        letters = "abcdefghijklmnopqrstuvwxyz"[: len(full)]
        kept = "".join(c for i, c in enumerate(letters) if i not in axes)
        out = np.einsum(",".join([letters] * len(operands)) + "->" + kept, *operands)
        return out.reshape(shape)

    @staticmethod
    def _sum_axes_to(full: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
        """The axes of ``full`` that broadcasting a ``shape`` array over it expanded (right-aligned)."""
        lead = len(full) - len(shape)
        return tuple(i for i, n in enumerate(full) if i < lead or (shape[i - lead] == 1 and n != 1))

    def standardize(self, x: Array, axes: tuple[int, ...], eps: float, w: Array | None,
                    b: Array | None) -> tuple | None:
        """Optional composite for normalization layers: ``(y, mean, var, xhat, rstd)`` with ``xhat =
        (x - mean) * rstd`` over ``axes`` (biased variance) and ``y = xhat * w + b``; ``mean``, ``var``
        and ``rstd`` keep the reduced dims.

        Sums run as ``einsum`` reductions (the variance without a squared temporary) and ``xhat`` is
        scaled in place: about five passes over ``x`` instead of nine. None (generic path) unless ``x``
        is a float32/float64 NumPy array and ``w``/``b`` are arrays of its dtype.
        """
        if type(x) is not np.ndarray or x.dtype not in (np.float32, np.float64) or \
                any(t is not None and (type(t) is not np.ndarray or t.dtype != x.dtype) for t in (w, b)):
            return super().standardize(x, axes, eps, w, b)
        count = 1
        for a in axes:
            count *= x.shape[a]
        mean = self._einsum_reduce((x,), axes)
        mean *= 1.0 / count
        xhat = np.subtract(x, mean)
        var = self._einsum_reduce((xhat, xhat), axes)
        var *= 1.0 / count
        rstd = np.add(var, eps)
        np.sqrt(rstd, out=rstd)
        np.reciprocal(rstd, out=rstd)
        np.multiply(xhat, rstd, out=xhat)
        y = xhat
        if w is not None:
            y = np.multiply(y, w)
        if b is not None:
            y = np.add(y, b) if y is xhat else np.add(y, b, out=y)
        return y, mean, var, xhat, rstd

    def standardize_backward(self, g: Array, xhat: Array, rstd: Array, w: Array | None, axes: tuple[int, ...],
                             need_x: bool, w_shape: tuple[int, ...] | None,
                             b_shape: tuple[int, ...] | None) -> tuple | None:
        """Optional composite, the backward of ``standardize``: ``(gx, gw, gb)`` (None where not asked:
        ``need_x`` false, ``w_shape``/``b_shape`` None) for ``gx = rstd * (gy - mean(gy) - xhat *
        mean(gy * xhat))`` with ``gy = g * w``, ``gw = sum_to(g * xhat)``, ``gb = sum_to(g)``.

        When ``w`` is constant over ``axes`` (batch norm: one weight per channel) the two means come from
        the same reductions as ``gw`` and ``gb``, and ``gx`` is four in-place passes. None (generic path)
        unless ``g`` is a NumPy array of ``xhat``'s dtype.
        """
        if type(g) is not np.ndarray or g.dtype != xhat.dtype:
            return super().standardize_backward(g, xhat, rstd, w, axes, need_x, w_shape, b_shape)
        full = xhat.shape
        count = 1
        for a in axes:
            count *= full[a]
        w_b = None if w is None else w.reshape((1,) * (len(full) - w.ndim) + w.shape)
        gx = gw = gb = None
        if w_b is None or all(w_b.shape[a] == 1 for a in axes):
            sg = self._einsum_reduce((g,), axes) if (need_x or b_shape is not None) else None
            sgx = self._einsum_reduce((g, xhat), axes) if (need_x or w_shape is not None) else None
            if need_x:
                scale = rstd if w_b is None else rstd * w_b
                gx = np.multiply(xhat, sgx * (1.0 / count))
                gx += sg * (1.0 / count)
                np.subtract(g, gx, out=gx)
                gx *= scale
            if w_shape is not None:
                gw = self._reduce_small(sgx, w_shape)
            if b_shape is not None:
                gb = self._reduce_small(sg, b_shape)
            return gx, gw, gb
        if need_x:
            gy = np.multiply(g, w_b)
            m1 = self._einsum_reduce((gy,), axes)
            m1 *= 1.0 / count
            m2 = self._einsum_reduce((gy, xhat), axes)
            m2 *= 1.0 / count
            gx = np.multiply(xhat, m2)
            gx += m1
            np.subtract(gy, gx, out=gx)
            gx *= rstd
        if w_shape is not None:
            gw = self._einsum_reduce((g, xhat), self._sum_axes_to(full, w_shape), w_shape)
        if b_shape is not None:
            gb = self._einsum_reduce((g,), self._sum_axes_to(full, b_shape), b_shape)
        return gx, gw, gb

    def _reduce_small(self, a: Array, shape: tuple[int, ...]) -> Array:
        """``a`` (already reduced, with kept dims) summed to ``shape``."""
        axes = self._sum_axes_to(a.shape, shape)
        if axes:
            a = a.sum(axis=axes)
        return a.reshape(shape)

    @staticmethod
    def _frame(a: np.ndarray) -> tuple[int, ...]:
        """The axis order in which ``a`` is C-contiguous when it is a permuted view of a contiguous array
        (a convolution's ``(N, C, *S)`` output laid out ``(C, *S, N)``, and everything elementwise after it),
        else the identity: block views are then taken in that frame without a copy."""
        order = tuple(range(a.ndim))
        if not a.flags.c_contiguous and a.ndim >= 2:
            frame = tuple(sorted(order, key=lambda i: (-a.strides[i], i)))
            if a.transpose(frame).flags.c_contiguous:
                return frame
        return order

    @staticmethod
    def _block_view(b: np.ndarray, frame: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[np.ndarray, list]:
        """``b = a.transpose(frame)`` with each spatial axis of ``a`` (``2 + i``) split into ``(n // k, k)``
        (a view of a contiguous ``b``), and the position of each ``k`` axis in that view."""
        shape: tuple[int, ...] = ()
        k_axes = [0] * len(kernel)
        for n, orig in zip(b.shape, frame):
            if orig >= 2:
                k = kernel[orig - 2]
                shape += (n // k, k)
                k_axes[orig - 2] = len(shape) - 1
            else:
                shape += (n,)
        return b.reshape(shape), k_axes

    @staticmethod
    def _inverse(frame: tuple[int, ...]) -> tuple[int, ...]:
        inv = [0] * len(frame)
        for i, f in enumerate(frame):
            inv[f] = i
        return tuple(inv)

    def max_pool_blocks(self, a: Array, kernel: tuple[int, ...]) -> Array:
        """The maximum of each non-overlapping ``kernel`` block of ``(N, C, *S)``
        (stride equal to the kernel, every ``S[i]`` a multiple of ``kernel[i]``), NaN propagating.

        One ``maximum`` per pair of block slices, innermost axis first, on a reshaped view taken in the
        input's memory order: no window stack, no index array (a reduction over the split axes is ~40x
        slower in NumPy) and no copy of a permuted input. The generic default where ``a`` is not a NumPy
        array.
        """
        if type(a) is not np.ndarray:
            return super().max_pool_blocks(a, kernel)
        frame = self._frame(a)
        m, k_axes = self._block_view(a.transpose(frame), frame, kernel)
        for i in sorted(range(len(kernel)), key=lambda i: -k_axes[i]):  # innermost first: positions stay valid
            lead = (slice(None),) * k_axes[i]
            best = m[lead + (0,)]
            for j in range(1, kernel[i]):
                best = np.maximum(best, m[lead + (j,)], out=best if j > 1 else None)
            m = best
        out = m.copy() if all(k == 1 for k in kernel) else m  # a 1x1 kernel: a copy, never an alias
        return out.transpose(self._inverse(frame))

    def max_pool_blocks_backward(self, a: Array, best: Array, g: Array, kernel: tuple[int, ...]) -> Array:
        """The gradient of ``max_pool_blocks`` for ``a``: each block's gradient goes to its first maximum in
        row-major order (to its last NaN where it has one), as PyTorch's CPU kernel does.

        The masks are computed here from ``a`` and the forward's ``best``: one compare per block offset on
        output-sized arrays, an ``and not`` against the offsets already taken, and one masked product
        written straight into that offset's strided view of the result (laid out like ``a``). The generic
        default where ``a`` is not a NumPy array (as in the forward).
        """
        if type(a) is not np.ndarray:
            return super().max_pool_blocks_backward(a, best, g, kernel)
        frame = self._frame(a)  # the forward's frame: no copy of ``a``, and ``gx`` laid out like it
        a, best, g = a.transpose(frame), best.transpose(frame), g.transpose(frame)
        # A gradient laid out otherwise (a flatten's (N, C*H*W) after a batch-last convolution) is copied into
        # the frame once: the per-offset passes below on a transposed view ran 3x slower (mnist's pool: 11 ->
        # 3.8 ms, the copy included).
        best, g = self._c_copy(best), self._c_copy(g)
        blocks, k_axes = self._block_view(a, frame, kernel)
        gx = np.empty(a.shape, dtype=g.dtype)
        gblocks = gx.reshape(blocks.shape)
        # Index positions in the output-sized arrays: each k axis removed (innermost first).
        drop = sorted(k_axes, reverse=True)
        indices = []
        for off in itertools.product(*(range(k) for k in kernel)):
            index = [slice(None)] * blocks.ndim
            for i, o in enumerate(off):
                index[k_axes[i]] = o
            indices.append(tuple(index))
        small = [n for j, n in enumerate(blocks.shape) if j not in drop]
        best = best.reshape(small)
        g = g.reshape(small)
        # The gradient's bit patterns times the boolean (``where``'s select): +0 where a block's maximum is not
        # (a float product gave -0 under a negative gradient, and NaN under a NaN one), as the generic default
        # and PyTorch write; the same time as the float product on mnist's pool (5.7-8.3 against 6.0-7.3 ms).
        bits = self._WHERE_BITS[g.dtype.itemsize]  # a float gradient: 2, 4 or 8 bytes
        g_sel, out_sel = g.view(bits), gblocks.view(bits)
        taken = None
        for n, index in enumerate(indices):
            if n == len(indices) - 1 and taken is not None:
                first = np.logical_not(taken)
            else:
                hit = np.equal(blocks[index], best)
                if taken is None:
                    first = taken = hit
                else:
                    first = hit & ~taken
                    taken |= hit
            np.multiply(g_sel, first, out=out_sel[index], dtype=bits)
        nan_blocks = np.isnan(best) if best.dtype.kind == "f" else None
        if nan_blocks is not None and nan_blocks.any():
            # PyTorch's CPU kernel lets every NaN replace the running maximum: the last NaN of a block wins.
            taken = None
            for index in reversed(indices):
                hit = np.isnan(blocks[index])
                first = hit if taken is None else hit & ~taken
                taken = hit if taken is None else taken | hit
                np.copyto(gblocks[index], np.where(first, g, 0), where=nan_blocks)
        return gx.transpose(self._inverse(frame))

    @staticmethod
    def is_available() -> bool:
        """NumPy is a hard dependency: always available."""
        return True
