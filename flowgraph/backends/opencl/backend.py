"""``OpenCLBackend``: the backend protocol on PyOpenCL with generated, cached, fused kernels.

Elementwise primitives return lazy :class:`CLArray` s through the lazy engine shared with CUDA
(:mod:`flowgraph.backends.lazy`, which decides when a chain runs and what runs before a buffer is
overwritten); this module supplies the storage (buffer, strides, offset) and the kernels, and the chain runs as
one kernel when a boundary needs a buffer. Reductions read their input through the same fused program, so
``sum(x * y)`` is one kernel too. Kernels are keyed by structure (program key, dtypes, collapsed rank),
never by sizes, and built programs are shared per context across backend instances.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import BackendError, ShapeError
from .. import flags, fusion
from .. import row_kernels as R
from ..base import BINARY_OPS, UNARY_OPS, Array, Backend, Shape, nocopy_strides
from ..fusion import (
    BAKE_DIMS_MIN,
    MIN_REDUCTION_BLOCKS,
    Expr,
    Scalar,
    UpdateKernel,
    accumulate_dims,
    adam_update_scalars,
    index_fits_int,
    is_host_scalar,
    linearize,
    matmul_dims,
    operand_spans,
    reduction_layout,
)
from ..lazy import LazyEngine, flatten
from . import conv as CK
from . import kernels as K
from .array import CLArray, contiguous_strides, is_contiguous, shape_size
from .runtime import build_program, cl, compile_stats, device_context, list_devices

_BOOL = np.dtype(bool)
_I64 = np.dtype(np.int64)
_INT64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F16 = np.dtype(np.float16)
#: Launch layouts (``_launch_fused``'s plans) a backend keeps before it starts again.
PLAN_MEMO = 8192
# C-level field reads for the per-operand work of a launch
_strides_of = operator.attrgetter("strides")
_offset_of = operator.attrgetter("offset")
_add = operator.add


def _scalar_args(scalars: Sequence[Scalar]) -> list[Any]:
    """Kernel arguments for a program's scalars (bool travels as a 0/1 uchar)."""
    return [int(s.value) if s.dtype.kind == "b" else s.value for s in scalars]


_REDUCE_DTYPES: dict[tuple[str, np.dtype], np.dtype] = {}


def _reduce_dtype(op: str, dtype: np.dtype) -> np.dtype:
    """NumPy's result dtype of ``sum``/``prod`` as the NumPy backend calls them (floats keep their dtype)."""
    found = _REDUCE_DTYPES.get((op, dtype))
    if found is None:
        if dtype.kind == "f":
            found = dtype
        else:
            found = getattr(np, op)(np.zeros(1, dtype)).dtype
        _REDUCE_DTYPES[(op, dtype)] = found
    return found


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


class OpenCLBackend(LazyEngine, Backend):
    """The protocol on one OpenCL device (``"opencl:N"``, numbered over all platforms in order).

    >>> from flowgraph.backends import get_backend
    >>> be = get_backend("opencl:0")                       # doctest: +SKIP
    >>> be.to_host(be.add(be.from_host(np.ones(3)), 1.0))  # doctest: +SKIP
    array([2., 2., 2.])
    """

    name = "opencl"
    _lazy_type = CLArray
    _array_name = "a CLArray"
    _emitter = K.OpenCLEmitter
    #: Work-group size cap for reductions (a power of two).
    REDUCE_GROUP = 256
    #: Reductions with fewer outputs than ``fusion.MIN_REDUCTION_BLOCKS`` and more inputs per output than
    #: SPLIT_ABOVE_INPUTS are split over up to MAX_PARTS work-groups per output (enough for that many
    #: work-groups in all, at least SPLIT_ABOVE_INPUTS inputs each), then the partial results are folded.
    #: BatchNorm2d(128)'s per-channel sums over (128, 32, 32) ran as 128 work-groups before: most of a GPU idle.
    SPLIT_ABOVE_INPUTS = 16384
    MAX_PARTS = 256
    #: Reductions of at most this many inputs per output, into at least SERIAL_REDUCE_OUTPUTS outputs, run one
    #: work-item per output (``reduce_source(serial=True)``): the sums of split-K partial results, leading-axis
    #: sums.
    SERIAL_REDUCE_INPUTS = 64
    SERIAL_REDUCE_OUTPUTS = 4096
    #: Work-group size of elementwise and line kernels.
    ELEMENTWISE_GROUP = 128

    def __init__(self, device: str = "opencl:0"):
        kind, _, index = device.partition(":")
        if kind != "opencl" or not (index or "0").isdigit():
            raise BackendError(f"OpenCLBackend needs a device string 'opencl:<index>', got {device!r}")
        self.device = f"opencl:{int(index or 0)}"
        self.cl_device, self.context, self.queue = device_context(int(index or 0))
        extensions = self.cl_device.extensions.split()
        self.supports_float64 = "cl_khr_fp64" in extensions
        self.supports_float16 = "cl_khr_fp16" in extensions
        self.device_name = self.cl_device.name.strip()
        self._dtypes: set[np.dtype] = set()  # dtypes check_dtype has accepted on this device
        self._max_group = int(self.cl_device.max_work_group_size)
        self._group = _floor_pow2(min(self.ELEMENTWISE_GROUP, self._max_group))
        self._group_limits: dict[tuple, int] = {}  # (id(kernel), cap) -> group size (kernels stay cached)
        # matmul work-groups of threads x threads work-items, each computing work x work outputs
        self._matmul_threads = 16 if self._max_group >= 256 else 8
        self._matmul_work = 4
        from pyopencl.tools import ImmediateAllocator, MemoryPool

        self._pool = MemoryPool(ImmediateAllocator(self.queue))
        self._peak = 0
        self._alloc_ok = 0  # the largest allocation size checked against the device's limit so far
        self._gemm_2d: dict[tuple, tuple] = {}  # ``_gemm``'s 2-d kernel per (dtype, accumulate)
        self._conv_sizes: dict[tuple, list] = {}  # ``_conv_launch``'s integer arguments per layer and pass
        self._ew_plans: dict[tuple, tuple] = {}  # ``_launch_fused``'s layout work per program and layout
        self._kernels: dict[tuple, tuple[Any, K.KernelSource]] = {}
        self._init_lazy()
        self._ones: dict[np.dtype, Any] = {}  # bias_grad_accumulate's realized scalar one, per dtype
        self._seed = 0
        self._counter = 0

    # ----------------------------------------------------------------- discovery
    @staticmethod
    def list_devices() -> list[str]:
        """Every OpenCL device as ``"opencl:N"``; ``[]`` (never raises) without pyopencl or a platform."""
        return list_devices()

    @staticmethod
    def is_available() -> bool:
        """Whether at least one OpenCL device can be used."""
        return bool(list_devices())

    @staticmethod
    def compile_stats() -> dict[str, float]:
        """Programs compiled so far in this process and the seconds spent (cache misses only)."""
        return compile_stats()

    # ----------------------------------------------------------------- dtype checks and allocation
    def check_dtype(self, dtype: Any, where: str) -> np.dtype:
        """``dtype`` as a numpy dtype this device computes, or a BackendError saying why not."""
        if dtype in self._dtypes:  # the hot path: one set lookup
            return dtype
        dtype = np.dtype(dtype)
        if dtype.name == "bfloat16":
            raise BackendError(
                f"{where}: bfloat16 is not supported on OpenCL ({self.device}); use float16 (where the "
                "device has cl_khr_fp16) or float32, or run bfloat16 on 'cuda' or 'cpu'"
            )
        if dtype == _F16 and not self.supports_float16:
            raise BackendError(
                f"{where}: float16 needs the cl_khr_fp16 extension, which {self.device} ({self.device_name}) "
                "lacks; use float32"
            )
        if dtype == _F64 and not self.supports_float64:
            raise BackendError(
                f"{where}: float64 needs the cl_khr_fp64 extension, which {self.device} ({self.device_name}) "
                "lacks; use float32"
            )
        if dtype not in K.EMITTER_TYPES:
            raise BackendError(
                f"{where}: dtype {dtype} is not supported on OpenCL; supported: bool, (u)int8-64, float16, "
                "float32, float64"
            )
        self._dtypes.add(dtype)
        return dtype

    def _allocate(self, nbytes: int) -> Any:
        if nbytes > self._alloc_ok:  # past every size that passed: ask the device's limit
            self._check_alloc(nbytes)
            self._alloc_ok = nbytes
        buffer = self._pool.allocate(max(nbytes, 1))
        active = self._pool.active_bytes
        if active > self._peak:
            self._peak = active
        return buffer

    def _check_alloc(self, nbytes: int) -> None:
        """A flowgraph error, before any work, for an array larger than the device can allocate."""
        limit = self._max_alloc
        if nbytes > limit:
            raise BackendError(
                f"{self.device}: an array of {nbytes / 2**20:.1f} MiB exceeds the device's largest allocation "
                f"({limit / 2**20:.1f} MiB, CL_DEVICE_MAX_MEM_ALLOC_SIZE); use smaller tensors or split the work"
            )

    @property
    def _max_alloc(self) -> int:
        found = self.__dict__.get("_max_alloc_bytes")
        if found is None:
            found = self.__dict__["_max_alloc_bytes"] = int(self.cl_device.max_mem_alloc_size)
        return found

    def empty(self, shape: Shape, dtype: np.dtype) -> CLArray:
        """A new uninitialised contiguous array (a non-protocol helper)."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        return CLArray(self, self._allocate(math.prod(shape) * dtype.itemsize), shape, None, 0, dtype)

    # ----------------------------------------------------------------- kernels
    def _kernel(self, key: tuple, make: Callable[[], K.KernelSource]) -> Any:
        """The cached kernel for ``key``; builds (or fetches the built program for) its source once."""
        found = self._kernels.get(key)
        if found is None:
            source = make()
            program = build_program(self.context, source.source)
            kernel = cl.Kernel(program, source.name)
            kernel.set_scalar_arg_dtypes(source.arg_dtypes)
            found = self._kernels[key] = (kernel, source)
        return found[0]

    def kernel_source(self, key: tuple) -> str | None:
        """The source of a cached kernel (for debugging), or None."""
        found = self._kernels.get(key)
        return found[1].source if found else None

    def _launch(self, kernel: Any, n: int, args: Sequence[Any]) -> None:
        group = self._group
        kernel(self.queue, (-(-n // group) * group,), (group,), *args)

    def _group_limit(self, kernel: Any, cap: int | None = None) -> int:
        """The largest power-of-two work-group (at most ``cap``, default REDUCE_GROUP) this kernel can run with."""
        cap = self.REDUCE_GROUP if cap is None else cap
        found = self._group_limits.get((id(kernel), cap))
        if found is None:
            size = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device)
            found = self._group_limits[(id(kernel), cap)] = _floor_pow2(min(int(size), cap))
        return found

    # ----------------------------------------------------------------- the lazy engine's hooks
    def _own(self, a: Any, where: str) -> CLArray:
        if type(a) is CLArray and a.backend is self:  # the common case first
            return a
        if not isinstance(a, CLArray):
            raise BackendError(f"{where}: expected a CLArray on {self.device}, got {type(a).__name__}")
        if a.backend is not self:
            raise BackendError(f"{where}: the array lives on {a.backend.device}, not {self.device}; move it first")
        return a

    def _operand(self, x: Any, where: str) -> CLArray | None:
        if type(x) is CLArray and x.backend is self:
            return x
        return self._own(x, where) if isinstance(x, CLArray) else None

    @staticmethod
    def _as_leaf(x: CLArray) -> CLArray:
        return x

    def _new_lazy(self, expr: Expr, shape: Shape, dtype: np.dtype) -> CLArray:
        return CLArray(self, None, shape, None, 0, dtype, expr)

    def _broadcast_leaf(self, x: CLArray, shape: Shape, where: str) -> CLArray:
        return self._expand_view(x, shape, where)

    def _channel_leaf(self, v: CLArray, shape: Shape) -> CLArray:
        return CLArray(self, v.buffer, shape, (0, v.strides[0]) + (0,) * (len(shape) - 2), v.offset, v.dtype)

    _storage_of = operator.attrgetter("buffer")

    @staticmethod
    def _overlaps(a: CLArray, b: CLArray) -> bool:
        return a.offset != b.offset or a.strides != b.strides

    @staticmethod
    def _strides(x: CLArray) -> tuple[int, ...]:
        return x.strides

    def _fresh(self, shape: Shape, dtype: np.dtype) -> CLArray:
        return self.empty(shape, dtype)

    @staticmethod
    def _take_storage(x: CLArray, out: CLArray) -> None:
        x.buffer, x.strides, x.offset, x.lazy = out.buffer, out.strides, out.offset, None

    def _launch_fused(self, flat: tuple, root: Any, out: CLArray, outputs: tuple = (),
                      extras: Sequence[CLArray] = ()) -> None:
        n = out.size
        if n == 0:
            return
        key, leaves, scalars = flat
        written = [out, *leaves, *extras]
        dtype = out.dtype
        # the layout work (collapsed dims, each operand's furthest element) once per program and layout
        pkey = (key, dtype, out.shape, *map(_strides_of, written), outputs)
        plan = self._ew_plans.get(pkey)
        if plan is None:
            dims, cstrides = K.collapse(out.shape, [x.strides for x in written])
            spans = operand_spans(dims, cstrides)
            baked = tuple(dims) if len(dims) > 1 and n >= BAKE_DIMS_MIN else None
            if len(self._ew_plans) >= PLAN_MEMO:
                self._ew_plans.clear()
            plan = self._ew_plans[pkey] = (dims, cstrides, spans, baked, {})
        dims, cstrides, spans, baked, kernels = plan
        # 32-bit indices where the work-items (+ a group's rounding up) and every operand's reach fit
        limit = fusion.INT_INDEX_LIMIT
        it = "int" if n + 1024 <= limit and max(map(_add, spans, map(_offset_of, written))) <= limit else "long"
        kernel = kernels.get(it)
        if kernel is None:
            rank = len(dims)
            kernel = kernels[it] = self._kernel(
                ("ew", key, dtype, rank, outputs, baked, it),
                lambda: K.elementwise_source(linearize(root), rank, dtype, baked, it, outputs))
        args: list[Any] = [n, *dims]
        for x, x_strides in zip(written, cstrides):
            args += [x.buffer, x.offset, *x_strides]
        args += _scalar_args(scalars)
        self._launch(kernel, n, args)

    def _fill(self, dst: CLArray, value: Scalar) -> None:
        self._launch_fused(flatten(value), value, dst)

    # ----------------------------------------------------------------- elementwise
    def where(self, cond: Array, a: Array, b: Array) -> Array:
        return self._where(cond, a, b)

    def cast(self, a: Array, dtype: np.dtype) -> Array:
        return self._cast(a, dtype)

    # ----------------------------------------------------------------- host exchange and creation
    def from_host(self, array: np.ndarray) -> Array:
        host = np.asarray(array, order="C")
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        dtype = self.check_dtype(host.dtype, "from_host")
        out = self.empty(host.shape, dtype)
        if host.size:
            cl.enqueue_copy(self.queue, out.buffer, host.view(np.uint8) if dtype == _BOOL else host)
        return out

    def to_host(self, a: Array) -> np.ndarray:
        a = self.realize(self._own(a, "to_host"))
        host = np.empty(a.shape, dtype=a.dtype)
        if host.size == 0:
            return host
        if not is_contiguous(a.shape, a.strides):
            a = self.contiguous(a)
        target = host.view(np.uint8) if a.dtype == _BOOL else host
        cl.enqueue_copy(self.queue, target, a.buffer, src_offset=a.offset * a.dtype.itemsize)
        return host

    def full(self, shape: Shape, value: float | int | bool, dtype: np.dtype) -> Array:
        dtype = self.check_dtype(dtype, "full")
        self._check_alloc(shape_size(tuple(shape)) * dtype.itemsize)
        out = CLArray(self, None, tuple(shape), None, 0, dtype, Expr("copy", (Scalar(value, dtype),), dtype))
        if not fusion.is_enabled():
            return self.realize(out)
        return out

    def arange(self, start: float, stop: float, step: float, dtype: np.dtype) -> Array:
        dtype = self.check_dtype(dtype, "arange")
        if step == 0:
            raise BackendError("arange: step must not be zero")
        n = max(0, math.ceil((stop - start) / step))
        out = self.empty((n,), dtype)
        if n == 0:
            return out
        integral = all(float(v).is_integer() for v in (start, step))
        if dtype.kind in "iub" and integral:
            step_dtype, first, delta = _INT64, int(start), int(step)
        else:
            # NumPy's fill rule: start and start + step rounded to dtype, then start + i * delta.
            step_dtype = _F64 if self.supports_float64 else _F32
            first_value = np.array(start).astype(dtype)
            second_value = np.array(start + step).astype(dtype)
            first = float(first_value)
            delta = float(second_value) - first
        kernel = self._kernel(("arange", dtype.str, step_dtype.str), lambda: K.arange_source(dtype, step_dtype))
        self._launch(kernel, n, [n, n, out.buffer, 0, 1, first, delta])
        return out

    # ----------------------------------------------------------------- random
    def seed(self, seed: int) -> None:
        self._seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self._counter = 0

    def get_rng_state(self) -> np.ndarray:
        return np.array([self._seed, self._counter], dtype=np.uint64).view(np.int64)

    def set_rng_state(self, state: np.ndarray) -> None:
        seed, counter = (int(w) for w in np.ascontiguousarray(state, dtype=np.int64).view(np.uint64))
        self._seed, self._counter = seed, counter

    def _random(self, dist: str, shape: Shape, dtype: np.dtype, extra: Sequence[Any] = ()) -> CLArray:
        dtype = self.check_dtype(dtype, dist)
        if dist != "randint" and dtype.kind != "f":
            raise BackendError(f"{dist}: needs a floating dtype, got {dtype}")
        if dist == "randint" and dtype.kind not in "iu":
            raise BackendError(f"randint: needs an integer dtype, got {dtype}")
        out = self.empty(tuple(shape), dtype)
        n = out.size
        if n == 0:
            return out
        per = K.rng_per_block(dist, dtype)
        blocks = -(-n // per)
        kernel = self._kernel(("rng", dist, dtype.str), lambda: K.rng_source(dist, dtype))
        args = [out.buffer, n, self._counter, self._seed & 0xFFFFFFFF, self._seed >> 32, *extra]
        self._counter += blocks
        self._launch(kernel, blocks, args)
        return out

    def uniform(self, shape: Shape, dtype: np.dtype) -> Array:
        return self._random("uniform", shape, dtype)

    def normal(self, shape: Shape, dtype: np.dtype) -> Array:
        return self._random("normal", shape, dtype)

    def randint(self, low: int, high: int, shape: Shape, dtype: np.dtype) -> Array:
        if high <= low:
            raise BackendError(f"randint: needs low < high, got low={low}, high={high}")
        return self._random("randint", shape, dtype, (int(low), int(high) - int(low)))

    # ----------------------------------------------------------------- reductions and scans
    def _reduce(
        self,
        op: str,
        a: Array,
        axes: tuple[int, ...],
        keepdims: bool,
        out_dtype: np.dtype,
        acc_dtype: np.dtype,
    ) -> CLArray:
        a = self._own(a, op)
        axes = tuple(sorted(set(axes)))
        for axis in axes:
            if not 0 <= axis < a.ndim:
                raise ShapeError(f"{op}: axis {axis} is out of range for an array of shape {a.shape}")
        flat = flatten(a)
        leaves = flat[1]
        kept_shape, (kdims, kstrides), (rdims, rstrides) = reduction_layout(
            a.shape, axes, [leaf.strides for leaf in leaves])
        n_out, n_in = shape_size(kept_shape), shape_size(tuple(a.shape[d] for d in axes))
        if n_in == 0 and op in ("max", "min", "argmax", "argmin"):
            raise BackendError(
                f"{op}: zero-size reduction over axes {axes} of shape {a.shape} has no identity; "
                "reduce a non-empty axis"
            )
        out_shape = tuple(1 if d in axes else n for d, n in enumerate(a.shape)) if keepdims else kept_shape
        if n_out == 0:
            return self.empty(out_shape, out_dtype)
        arg = op in ("argmax", "argmin")
        # Short reductions over many outputs (split-K partial sums): one work-item per output, consecutive
        # outputs on consecutive work-items (``reduce_source(serial=True)``).
        serial = n_in <= self.SERIAL_REDUCE_INPUTS and n_out >= self.SERIAL_REDUCE_OUTPUTS and not arg
        # Few outputs over many inputs: split each output over several work-groups, then fold the parts.
        parts = 1
        if not serial and n_out < MIN_REDUCTION_BLOCKS and n_in > self.SPLIT_ABOVE_INPUTS and not arg:
            parts = min(self.MAX_PARTS, -(-n_in // self.SPLIT_ABOVE_INPUTS), -(-MIN_REDUCTION_BLOCKS // n_out))
        out = self.empty(out_shape if parts == 1 else (n_out, parts), out_dtype if parts == 1 else acc_dtype)
        kr, rr = len(kdims), len(rdims)
        written = out.dtype  # out_dtype, or acc_dtype for partial results
        # the global size is at most n_out * parts * REDUCE_GROUP work-items
        fits = index_fits_int(max(n_in, n_out * parts * self.REDUCE_GROUP), (*kdims, *rdims),
                              [(*ks, *rs) for ks, rs in zip(kstrides, rstrides)], [leaf.offset for leaf in leaves])
        it = "int" if fits else "long"
        key = ("reduce_serial" if serial else "reduce", op, flat[0], acc_dtype, written, kr, rr, it)
        kernel = self._kernel(key, lambda: K.reduce_source(linearize(a), kr, rr, op, acc_dtype, written, it,
                                                           serial=serial))
        args: list[Any] = [n_in, n_out if serial else parts, *kdims, *rdims, out.buffer]
        for leaf, ks, rs in zip(leaves, kstrides, rstrides):
            args += [leaf.buffer, leaf.offset, *ks, *rs]
        args += _scalar_args(flat[2])
        if serial:
            group = min(self._group_limit(kernel), self.REDUCE_GROUP)
            kernel(self.queue, (-(-n_out // group) * group,), (group,), *args)
            return out
        group = min(self._group_limit(kernel), _next_pow2(max(-(-n_in // parts), 1)))
        args.append(cl.LocalMemory(group * acc_dtype.itemsize))
        if arg:
            args.append(cl.LocalMemory(group * 8))
        kernel(self.queue, (n_out * parts * group,), (group,), *args)
        if parts > 1:
            folded = self._reduce(op, out, (1,), False, out_dtype, acc_dtype)
            return self._view(folded, out_shape, contiguous_strides(out_shape), 0)
        return out

    def _accumulator(self, dtype: np.dtype) -> np.dtype:
        if dtype == _F16:
            return _F32
        return dtype

    def sum(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        out_dtype = _reduce_dtype("sum", a.dtype)
        return self._reduce("sum", a, axes, keepdims, out_dtype, self._accumulator(out_dtype))

    def prod(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        out_dtype = _reduce_dtype("prod", a.dtype)
        return self._reduce("prod", a, axes, keepdims, out_dtype, self._accumulator(out_dtype))

    def max(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self._reduce("max", a, axes, keepdims, a.dtype, self._accumulator(a.dtype))

    def min(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self._reduce("min", a, axes, keepdims, a.dtype, self._accumulator(a.dtype))

    def any(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self._reduce("any", a, axes, keepdims, _BOOL, _BOOL)

    def all(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        return self._reduce("all", a, axes, keepdims, _BOOL, _BOOL)

    def argmax(self, a: Array, axis: int, keepdims: bool) -> Array:
        return self._reduce("argmax", a, (axis,), keepdims, _INT64, self._accumulator(a.dtype))

    def argmin(self, a: Array, axis: int, keepdims: bool) -> Array:
        return self._reduce("argmin", a, (axis,), keepdims, _INT64, self._accumulator(a.dtype))

    def _line_layout(
        self, shape: Shape, axis: int, strides: Sequence[tuple[int, ...]]
    ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """Collapsed line space: ``shape`` with ``axis`` removed, for operands with ``strides``."""
        line_shape = tuple(1 if d == axis else n for d, n in enumerate(shape))
        return K.collapse(line_shape, strides)

    def cumsum(self, a: Array, axis: int) -> Array:
        a = self.realize(self._own(a, "cumsum"))
        if not 0 <= axis < a.ndim:
            raise ShapeError(f"cumsum: axis {axis} is out of range for an array of shape {a.shape}")
        out = self.empty(a.shape, a.dtype)
        if out.size == 0:
            return out
        dims, strides = self._line_layout(a.shape, axis, [out.strides, a.strides])
        acc_dtype = _INT64 if a.dtype == _BOOL else self._accumulator(a.dtype)
        kernel = self._kernel(
            ("cumsum", a.dtype.str, len(dims)), lambda: K.cumsum_source(len(dims), a.dtype, acc_dtype)
        )
        n_lines = shape_size(dims)
        args = [
            n_lines,
            *dims,
            out.buffer,
            0,
            *strides[0],
            a.buffer,
            a.offset,
            *strides[1],
            a.shape[axis],
            a.strides[axis],
            out.strides[axis],
        ]
        self._launch(kernel, n_lines, args)
        return out

    # ----------------------------------------------------------------- movement
    def _expand_view(self, a: CLArray, shape: Shape, where: str) -> CLArray:
        shape = tuple(shape)
        if len(shape) < a.ndim:
            raise ShapeError(f"{where}: cannot broadcast shape {a.shape} to {shape} (fewer axes)")
        lead = len(shape) - a.ndim
        strides = [0] * lead
        for n, target, stride in zip(a.shape, shape[lead:], a.strides):
            if n == target:
                strides.append(stride)
            elif n == 1:
                strides.append(0)
            else:
                raise ShapeError(f"{where}: cannot broadcast shape {a.shape} to {shape} (NumPy rules)")
        return CLArray(self, a.buffer, shape, tuple(strides), a.offset, a.dtype)

    def _view(self, a: CLArray, shape: Shape, strides: Sequence[int], offset: int) -> CLArray:
        return CLArray(self, a.buffer, tuple(shape), tuple(strides), offset, a.dtype)

    def reshape(self, a: Array, shape: Shape) -> Array:
        a = self.realize(self._own(a, "reshape"))
        shape = tuple(map(int, shape))
        if shape.count(-1) == 1:  # one inferred axis, as NumPy allows
            known = shape_size(tuple(n for n in shape if n != -1))
            if known and a.size % known == 0:
                shape = tuple(a.size // known if n == -1 else n for n in shape)
        if shape_size(shape) != a.size or any(n < 0 for n in shape):
            raise ShapeError(f"reshape: cannot reshape an array of shape {a.shape} ({a.size} elements) to {shape}")
        if not is_contiguous(a.shape, a.strides):
            strides = nocopy_strides(a.shape, a.strides, shape)
            if strides is not None:  # a view, as NumPy's reshape gives (squeezing a column keeps it a view)
                return self._view(a, shape, strides, a.offset)
            a = self.contiguous(a)
        return self._view(a, shape, contiguous_strides(shape), a.offset)

    def permute(self, a: Array, axes: Sequence[int]) -> Array:
        a = self.realize(self._own(a, "permute"))
        axes = tuple(axes)
        shape, strides = a.shape, a.strides
        if axes == (1, 0) and len(shape) == 2:  # a matrix transposed (a linear layer's weight, each call)
            return CLArray(self, a.buffer, (shape[1], shape[0]), (strides[1], strides[0]), a.offset, a.dtype)
        if sorted(axes) != list(range(len(shape))):
            raise ShapeError(f"permute: axes {axes} are not a permutation of range({len(shape)})")
        return self._view(a, tuple(map(shape.__getitem__, axes)), tuple(map(strides.__getitem__, axes)), a.offset)

    def expand(self, a: Array, shape: Shape) -> Array:
        a = self.realize(self._own(a, "expand"))
        return self._expand_view(a, shape, "expand")

    def slice(self, a: Array, index: tuple[slice, ...]) -> Array:
        a = self.realize(self._own(a, "slice"))
        if len(index) > a.ndim:
            raise ShapeError(f"slice: {len(index)} slices for an array of {a.ndim} axes")
        shape, strides, offset = list(a.shape), list(a.strides), a.offset
        for axis, s in enumerate(index):
            start, stop, step = s.indices(a.shape[axis])
            if step <= 0:
                raise BackendError(f"slice: axis {axis} has step {step}; use flip for reversed order")
            length = len(range(start, stop, step))
            if length:
                offset += start * strides[axis]
            shape[axis] = length
            strides[axis] *= step
        return self._view(a, shape, strides, offset)

    def flip(self, a: Array, axes: Sequence[int]) -> Array:
        a = self.realize(self._own(a, "flip"))
        strides, offset = list(a.strides), a.offset
        for axis in set(axes):
            if a.shape[axis] > 0:
                offset += (a.shape[axis] - 1) * strides[axis]
            strides[axis] = -strides[axis]
        return self._view(a, a.shape, strides, offset)

    def pad(self, a: Array, widths: Sequence[tuple[int, int]], value: float) -> Array:
        a = self._own(a, "pad")
        if len(widths) != a.ndim:
            raise ShapeError(f"pad: {len(widths)} (before, after) pairs for an array of {a.ndim} axes")
        shape = tuple(n + lo + hi for n, (lo, hi) in zip(a.shape, widths))
        out = self.empty(shape, a.dtype)
        self._write(out, Scalar(value, a.dtype))
        inner = self.slice(out, tuple(slice(lo, lo + n) for n, (lo, _) in zip(a.shape, widths)))
        self._write(inner, a)
        return out

    def _strides(self, a: Array) -> tuple[int, ...] | None:
        return tuple(self._own(a, "reshape").strides)  # a pending expression counts as contiguous: never asked

    def is_contiguous(self, a: Array) -> bool:
        # A pending expression realizes into a fresh row-major buffer; an offset into a buffer does not matter.
        a = self._own(a, "is_contiguous")
        return a.lazy is not None or is_contiguous(a.shape, a.strides)

    def contiguous(self, a: Array) -> Array:
        a = self._own(a, "contiguous")
        if a.lazy is not None:
            return self.realize(a)
        if a.offset == 0 and is_contiguous(a.shape, a.strides):
            return a
        out = self.empty(a.shape, a.dtype)
        self._write(out, a)
        return out

    def assign(self, dst: Array, src: Array | float) -> Array:
        return self._assign(self.realize(self._own(dst, "assign")), src)

    def _optimizer_operands(self, p: Array, g: Array, state: tuple, where: str) -> tuple | None:
        """``(p, g, state)`` realized (``g`` contiguous, in ``p``'s dtype) for a fused optimizer kernel, or None
        (the generic path runs) unless ``p`` and the state buffers are contiguous float32/float64 arrays of one
        dtype and shape."""
        own, realize = self._own, self.realize
        p = realize(own(p, where))
        dtype, shape = p.dtype, p.shape
        if (dtype != _F32 and dtype != _F64) or not is_contiguous(shape, p.strides):
            return None
        buffers = []
        for x in state:  # a plain loop: this runs for every parameter at every step
            x = realize(own(x, where))
            if x.dtype != dtype or x.shape != shape or not is_contiguous(shape, x.strides):
                return None
            buffers.append(x)
        state = tuple(buffers)
        g = own(g, where)
        if g.shape != p.shape:
            return None
        return p, self.contiguous(g if g.dtype == p.dtype else self.cast(g, p.dtype)), state

    def _update_step(self, spec: UpdateKernel, p: Array, g: Array, state: tuple, steps: tuple,
                     scalars: tuple) -> bool:
        """Run the fused optimizer update ``spec`` in place on ``p`` and ``state``; False where it cannot."""
        operands = self._optimizer_operands(p, g, state, f"{spec.name}_step")
        if operands is None:
            return False
        p, g, state = operands
        device = not is_host_scalar(steps[0])
        t = p.dtype.type
        if device:
            steps = tuple(self.realize(self._own(x, f"{spec.name}_step")) for x in steps)
            if any(x.dtype != _F32 for x in steps):
                return False
            step_args = [a for x in steps for a in (x.buffer, x.offset)]
        else:
            step_args = [t(x) for x in steps]
        kernel = self._kernel((spec.name, p.dtype.str, device), lambda: K.update_source(spec, p.dtype, device))
        for x in (p, *state):  # pending expressions reading the old values run first
            self._flush_readers(id(x.buffer))
        args: list[Any] = [p.size] + [a for x in (p, *state, g) for a in (x.buffer, x.offset)]
        args += step_args + [t(x) for x in scalars]
        if p.size:
            self._launch(kernel, p.size, args)
        return True

    def adam_step_multi(self, params: Sequence[Array], grads: Sequence[Array], ms: Sequence[Array],
                        vs: Sequence[Array], beta1: float, beta2: float, step_size: Any, eps_hat: Any,
                        l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                        v_maxs: Sequence[Array] | None = None) -> tuple:
        """Optional fused composite (see ``Backend.adam_step_multi``): one launch per 8 tensors, each element
        updated by the same statements as ``adam_step``'s kernel (so bit for bit the same). The generic loop
        runs instead with AMSGrad, device scalars, or unless every ``p``, ``m``, ``v`` is a contiguous
        float32/float64 array of one dtype."""
        fits = v_maxs is None and all(is_host_scalar(s) for s in (step_size, eps_hat, decay))
        operands = [self._optimizer_operands(p, g, (m, v), "adam_step_multi") for p, g, m, v in
                    zip(params, grads, ms, vs)] if fits else [None]
        if not operands or any(o is None for o in operands) or len({o[0].dtype for o in operands}) != 1:
            return super().adam_step_multi(params, grads, ms, vs, beta1, beta2, step_size, eps_hat, l2, decay,
                                           maximize, v_maxs)
        dtype = operands[0][0].dtype
        t = dtype.type
        scalars = [t(step_size), t(eps_hat)] + [t(x) for x in adam_update_scalars(beta1, beta2, l2, decay, maximize)]
        for p, _, state in operands:  # pending expressions reading the old values run first
            for x in (p, *state):
                self._flush_readers(id(x.buffer))
        work = [o for o in operands if o[0].size]
        for start in range(0, len(work), R.OPENCL_ADAM_TENSORS):
            batch = work[start:start + R.OPENCL_ADAM_TENSORS]
            count = len(batch)
            kernel = self._kernel(("adam_multi", dtype.str, count),
                                  lambda count=count: K.row_kernel_source(R.adam_multi_buffers(count), dtype))
            args: list[Any] = [0]
            end = 0
            for p, g, (m, v) in batch:
                end += p.size
                args += [p.buffer, p.offset, g.buffer, g.offset, m.buffer, m.offset, v.buffer, v.offset, end]
            args[0] = end
            self._launch(kernel, end, args + scalars)
        return ([o[0] for o in operands], [o[2][0] for o in operands], [o[2][1] for o in operands], None)

    # ----------------------------------------------------------------- LayerNorm (shared row kernels)
    def _row_operand(self, a: Array, where: str) -> CLArray:
        """``a`` realized and row-major (an offset into its buffer is kept: the kernels take it)."""
        a = self.realize(self._own(a, where))
        return a if is_contiguous(a.shape, a.strides) else self.contiguous(a)

    def _row_kernel(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype) -> Any:
        """The compiled shared row kernel ``spec`` for ``dtype`` (cached by ``key``; ``spec`` may be a function
        making it, called only when ``key`` is not compiled yet)."""
        return self._kernel(key, lambda: K.row_kernel_source(spec if isinstance(spec, R.RowKernel) else spec(),
                                                             dtype))

    def _row_launch(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype, rows: int,
                    cols: int, args: list[Any]) -> None:
        """Run a row kernel with one work-group per row."""
        kernel = self._row_kernel(spec, key, dtype)
        group = R.row_group(cols, self._group_limit(kernel))
        kernel(self.queue, (rows * group,), (group,), *args)

    def _launch_rows(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype,
                     groups: int, width: int, args: Sequence[Any]) -> None:
        """Run a shared row kernel with ``groups`` work-groups, each sized for ``width`` elements (the lazy
        engine's hook): ``args`` in the kernel's parameter order, an array (realized, row-major) standing for its
        buffer and offset, an ``int`` for a ``long``, a ``float`` for a ``T`` scalar."""
        flat: list[Any] = []
        for a in args:
            if type(a) is int:
                flat.append(a)
            elif type(a) is float:
                flat.append(dtype.type(a))
            else:
                flat += [a.buffer, a.offset]
        self._row_launch(spec, (*key, dtype.str), dtype, groups, width, flat)

    def max_pool_blocks(self, a: Array, kernel: tuple[int, ...]) -> Array:
        """One kernel (the shared ``row_kernels.MAX_POOL_BLOCKS``) for float32/float64 and 1-3 spatial dims;
        the generic window loop otherwise."""
        a = self._own(a, "max_pool_blocks")
        dims = R.pool_blocks_dims(a.shape, kernel, a.dtype)
        if dims is None:
            return super().max_pool_blocks(a, kernel)
        out_shape, geometry = dims
        x = self._row_operand(a, "max_pool_blocks")
        y = self.empty(out_shape, x.dtype)
        n = shape_size(out_shape)
        if n:
            k = self._kernel(("max_pool_blocks", x.dtype.str), lambda: K.row_kernel_source(R.MAX_POOL_BLOCKS, x.dtype))
            self._launch(k, n, [n, *geometry, x.buffer, x.offset, y.buffer])
        return y

    def max_pool_blocks_backward(self, a: Array, best: Array, g: Array, kernel: tuple[int, ...]) -> Array:
        """One kernel (the shared ``row_kernels.MAX_POOL_BLOCKS_BACKWARD``: each block's winner found again,
        the whole block written) where the forward took its kernel; the generic loop otherwise."""
        a, g = self._own(a, "max_pool_blocks_backward"), self._own(g, "max_pool_blocks_backward")
        dims = R.pool_blocks_dims(a.shape, kernel, a.dtype, g.dtype)
        if dims is None:
            return super().max_pool_blocks_backward(a, best, g, kernel)
        _, geometry = dims
        x = self._row_operand(a, "max_pool_blocks_backward")
        gy = self._row_operand(g, "max_pool_blocks_backward")
        gx = self.empty(tuple(x.shape), x.dtype)
        n = shape_size(tuple(gy.shape))
        if n:
            k = self._kernel(("max_pool_blocks_backward", x.dtype.str),
                             lambda: K.row_kernel_source(R.MAX_POOL_BLOCKS_BACKWARD, x.dtype))
            self._launch(k, n, [n, *geometry, x.buffer, x.offset, gy.buffer, gy.offset, gx.buffer])
        return gx

    def _gru_kernel(self, backward: bool, arrays: tuple, biases: tuple) -> tuple | None:
        """``Backend.gru_cell``/``gru_cell_backward`` as one kernel (the shared ``row_kernels.gru_cell_*``) for
        the operands ``row_kernels.gru_layout`` takes; None otherwise (the primitives run)."""
        where = "gru_cell_backward" if backward else "gru_cell"
        arrays = tuple(self._own(a, where) for a in arrays)
        biases = tuple(None if b is None else self._own(b, where) for b in biases)
        layout = R.gru_layout(arrays, biases, backward)
        if layout is None:
            return None
        rows, hidden, result_shapes = layout
        # a pending sum of two gradient contributions is added (and written out) by the backward kernel itself
        reads, g_sum = self._gradient_reads(arrays[0], backward and rows * hidden > 0)
        spec = R.gru_kernel(biases, backward, g_sum is not None)
        operands = (*reads, *arrays[1:])
        ops = [self._row_operand(a, spec.name) for a in (*operands, *(b for b in biases if b is not None))]
        dtype = ops[0].dtype
        outs = tuple([self.empty(s, dtype) for s in result_shapes])
        if rows * hidden:
            k = self._kernel((spec.name, dtype.str), lambda: K.row_kernel_source(spec, dtype))
            args: list[Any] = [rows * hidden, hidden]
            for a in ops:
                args += [a.buffer, a.offset]
            written = outs if g_sum is None else (*outs, g_sum)
            self._launch(k, rows * hidden, args + [o.buffer for o in written])
            if g_sum is not None:
                self._realized_into(arrays[0], g_sum)
        return outs

    def _strip_launch(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype,
                      rows: int, cols: int, sums: int, args: list[Any]) -> CLArray:
        """Run a column-sum kernel (``row_kernels._strip_sums``) over ``(rows, cols)``: the ``(sums, cols)``
        sums, the row chunks' partial sums added by a second launch when there are several."""
        kernel = self._row_kernel(spec, key, dtype)
        width, lanes, parts, chunk = R.param_grad_layout(rows, cols, self._group_limit(kernel, R.STRIP_GROUP))
        strips, total = -(-cols // width), parts * cols
        partial = self.empty((sums, parts, cols), dtype)
        group = width * lanes
        kernel(self.queue, (parts * strips * group,), (group,), rows, cols, chunk, width, strips, total, *args,
               partial.buffer)
        return self.reshape(partial, (sums, cols)) if parts == 1 else self.sum(partial, (1,), False)

    def bias_grad(self, g: Array) -> Array:
        """One column-sum kernel (``row_kernels.column_sum``) for a float32/float64 ``g``, which computes a
        pending ``g`` itself and writes it out (``LazyEngine._row_input``); the generic default otherwise."""
        g = self._own(g, "bias_grad")
        if g.dtype not in (_F32, _F64) or g.ndim != 2 or g.size == 0:
            return super().bias_grad(g)
        rows, cols = g.shape
        dtype = g.dtype
        computed = self._row_input(g, True)
        if computed is None:
            g = self._row_operand(g, "bias_grad")
            sums = self._strip_launch(R.column_sum, ("column_sum", dtype.str), dtype, rows, cols, 1,
                                      [g.buffer, g.offset])
        else:
            flat, g_out = computed
            sums = self._strip_launch(lambda: R.column_sum(self._prologue(g)), ("column_sum", dtype.str, flat[0]),
                                      dtype, rows, cols, 1, [*self._prologue_args(flat), g_out.buffer])
            self._realized_into(g, g_out)
        return self.reshape(sums, (cols,))

    @staticmethod
    def _prologue_args(flat: tuple) -> list[Any]:
        """The kernel arguments of a computed input (``LazyEngine._row_input``'s ``flat``): each leaf's buffer,
        offset and two strides, then the scalars."""
        args: list[Any] = []
        for leaf in flat[1]:
            args += [leaf.buffer, leaf.offset, *leaf.strides]
        return args + _scalar_args(flat[2])

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   residual: Array | None = None) -> tuple:
        """Optional fused composite (see ``Backend.layer_norm``): one kernel, one work-group per row, for
        float32/float64 ``x`` with ``weight``/``bias`` of its dtype; the generic default otherwise. A pending
        ``x`` (a linear layer's bias and activation) is computed by the kernel itself
        (``LazyEngine._row_input``), which writes it out for the backward: no kernel of its own first. A
        ``residual`` is added by the kernel as it writes ``y``."""
        x = self._own(x, "layer_norm")
        if x.dtype not in (_F32, _F64) or x.ndim != 2 or any(
                t is not None and t.dtype != x.dtype for t in (weight, bias)) or (
                residual is not None and (residual.dtype != x.dtype or tuple(residual.shape) != tuple(x.shape))):
            return super().layer_norm(x, weight, bias, eps, residual)
        rows, cols = x.shape
        dtype = x.dtype
        computed = self._row_input(x, rows * cols > 0)
        pending = x
        if computed is None:
            x = self._row_operand(x, "layer_norm")
        w, b = (None if t is None else self._row_operand(t, "layer_norm") for t in (weight, bias))
        res = None if residual is None else self._row_operand(residual, "layer_norm")
        y, mean, rstd = self.empty((rows, cols), dtype), self.empty((rows,), dtype), self.empty((rows,), dtype)
        if rows and cols:
            args: list[Any] = [cols]
            if computed is None:
                args += [x.buffer, x.offset]
            else:
                flat, x_out = computed
                args += self._prologue_args(flat)
            for t in (w, b, res):
                if t is not None:
                    args += [t.buffer, t.offset]
            args += [y.buffer, mean.buffer, rstd.buffer, dtype.type(eps)]
            has = (w is not None, b is not None)

            def spec() -> R.RowKernel:
                return R.layer_norm_forward(*has, None if computed is None else self._prologue(pending),
                                            res is not None)

            if computed is None:
                self._row_launch(spec, ("layer_norm", dtype.str, *has, res is not None), dtype, rows, cols, args)
            else:
                self._row_launch(spec, ("layer_norm", dtype.str, *has, res is not None, flat[0]), dtype, rows,
                                 cols, args + [x_out.buffer])
                self._realized_into(pending, x_out)
        return y, mean, rstd

    def layer_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """Optional fused composite (see ``Backend.layer_norm_backward``): ``gx`` in one kernel (one work-group
        per row), ``gw``/``gb`` in one kernel of column sums (plus one sum of row chunks for many rows)."""
        x, g = self._own(x, "layer_norm_backward"), self._own(g, "layer_norm_backward")
        if x.dtype not in (_F32, _F64) or x.ndim != 2 or g.dtype != x.dtype or mean.dtype != x.dtype or (
                weight is not None and weight.dtype != x.dtype):
            return super().layer_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        rows, cols = x.shape
        dtype = x.dtype
        # a pending sum of two gradient contributions is added (and written out) by the gx kernel itself
        reads, g_sum = self._gradient_reads(g, need_x and rows * cols > 0)
        gs = [self._row_operand(a, "layer_norm_backward") for a in reads]
        x = self._row_operand(x, "layer_norm_backward")
        mean, rstd = self._row_operand(mean, "layer_norm_backward"), self._row_operand(rstd, "layer_norm_backward")
        gx = gw = gb = None
        if need_x:
            gx = self.empty((rows, cols), dtype)
            if rows and cols:
                w = None if weight is None else self._row_operand(weight, "layer_norm_backward")
                args: list[Any] = [cols]
                for a in gs:
                    args += [a.buffer, a.offset]
                args += [x.buffer, x.offset, mean.buffer, rstd.buffer]
                args += [] if w is None else [w.buffer, w.offset]
                paired = g_sum is not None
                self._row_launch(lambda: R.layer_norm_backward(w is not None, paired),
                                 ("layer_norm_backward", dtype.str, w is not None, paired), dtype, rows, cols,
                                 args + [o.buffer for o in ((gx, g_sum) if paired else (gx,))])
        if g_sum is not None:
            self._realized_into(g, g_sum)
        g = gs[0] if g_sum is None else g
        if need_w or need_b:
            if rows == 0:
                sums = self.full((2, cols), 0, dtype)
            else:
                sums = self._strip_launch(R.LAYER_NORM_PARAM_GRADS, ("layer_norm_param_grads", dtype.str), dtype,
                                          rows, cols, 2, [g.buffer, g.offset, x.buffer, x.offset, mean.buffer,
                                                          rstd.buffer])
            if need_w:
                gw = self.reshape(self.slice(sums, (slice(0, 1),)), (cols,))
            if need_b:
                gb = self.reshape(self.slice(sums, (slice(1, 2),)), (cols,))
        return gx, gw, gb

    # ----------------------------------------------------------------- linear algebra
    def matmul(self, a: Array, b: Array) -> Array:
        a = self.realize(self._own(a, "matmul"))
        b = self.realize(self._own(b, "matmul"))
        if a.dtype != b.dtype:
            raise BackendError(f"matmul: operands have dtypes {a.dtype} and {b.dtype}; cast one first")
        if len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]:  # the common case, directly
            (m, k), n = a.shape, b.shape[1]
            out = self.empty((m, n), a.dtype)
            if m and n:
                self._gemm(a, b, out, (), (m, k, n), False)
            return out
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError("matmul: operands must have at least one axis (use mul for scalars)")
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        if squeeze_a:
            a = self._view(a, (1, a.shape[0]), (0, a.strides[0]), a.offset)
        if squeeze_b:
            b = self._view(b, (b.shape[0], 1), (b.strides[0], 0), b.offset)
        m, k, n, batch = matmul_dims(a.shape, b.shape)
        if batch:
            a = self._expand_view(a, batch + (m, k), "matmul")
            b = self._expand_view(b, batch + (k, n), "matmul")
        out = self.empty(batch + (m, n), a.dtype)
        if out.size:
            self._gemm(a, b, out, batch, (m, k, n), False)
        if squeeze_a or squeeze_b:
            shape = out.shape[:-2] + (() if squeeze_a else (m,)) + (() if squeeze_b else (n,))
            out = self._view(out, shape, contiguous_strides(shape), 0)
        return out

    def _gemm(self, a: CLArray, b: CLArray, out: CLArray, batch: Shape, mkn: tuple[int, int, int],
              accumulate: bool) -> None:
        """``out = a @ b`` (``out += a @ b`` with ``accumulate``) for realized operands broadcast to ``batch``
        and a row-major ``out`` of ``batch + (m, n)`` elements."""
        m, k, n = mkn
        if not batch:  # a 2-d product (a linear layer's): the kernel and work sizes kept per dtype
            found = self._gemm_2d.get((a.dtype, accumulate))
            if found is None:
                found = self._gemm_2d[(a.dtype, accumulate)] = self._gemm_kernel(a.dtype, 0, accumulate)
            kernel, threads, tile = found
            (sa0, sa1), (sb0, sb1) = a.strides, b.strides
            kernel(self.queue, (-(-n // tile) * threads, -(-m // tile) * threads, 1), (threads, threads, 1), m, n,
                   k, out.buffer, out.offset, a.buffer, a.offset, sa0, sa1, b.buffer, b.offset, sb0, sb1)
            return
        nb = len(batch)
        dims, strides = K.collapse(batch, [out.strides[:nb], a.strides[:nb], b.strides[:nb]])
        kernel, threads, tile = self._gemm_kernel(a.dtype, len(dims), accumulate)
        args = [m, n, k, *dims, out.buffer, out.offset, *strides[0], a.buffer, a.offset, *strides[1],
                a.strides[-2], a.strides[-1], b.buffer, b.offset, *strides[2], b.strides[-2], b.strides[-1]]
        gsize = (-(-n // tile) * threads, -(-m // tile) * threads, shape_size(dims))
        kernel(self.queue, gsize, (threads, threads, 1), *args)

    def _gemm_kernel(self, dtype: np.dtype, rank: int, accumulate: bool) -> tuple[Any, int, int]:
        """``(kernel, threads, tile)`` of the GEMM kernel for ``dtype`` over ``rank`` collapsed batch dims."""
        acc = _INT64 if dtype.kind in "biu" else self._accumulator(dtype)
        threads, work = self._matmul_threads, self._matmul_work
        kernel = self._kernel(("matmul", dtype.str, rank, threads, work, accumulate),
                              lambda: K.matmul_source(rank, dtype, acc, threads, work, accumulate))
        return kernel, threads, threads * work

    accumulates_in_place = True

    def matmul_accumulate(self, dst: Array, a: Array, b: Array) -> Array:
        """``Backend.matmul_accumulate``: the GEMM kernel adding into ``dst`` (its pending sum, if any, run
        first) when ``dst`` is a row-major float array of the product's size and ``a``, ``b`` are 2-d of its
        dtype; the generic ``add_into(dst, matmul(a, b))`` otherwise."""
        if self._gemm_accumulate(dst, a, b):
            return dst
        return super().matmul_accumulate(dst, a, b)

    def bias_grad_accumulate(self, dst: Array, g: Array) -> Array:
        """``Backend.bias_grad_accumulate``: ``dst += ones(1, rows) @ g`` in the GEMM kernel (the ones a
        zero-stride view of one scalar kept per dtype); the generic default where ``_gemm_accumulate`` does not
        take it."""
        g = self._own(g, "bias_grad_accumulate")
        if g.ndim == 2 and g.dtype.kind == "f":
            one = self._ones.get(g.dtype)
            if one is None:  # made once per dtype: a fill kernel per call was a launch per bias a step
                one = self._ones[g.dtype] = self.realize(self.full((), 1, g.dtype))
            ones = self._view(one, (1, g.shape[0]), (0, 0), one.offset)
            if self._gemm_accumulate(dst, ones, g):
                return dst
        return super().bias_grad_accumulate(dst, g)

    def _gemm_accumulate(self, dst: Array, a: Array, b: Array) -> bool:
        """``dst += a @ b`` by the GEMM kernel where ``a``, ``b`` are 2-d float arrays of ``dst``'s dtype and
        ``dst`` is row-major with the product's size (realized first); False (nothing done) otherwise."""
        own = self._own
        a, b, dst = own(a, "matmul_accumulate"), own(b, "matmul_accumulate"), own(dst, "matmul_accumulate")
        dims = accumulate_dims(dst, a, b) if a.dtype.kind == "f" else None
        if dims is None:
            return False
        self.realize(dst)
        if not is_contiguous(dst.shape, dst.strides):
            return False
        a, b = self.realize(a), self.realize(b)
        self._flush_readers(self._storage_id(dst))  # pending expressions reading the old sum run first
        m, k, n = dims
        out = dst if dst.shape == (m, n) else self._view(dst, (m, n), contiguous_strides((m, n)), dst.offset)
        self._gemm(a, b, out, (), (m, k, n), True)
        return True

    # ----------------------------------------------------------------- convolutions (implicit GEMM)
    def native_conv(self, dtype: np.dtype, nd: int) -> bool:
        """True for float32, float64 (with ``cl_khr_fp64``) and float16 (with ``cl_khr_fp16``) in 1-3 spatial
        dims: ``conv_forward``, ``conv_input_grad`` and ``conv_weight_grad`` run as implicit-GEMM kernels
        (``flowgraph/backends/opencl/conv.py``), with no im2col buffer."""
        dtype = np.dtype(dtype)
        supported = dtype == _F32 or (dtype == _F64 and self.supports_float64) or (
            dtype == _F16 and self.supports_float16)
        return supported and 1 <= nd <= 3

    def conv_forward(self, x: Array, w: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int) -> Array:
        """``Backend.conv_forward`` as one implicit-GEMM kernel (``conv.py``'s ``forward``)."""
        x, w, geo, (m, n, k) = self._forward_problem("conv_forward", x, w, stride, padding, dilation, groups)
        w, inner = self._forward_weight(geo, w)
        return self._conv_split_launch("forward", geo, (geo.batch, geo.c_out) + geo.out, (x, w), m, n, k,
                                       channels_inner=inner)

    def conv_forward_bias(self, x: Array, w: Array, b: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                          dilation: tuple[int, ...], groups: int) -> Array:
        """``Backend.conv_forward_bias`` with the bias added by the forward kernel as it stores each result (no
        pass over the output for the add, nor a pending add for the next kernel to read); the generic default
        where the forward is split over its reduction (the partial sums are added afterwards), has no
        reduction or no output, or ``b`` is not a ``(C_out,)`` array of ``x``'s dtype."""
        x, w, geo, (m, n, k) = self._forward_problem("conv_forward_bias", x, w, stride, padding, dilation, groups)
        b = self.contiguous(self._own(b, "conv_forward_bias"))
        if (b.dtype != x.dtype or tuple(b.shape) != (geo.c_out,) or k == 0 or m * n == 0
                or self._conv_splits("forward", m, n, k, groups, x.dtype)[0] > 1):
            return super().conv_forward_bias(x, w, b, stride, padding, dilation, groups)
        out = self.empty((geo.batch, geo.c_out) + geo.out, x.dtype)
        w, inner = self._forward_weight(geo, w)
        self._conv_launch("forward", geo, out, (x, w), m, n, k, bias=b, channels_inner=inner)
        return out

    def _forward_problem(self, where: str, x: Array, w: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                         dilation: tuple[int, ...], groups: int) -> tuple:
        """``(x, w, geometry, (m, n, k))`` of a forward convolution: the operands checked and row-major, and its
        per-group GEMM (``C_out/g`` rows, ``N * prod(out)`` columns, ``C_in/g * prod(K)`` reduction)."""
        x, w = self._conv_operands(where, x, w)
        geo = CK.ConvGeometry.of(where, tuple(x.shape), tuple(w.shape), stride, padding, dilation, groups)
        return x, w, geo, (geo.c_out_g, geo.batch * geo.out_size, geo.c_in_g * geo.kernel_size)

    def _forward_weight(self, geo: CK.ConvGeometry, w: CLArray) -> tuple[CLArray, bool]:
        """The forward's weight operand and whether its reduction runs channels innermost
        (``conv_source(channels_inner=True)``): where every group has a multiple of 16 input channels (each K
        step of up to 16 rows is then one kernel offset) and the kernel more than one offset, the weight copied
        to ``(C_out, *K, C_in / groups)`` (one small copy; every element of the input is then read with no
        table and one bounds test per step); else the weight as it is, channels outermost."""
        if geo.c_in_g % CK.STEP_MULTIPLE or geo.kernel_size == 1:
            return w, False
        return self.contiguous(self.permute(w, (0, *range(2, geo.nd + 2), 1))), True

    def _input_grad_weight(self, geo: CK.ConvGeometry, w: CLArray) -> tuple[CLArray, bool]:
        """The input gradient's weight operand and whether its reduction runs channels innermost, as the
        forward's (``_forward_weight``) over the output channels: where every group has a multiple of 16 output
        channels and the kernel more than one offset, the weight copied to ``(groups, C_in / groups, *K,
        C_out / groups)`` (each K step of a stride phase is then one kernel offset of up to 16 consecutive
        output channels); else the weight as it is."""
        if geo.c_out_g % CK.STEP_MULTIPLE or geo.kernel_size == 1:
            return w, False
        grouped = self.reshape(w, (geo.groups, geo.c_out_g, geo.c_in_g, geo.kernel_size))
        return self.contiguous(self.permute(grouped, (0, 2, 3, 1))), True

    def conv_input_grad(self, g: Array, w: Array, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """``Backend.conv_input_grad`` as the gather-form kernel ``dgrad``, one launch per stride phase."""
        g, w = self._conv_operands("conv_input_grad", g, w)
        geo = CK.ConvGeometry.of("conv_input_grad", tuple(x_shape), tuple(w.shape), stride, padding, dilation, groups)
        geo.check_output("conv_input_grad", "g", tuple(g.shape))
        if geo.groups == 1 and geo.out_size == 1 and geo.spatial == geo.kernel and not any(geo.padding):
            # One window covering the whole input (a transposed convolution of a 1x1 map, DCGAN's first layer):
            # each input position meets exactly one kernel offset, so the gather form would multiply
            # prod(K) - 1 zeros per term; it is the plain product g (N, C_out) @ w (C_out, C_in * K).
            gx = self.matmul(self.reshape(g, (geo.batch, geo.c_out)), self.reshape(w, (geo.c_out, -1)))
            return self.reshape(gx, tuple(x_shape))
        out = self.empty(tuple(x_shape), g.dtype)
        w, inner = self._input_grad_weight(geo, w)
        # one launch per stride phase (one at stride 1): each input position is written by exactly one of them
        for phase in CK.phase_args(geo):
            self._conv_launch("dgrad", geo, out, (g, w), geo.c_in_g, geo.batch * phase[0], geo.c_out_g * phase[1],
                              extra=phase, channels_inner=inner)
        return out

    def conv_weight_grad(self, x: Array, g: Array, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """``Backend.conv_weight_grad`` as the kernel ``wgrad``, split over the reduction (then summed) where
        the weight alone would not fill the device."""
        x, g = self._conv_operands("conv_weight_grad", x, g)
        geo = CK.ConvGeometry.of("conv_weight_grad", tuple(x.shape), tuple(w_shape), stride, padding, dilation, groups)
        geo.check_output("conv_weight_grad", "g", tuple(g.shape))
        m, n, k = geo.c_out_g, geo.c_in_g * geo.kernel_size, geo.batch * geo.out_size
        # every K step one run of consecutive output positions (conv_source(row_runs=True)) where the output's
        # last size is a multiple of the deepest tile's step (part of a row), or divides it and the last two
        # sizes' product is one (whole rows, within one plane)
        last, step = geo.out[-1], CK.STEP_MULTIPLE
        runs = last % step == 0 or (geo.nd > 1 and step % last == 0 and last * geo.out[-2] % step == 0)
        return self._conv_split_launch("wgrad", geo, tuple(w_shape), (x, g), m, n, k, row_runs=runs)

    def _conv_split_launch(self, op: str, geo: CK.ConvGeometry, shape: tuple[int, ...],
                           inputs: tuple[CLArray, CLArray], m: int, n: int, k: int,
                           channels_inner: bool = False, row_runs: bool = False) -> CLArray:
        """``op``'s result of ``shape``, split-K where its tiles alone would leave the device idle: each split
        sums its slice of the reduction into its own partial result, then one reduction adds them."""
        dtype = inputs[0].dtype
        splits, chunk = self._conv_splits(op, m, n, k, geo.groups, dtype)
        if splits == 1:
            out = self.empty(shape, dtype)
            self._conv_launch(op, geo, out, inputs, m, n, k, channels_inner=channels_inner, row_runs=row_runs)
            return out
        partial = self.empty((splits,) + shape, dtype)
        self._conv_launch(op, geo, partial, inputs, m, n, k, splits, chunk, channels_inner=channels_inner,
                          row_runs=row_runs)
        return self.sum(partial, (0,), False)

    def _conv_operands(self, where: str, a: Array, b: Array) -> tuple[CLArray, CLArray]:
        """Both operands realized and row-major (an offset into a buffer is fine), of one native-conv dtype."""
        a = self.contiguous(self._own(a, where))
        b = self.contiguous(self._own(b, where))
        if a.dtype != b.dtype:
            raise BackendError(f"{where}: operands have dtypes {a.dtype} and {b.dtype}; cast one first")
        if not self.native_conv(a.dtype, a.ndim - 2):
            raise BackendError(
                f"{where}: no native convolution for {a.dtype} in {a.ndim - 2} spatial dims on {self.device}; "
                "native_conv(dtype, nd) says which (float32/float64/float16 where the device has them, nd 1-3)")
        return a, b

    def _conv_tiles(self, op: str, nd: int, dtype: np.dtype, index_dtype: np.dtype, m: int, n: int,
                    groups: int, bias: bool = False, channels_inner: bool = False, row_runs: bool = False) -> tuple:
        """``(kernel, tiles)`` for ``op``: tiles chosen from the device (GPU or CPU table, compute units, max
        work-group size, local memory) and the problem's size (``m x n`` per group), shrunk once more if the
        built kernel's own work-group limit (registers) is lower than the device's."""
        acc = self._accumulator(dtype)
        is_gpu = self._conv_gpu_tiles
        row_class, tensor_cores = self._tile_class(op, dtype, m, n, groups)
        key = (op, nd, dtype, index_dtype, row_class, tensor_cores, bias, channels_inner, row_runs, is_gpu)
        cached = self.__dict__.setdefault("_conv_choice", {})
        found = cached.get(key)
        if found is not None:
            return found
        max_group = self._max_group
        while True:
            tiles = self._table_tiles(op, dtype, row_class, tensor_cores, max_group)
            tf32 = tensor_cores and CK.mma_warps(tiles) is not None
            kernel = self._kernel(
                ("conv", op, nd, dtype.str, acc.str, index_dtype.str, tuple(tiles), tf32, bias, channels_inner,
                 row_runs),
                lambda tiles=tiles, tf32=tf32: CK.conv_source(op, nd, dtype, acc, index_dtype, tiles, tf32, bias,
                                                              channels_inner, row_runs))
            limit = int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device))
            if tiles.group <= limit or max_group <= 16:
                break
            max_group = _floor_pow2(limit)
        found = cached[key] = (kernel, tiles)
        return found

    def _tile_class(self, op: str, dtype: np.dtype, m: int, n: int, groups: int) -> tuple[str, bool]:
        """``(row class, tensor cores)`` of ``op``'s ``m x n`` problem per group (``conv.tile_class``; the TF32
        kernels' huge class is their own tiles')."""
        tensor_cores = dtype == _F32 and self._tf32_tensor_cores and flags.cudnn.allow_tf32
        huge = CK.GPU_TF32_TILES.get(op, {}).get("huge") if tensor_cores and self._conv_gpu_tiles else None
        return CK.tile_class(self._conv_gpu_tiles, m, n, groups, self._compute_units, huge), tensor_cores

    def _table_tiles(self, op: str, dtype: np.dtype, row_class: str, tensor_cores: bool,
                     max_group: int) -> CK.ConvTiles:
        """The tiles of ``row_class`` from the device kind's table (the TF32 one for ``op`` with tensor cores)
        that fit ``max_group`` work-items and the device's local memory (``conv.choose_tiles``)."""
        return CK.choose_tiles(self._conv_gpu_tiles, max_group, int(self.cl_device.local_mem_size),
                               self._accumulator(dtype).itemsize, row_class, op if tensor_cores else None)

    @functools.cached_property
    def _compute_units(self) -> int:
        """``CL_DEVICE_MAX_COMPUTE_UNITS`` (asked once: a device query is a driver call)."""
        return int(self.cl_device.max_compute_units)

    @functools.cached_property
    def _tf32_tensor_cores(self) -> bool:
        """Whether float32 convolutions may run on TF32 tensor cores here (under ``fg.backends.cudnn.allow_tf32``,
        PyTorch's switch for its cuDNN convolutions): an NVIDIA device of compute capability 8.0 or later, whose
        OpenCL compiler takes the ``mma.sync`` PTX of ``conv.conv_source(tf32=True)`` (asked once)."""
        device = self.cl_device
        if "NVIDIA" not in device.vendor.upper():
            return False
        try:
            return int(device.compute_capability_major_nv) >= 8
        except (cl.Error, AttributeError):  # a driver without cl_nv_device_attribute_query
            return False

    @functools.cached_property
    def _conv_gpu_tiles(self) -> bool:
        """Whether convolutions use the GPU tile table (a GPU device) or the CPU one (asked once)."""
        return bool(self.cl_device.type & cl.device_type.GPU)

    def _conv_splits(self, op: str, m: int, n: int, k: int, groups: int, dtype: np.dtype) -> tuple[int, int]:
        """Split-K for the forward and the weight gradient: ``(splits, chunk)``.

        On a GPU, the count that minimises a cost model of the launch, in K-step waves: ``waves(s) *
        steps(s)`` (work-groups ``blocks * s`` over the device's resident slots, each wave as long as one
        split's steps) plus ``CONV_SPLIT_SUM_COST`` per element of the partial results (written, then summed).
        Fitted to the H200's convnet weight gradients (``docs/opencl.md``, "Convolutions"), where the count
        that left a second, nearly empty wave ran up to 1.5x slower than one that filled the first (64 -> 128
        channels at 32x32: 30 splits, 270 work-groups on 264 slots, 0.63 ms; 24 splits, 0.48 ms). On a CPU,
        a few work-groups per compute unit where the output tiles alone would leave it idle."""
        key = (op, m, n, k, groups, dtype, flags.cudnn.allow_tf32, self._conv_gpu_tiles, self._compute_units)
        cached = self.__dict__.setdefault("_split_choice", {})
        found = cached.get(key)
        if found is None:
            found = cached[key] = self._choose_splits(op, m, n, k, groups, dtype)
        return found

    def _choose_splits(self, op: str, m: int, n: int, k: int, groups: int, dtype: np.dtype) -> tuple[int, int]:
        """``_conv_splits`` worked out (it remembers the answer per problem: the GPU search tries every count)."""
        is_gpu = self._conv_gpu_tiles
        tiles = self._table_tiles(op, dtype, *self._tile_class(op, dtype, m, n, groups), self._max_group)
        blocks = -(-m // tiles.tile_m) * -(-n // tiles.tile_n) * groups
        most = min(k // (4 * tiles.depth), self.MAX_CONV_SPLITS)
        if is_gpu:
            # resident work-groups: a compute unit's registers hold about 512 work-items of these kernels
            slots = self._compute_units * max(1, self.CONV_RESIDENT_ITEMS // tiles.group)

            def cost(s: int) -> float:
                steps = -(-k // (s * tiles.depth))
                return -(-blocks * s // slots) * steps + (s > 1) * s * m * n * groups * self.CONV_SPLIT_SUM_COST

            splits = min(range(1, max(most, 1) + 1), key=cost)
        else:
            target = self._compute_units * 2
            if blocks >= target or k <= 8 * tiles.depth:
                return 1, k
            splits = min(-(-target // blocks), most)
        if splits <= 1:
            return 1, k
        per_split = -(-k // splits)
        chunk = -(-per_split // tiles.depth) * tiles.depth  # a whole number of K steps
        return -(-k // chunk), chunk

    #: Work-items of the register-blocked convolution kernels one GPU compute unit holds at once (about 128
    #: registers each in a 64K-register file): 2 work-groups of 256, measured on the H200 as the split count
    #: where a second wave of work-groups begins.
    CONV_RESIDENT_ITEMS = 512
    #: The GPU split-K cost of one partial-result element, in K-step waves (its write and its read by the sum;
    #: fitted on the H200: 0.25 ms for 4 splits of the 512 x 4608 weight gradient, 0.26 ms for 6).
    CONV_SPLIT_SUM_COST = 6e-6

    #: Most slices a split reduction is split into (each one a partial result in memory). A thin layer's weight
    #: gradient (convnet's first: a 64 x 27 result over 524,288 positions) is one tile: with 64 slices it ran
    #: 64 work-groups on an H200's 132 compute units (0.49 ms).
    MAX_CONV_SPLITS = 512
    #: Convolutions whose GEMM sizes and buffers (each with its element offset) all stay within this many elements
    #: index in int32, offsets included (faster division and address arithmetic on GPUs); larger ones run the
    #: int64 variant of the kernels.
    CONV_INT32_LIMIT = 2**31 - 1

    def _conv_launch(self, op: str, geo: CK.ConvGeometry, out: CLArray, inputs: tuple[CLArray, CLArray], m: int,
                     n: int, k: int, splits: int = 1, chunk: int | None = None, extra: Sequence[int] = (),
                     bias: CLArray | None = None, channels_inner: bool = False, row_runs: bool = False) -> None:
        """Run implicit-GEMM ``op`` of ``geo`` (an ``m x n`` result per group, reducing over ``k``, the kernel's
        ``extra`` arguments after the geometry) into ``out``; ``k == 0`` writes zeros. ``bias``: the forward's
        per-channel bias, added as each result is stored; ``channels_inner``: see ``_forward_weight`` and
        ``_input_grad_weight``; ``row_runs``: see ``conv_weight_grad``."""
        if out.size == 0 or m * n == 0:
            return
        if k == 0 and op != "dgrad":  # the input gradient's phases write their zeros themselves
            self._write(out, Scalar(0, out.dtype))
            return
        operands = inputs + ((bias,) if bias is not None else ())
        largest = max(out.offset + out.size, *(a.offset + a.size for a in operands), m * n, n * k, m * k)
        index_dtype = _I32 if largest <= self.CONV_INT32_LIMIT else _INT64
        kernel, tiles = self._conv_tiles(op, geo.nd, out.dtype, index_dtype, m, n, geo.groups, bias is not None,
                                         channels_inner, row_runs)
        sizes = (m, n, k, chunk or k, geo, index_dtype, *extra)
        ints = self._conv_sizes.get(sizes)
        if ints is None:  # the sizes as the kernel's integers, once per layer and pass
            it = index_dtype.type
            ints = [it(v) for v in (m, n, k, chunk or k, geo.groups, geo.c_in, geo.c_out, geo.c_in_g, geo.c_out_g,
                                    geo.out_size, geo.in_size, geo.kernel_size, *geo.spatial, *geo.out,
                                    *geo.kernel, *geo.stride, *geo.padding, *geo.dilation, *extra)]
            if len(self._conv_sizes) >= 1024:
                self._conv_sizes.clear()
            self._conv_sizes[sizes] = ints
        args: list[Any] = [*ints, out.buffer, out.offset, out.size // splits]
        for a in operands:
            args += [a.buffer, a.offset]
        gsize = (-(-n // tiles.tile_n) * tiles.tx, -(-m // tiles.tile_m) * tiles.ty, geo.groups * splits)
        kernel(self.queue, gsize, (tiles.tx, tiles.ty, 1), *args)

    # ----------------------------------------------------------------- indexing
    def _index_operand(self, index: Array, where: str) -> CLArray:
        index = self._own(index, where)
        if index.dtype.kind not in "iu":
            raise BackendError(f"{where}: index must be an integer array, got {index.dtype}")
        return self.realize(self.cast(index, _INT64))

    def argsort(self, a: Array, axis: int, descending: bool) -> Array:
        a = self._own(a, "argsort")
        axis = axis % max(a.ndim, 1)
        if a.ndim == 0 or a.size == 0:
            return self.full(a.shape, 0, _I64)
        last = a.ndim - 1
        order = [d for d in range(a.ndim) if d != axis] + [axis]
        moved = self.contiguous(self.permute(a, order) if axis != last else a)
        dtype = moved.dtype if moved.dtype != _BOOL else np.dtype(np.uint8)
        n = moved.shape[-1]
        out = self.empty(moved.shape, _I64)
        kernel = self._kernel(("argsort", dtype.str, bool(descending)), lambda: K.argsort_source(dtype, descending))
        self._launch(kernel, moved.size, [moved.buffer if moved.offset == 0 else self.contiguous(moved).buffer,
                                         out.buffer, n, moved.size])
        if axis == last:
            return out
        inverse = [0] * a.ndim
        for pos, d in enumerate(order):
            inverse[d] = pos
        return self.contiguous(self.permute(out, inverse))

    def gather(self, a: Array, axis: int, index: Array) -> Array:
        a = self.realize(self._own(a, "gather"))
        index = self._index_operand(index, "gather")
        if index.ndim != a.ndim or not 0 <= axis < a.ndim:
            raise ShapeError(f"gather: index shape {index.shape} and axis {axis} do not fit array shape {a.shape}")
        out = self.empty(index.shape, a.dtype)
        if out.size == 0:
            return out
        if a.shape[axis] == 0:
            raise ShapeError(f"gather: axis {axis} of shape {a.shape} is empty; nothing to index")
        a_strides = tuple(
            0 if d == axis or (n == 1 and index.shape[d] != 1) else s
            for d, (n, s) in enumerate(zip(a.shape, a.strides))
        )
        dims, strides = K.collapse(index.shape, [out.strides, index.strides, a_strides])
        kernel = self._kernel(("gather", a.dtype.str, len(dims)), lambda: K.gather_source(len(dims), a.dtype))
        n = out.size
        args = [
            n,
            *dims,
            out.buffer,
            0,
            *strides[0],
            index.buffer,
            index.offset,
            *strides[1],
            a.buffer,
            a.offset,
            *strides[2],
            a.strides[axis],
            a.shape[axis],
        ]
        self._launch(kernel, n, args)
        return out

    def _scatter(self, a: Array, axis: int, index: Array, src: Array, accumulate: bool) -> CLArray:
        where = "scatter_add" if accumulate else "scatter"
        a = self._own(a, where)
        index = self._index_operand(index, where)
        if index.ndim != a.ndim or not 0 <= axis < a.ndim:
            raise ShapeError(f"{where}: index shape {index.shape} and axis {axis} do not fit array shape {a.shape}")
        out = self.empty(a.shape, a.dtype)
        self._write(out, a)
        if index.size == 0:
            return out
        if isinstance(src, CLArray):
            src = self._broadcast_leaf(self.realize(self._own(src, where)), index.shape, where)
            src = self.realize(self.cast(src, a.dtype))
        else:
            src = self.realize(self.full(index.shape, src, a.dtype))
        out_strides = tuple(0 if d == axis else s for d, s in enumerate(out.strides))
        dims, strides = self._line_layout(index.shape, axis, [out_strides, index.strides, src.strides])
        kernel = self._kernel((where, a.dtype.str, len(dims)), lambda: K.scatter_source(len(dims), a.dtype, accumulate))
        n_lines = shape_size(dims)
        args = [
            n_lines,
            *dims,
            out.buffer,
            0,
            *strides[0],
            index.buffer,
            index.offset,
            *strides[1],
            src.buffer,
            src.offset,
            *strides[2],
            index.shape[axis],
            out.strides[axis],
            a.shape[axis],
            index.strides[axis],
            src.strides[axis],
        ]
        self._launch(kernel, n_lines, args)
        return out

    # ----------------------------------------------------------------- runtime
    def synchronize(self) -> None:
        """Wait for every queued kernel and copy.

        Lazy arrays nobody has asked for stay lazy: they are expressions, not queued work, and computing
        them later gives the same values (``assign`` realizes the ones a write would change).
        """
        self.queue.finish()

    def memory_stats(self) -> dict[str, int]:
        return {
            "allocated": int(self._pool.active_bytes),
            "reserved": int(self._pool.managed_bytes),
            "peak": int(self._peak),
            "total": int(self.cl_device.global_mem_size),
        }

    def reset_peak_memory_stats(self) -> None:
        """Start the peak (``memory_stats()['peak']``) again from the bytes allocated now."""
        self._peak = int(self._pool.active_bytes)

    def __repr__(self) -> str:
        return f"<OpenCLBackend {self.device} ({self.device_name})>"


def _bind_elementwise() -> None:
    """One method per name in UNARY_OPS / BINARY_OPS, each building a lazy node."""

    def unary(name: str):
        def op(self: OpenCLBackend, a: Array) -> Array:
            return self._unary(name, a)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a)`` (lazy; fused with its neighbours)."
        return op

    def binary(name: str):
        def op(self: OpenCLBackend, a: Array, b: Array) -> Array:
            return self._binary(name, a, b)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a, b)`` with broadcasting (lazy; fused with its neighbours)."
        return op

    for name in UNARY_OPS:
        setattr(OpenCLBackend, name, unary(name))
    for name in BINARY_OPS:
        setattr(OpenCLBackend, name, binary(name))


_bind_elementwise()
