"""``CupyBackend``: the array backend on CuPy, with fused elementwise kernels, own cuBLAS and device RNG.

It subclasses :class:`~flowgraph.backends.array_backend.ArrayBackend` with ``xp = cupy`` and overrides
only what CuPy does differently or better:

* **Fusion** through the lazy engine shared with OpenCL (:mod:`flowgraph.backends.lazy`): elementwise
  primitives, ``where`` and ``cast`` return a :class:`LazyArray` holding an expression, and the engine
  decides when it runs and what must run before a buffer is overwritten. This module supplies only the
  storage (CuPy views) and the kernels: a chain runs as one generated ``cupy.ElementwiseKernel``, cached by
  structure, never by sizes or scalar values. With fusion off every primitive is CuPy's own ufunc.
* **matmul** through flowgraph's own cuBLAS handle (``blas.Cublas``), which also works inside CUDA
  graph capture, where CuPy refuses cuBLAS.
* **Random** numbers from a Philox4x32-10 kernel whose key and counter live on the device.
* ``to_host`` (``cupy.asnumpy``), ``from_host``, DLPack, ``erf`` (``cupyx.scipy.special``), the
  scatter-add (``cupyx.scatter_add``), memory statistics from the memory pool, ``synchronize``.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import cupy
import numpy as np

from ...errors import BackendError, FlowError, ShapeError
from .. import flags, fusion
from .. import row_kernels as R
from ..array_backend import ArrayBackend
from ..base import BINARY_OPS, UNARY_OPS, Array, Shape
from ..fusion import (
    BAKE_DIMS_MIN,
    MIN_REDUCTION_BLOCKS,
    Expr,
    Scalar,
    UpdateKernel,
    accumulate_dims,
    adam_update_scalars,
    collapse,
    index_fits_int,
    is_host_scalar,
    linearize,
    matmul_dims,
    reduction_layout,
    split_reduction,
)
from ..lazy import SCALAR_TYPES, LazyArrayBase, LazyEngine, flatten
from . import cudnn as cudnn_lib
from . import kernels as K
from .blas import GEMM_TYPES, Cublas
from .launch import ARRAY, LAZY, PackedLaunch, picker, pointer_of

#: Sums of pending float32/float64 expressions run on this backend's own reduction kernel
#: (``kernels.rsum_source``); False (environment ``FLOWGRAPH_CUDA_OWN_REDUCTIONS=0``) sends them through
#: ``cupy.ReductionKernel`` (for comparison and debugging).
OWN_REDUCTIONS = os.environ.get("FLOWGRAPH_CUDA_OWN_REDUCTIONS", "1") != "0"

_BOOL = np.dtype(bool)
_I64 = np.dtype(np.int64)
# C-level field reads for the launch paths' per-operand lists (a comprehension is a Python step per item)
_value = operator.attrgetter("value")
_strides = operator.attrgetter("strides")
_get_device = cupy.cuda.runtime.getDevice
_deref = weakref.ref.__call__
_is = operator.is_
_NDARRAYS = itertools.repeat(cupy.ndarray)
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_c_contiguous = operator.attrgetter("flags.c_contiguous")
_ZEROS = itertools.repeat(np.int64(0))
#: Launch plans (``_ew_plan``, ``_sum_plan``) a backend keeps before it starts again.
PLAN_MEMO = 8192

# Peak of the memory pool's used bytes per device index, tracked by the allocator below.
_PEAK: dict[int, int] = {}
_ALLOCATOR_INSTALLED = [False]


def _install_peak_allocator() -> None:
    """Route CuPy's allocations through the default pool plus a peak tracker (once per process)."""
    if _ALLOCATOR_INSTALLED[0]:
        return
    pool = cupy.get_default_memory_pool()
    malloc = pool.malloc
    used = pool.used_bytes
    one_device = _device_count() == 1  # then the device is 0: no driver query per allocation

    def tracked_malloc(size: int) -> Any:
        mem = malloc(size)
        now = used()
        dev = 0 if one_device else _get_device()
        if now > _PEAK.get(dev, 0):
            _PEAK[dev] = now
        return mem

    cupy.cuda.set_allocator(tracked_malloc)
    _ALLOCATOR_INSTALLED[0] = True


class _AdamSet(NamedTuple):
    """A parameter set ``CupyBackend.adam_step_multi`` has checked once (see ``_adam_checked``)."""

    refs: tuple | None  #: weak references to the parameter and state arrays (None: checked at every step)
    dtype: Any  #: their one dtype
    storages: tuple  #: their allocations' ids, for the hazard flush
    triples: tuple  #: ``(p, m, v)`` per parameter
    layout: tuple  #: ``(pointer, size)`` of each non-empty array: part of the table's cache key
    template: np.ndarray  #: the kernel's table with the gradient pointers left 0
    blocks: int  #: thread blocks of the launch (one per chunk of one tensor)
    shapes: list  #: each parameter's shape: what its gradient must have
    dtypes: list  #: the dtype once per parameter: what each gradient must have
    nonempty: Any  #: an ``itemgetter`` picking the non-empty parameters' gradients (None: all of them)
    storage_set: frozenset  #: ``storages`` as a set, to intersect with the reader registry
    arrays: tuple  #: ``(params, ms, vs)``: the arrays the update writes, as lists to hand back


@functools.lru_cache(maxsize=1024)
def _broadcast_strides(src: tuple, strides: tuple, shape: tuple) -> tuple | None:
    """The strides of an array of shape ``src`` and ``strides`` broadcast to ``shape`` by NumPy's rules (0 along
    each new or stretched axis), or None where it does not broadcast; remembered (a step broadcasts the same
    few layouts, a bias over a batch, at every call)."""
    lead = len(shape) - len(src)
    if lead < 0:
        return None
    out = [0] * lead
    for n, st, m in zip(src, strides, shape[lead:]):
        if n == m:
            out.append(st)
        elif n == 1:
            out.append(0)
        else:
            return None
    return tuple(out)


def _row_view(a: Any, i: int) -> Any:
    """Row ``i`` of the C-contiguous 2-d ``cupy.ndarray`` ``a`` as a 1-d view on its memory, made in C (CuPy's
    integer indexing runs NumPy's Python ``isscalar`` per index)."""
    n = a.shape[1]
    return cupy.ndarray((n,), a.dtype, a.data + i * n * a.itemsize)


class LazyArray(LazyArrayBase):
    """A CUDA array that may still be a pending fused expression (the lazy engine's array type on CUDA).

    ``lazy`` is the :class:`~flowgraph.backends.fusion.Expr` computing it (``None`` once realized), ``value``
    the ``cupy.ndarray`` holding it (``None`` while lazy) and ``consumers`` the pending arrays reading it while
    it is pending (see :mod:`flowgraph.backends.lazy`). Layers above read only ``shape``, ``ndim``, ``dtype``,
    ``size`` and ``len()``.
    """

    __slots__ = ("lazy", "shape", "dtype", "value", "consumers", "__weakref__")

    def __init__(self, lazy: Expr | None, shape: Shape, dtype: np.dtype, value: Any = None):
        self.lazy = lazy
        self.shape = shape
        self.dtype = dtype
        self.value = value
        self.consumers: Any = None

    def __repr__(self) -> str:
        state = "lazy" if self.lazy is not None else "realized"
        return f"LazyArray(shape={self.shape}, dtype={self.dtype}, {state})"
class CupyBackend(LazyEngine, ArrayBackend):
    """The protocol on one NVIDIA GPU through CuPy (``"cuda:N"``).

    >>> be = get_backend("cuda:0")                                  # doctest: +SKIP
    >>> be.to_host(be.add(be.from_host(np.ones(3, np.float32)), 1))  # doctest: +SKIP
    array([2., 2., 2.], dtype=float32)
    """

    _lazy_type = LazyArray
    _array_name = "a CUDA array"
    _emitter = K.CudaEmitter

    def __init__(self, device: str = "cuda:0"):
        kind, _, index = device.partition(":")
        if kind != "cuda" or not (index or "0").isdigit():
            raise BackendError(f"CupyBackend needs a device string 'cuda:<index>', got {device!r}")
        self.index = int(index or 0)
        count = _device_count()
        if self.index >= count:
            raise BackendError(
                f"device 'cuda:{self.index}' does not exist: {count} CUDA device(s) visible"
                + (" (is the NVIDIA driver loaded and CUDA_VISIBLE_DEVICES set?)" if count == 0 else
                   f"; use 'cuda:0' .. 'cuda:{count - 1}'")
            )
        self._device = cupy.cuda.Device(self.index)
        self._device.use()
        if count == 1:  # nothing else is ever current: the check is skipped (about 200 calls a step)
            self._use = _one_device
        _install_peak_allocator()
        self._kernels: dict[tuple, Any] = {}
        self._init_lazy()
        self._ew_plans: dict[tuple, Any] = {}  # ``_ew_plan`` per program and layout
        self._sum_plans: dict[tuple, Any] = {}  # ``_sum_plan`` per program, layout and axes
        self._row_launches: dict[tuple, Any] = {}  # ``_call``'s packed launches per kernel, shape and arguments
        self._strip_layouts: dict[tuple, tuple] = {}  # ``_strip_launch``'s launch layout per kernel and shape
        self._rng_state: Any = None
        self._rng: Any = None
        self._blas: Cublas | None = None
        self._cudnn: cudnn_lib.Cudnn | None = None
        # Multi-tensor Adam's device tables of pointers and sizes, by (dtype, pointers and sizes); built
        # outside CUDA-graph capture only (a host-to-device copy), a few kept.
        self._adam_tables: dict[tuple, Any] = {}
        self._adam_static: dict[tuple, _AdamSet] = {}  # checked parameter sets (``_adam_checked``)
        self._ones_rows: dict[tuple, Any] = {}  # bias_grad_accumulate's rows of ones, per (length, dtype)
        self._gemm_plans: dict[tuple, tuple] = {}  # _gemm_plan's layouts of 2-d GEMMs, per operand layout
        # Tables built while a CUDA graph recorded: the graph copies from their pinned staging buffers into
        # their device arrays at every replay, so they live as long as the process.
        self._graph_tables: list = []
        #: Set by ``fg.capture`` while a CUDA graph is being recorded: host reads raise.
        self.capturing = False
        #: Sink host calls met while recording a graph: ``(fn, arrays)`` run after each launch.
        self.after_launch: list = []
        #: Counters for tests and benchmarks: fused kernel launches and elementwise ops folded into them.
        self.stats = {"fused_launches": 0, "fused_ops": 0}
        super().__init__(cupy, "cuda", f"cuda:{self.index}")
        props = cupy.cuda.runtime.getDeviceProperties(self.index)
        name = props["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.total_memory = int(props["totalGlobalMem"])
        self._eager = {n: self.__dict__[n] for n in (*UNARY_OPS, *BINARY_OPS) if n in self.__dict__}
        # Replace the ufunc bindings ArrayBackend made with the fusing primitives.
        for n in UNARY_OPS:
            self.__dict__[n] = self._unary_method(n)
        for n in BINARY_OPS:
            self.__dict__[n] = self._binary_method(n)

    # ----------------------------------------------------------------- discovery
    @staticmethod
    def list_devices() -> list[str]:
        """Every visible CUDA device as ``"cuda:N"``; ``[]`` (never raises) without CuPy, driver or GPU."""
        return [f"cuda:{i}" for i in range(_device_count())]

    @staticmethod
    def is_available() -> bool:
        """Whether at least one CUDA device can be used."""
        return _device_count() > 0

    def _use(self) -> None:
        """Make this backend's device the current one (every entry point that allocates or launches calls it;
        with one visible device the instance's own ``_use`` is ``_one_device``, which does nothing)."""
        if _get_device() != self.index:
            self._device.use()

    # ----------------------------------------------------------------- the lazy engine's hooks
    def _arr(self, x: Any) -> Any:
        """The ``cupy.ndarray`` behind ``x`` (running its pending expression first)."""
        if type(x) is LazyArray:
            if x.lazy is not None:
                self.realize(x)
            return x.value
        return x

    def _dense(self, x: Any) -> Any:
        """``_arr(x)`` C-contiguous: itself where it is (a flag read, not ``cupy.ascontiguousarray``'s Python),
        else a contiguous copy."""
        a = self._arr(x)
        return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)

    def native(self, x: Any) -> Any:
        """The ``cupy.ndarray`` holding ``x`` (a pending expression runs first): for code that hands device
        pointers to other libraries (NCCL, DLPack consumers)."""
        return self._arr(x)

    @staticmethod
    def _operand(x: Any, where: str) -> Any:
        t = type(x)
        return x if t is LazyArray or t is cupy.ndarray else None

    @staticmethod
    def _as_leaf(x: Any) -> LazyArray:
        return x if type(x) is LazyArray else LazyArray(None, x.shape, x.dtype, x)

    @staticmethod
    def _new_lazy(expr: Expr, shape: Shape, dtype: np.dtype) -> LazyArray:
        return LazyArray(expr, shape, dtype)

    @staticmethod
    def _broadcast_leaf(x: LazyArray, shape: Shape, where: str) -> LazyArray:
        value = x.value
        shape = tuple(shape)
        strides = _broadcast_strides(value.shape, value.strides, shape)
        if strides is None:
            raise ShapeError(f"{where}: cannot broadcast shape {x.shape} to {shape} (NumPy rules)")
        # the view made in C (``cupy.broadcast_to`` is Python: about 160 bytecodes a call, a bias at every step)
        return LazyArray(None, shape, x.dtype, cupy.ndarray(shape, value.dtype, value.data, strides))

    @staticmethod
    def _channel_leaf(v: LazyArray, shape: Shape) -> LazyArray:
        value = v.value
        strides = (0, value.strides[0]) + (0,) * (len(shape) - 2)
        return LazyArray(None, shape, v.dtype, cupy.ndarray(shape, value.dtype, value.data, strides))

    _storage_of = operator.attrgetter("value.data.mem")

    @staticmethod
    def _overlaps(a: LazyArray, b: LazyArray) -> bool:
        va, vb = a.value, b.value
        same_view = va.data.ptr == vb.data.ptr and va.strides == vb.strides
        return not same_view and cupy.may_share_memory(va, vb)

    @staticmethod
    def _strides(x: LazyArray) -> tuple[int, ...]:
        return x.value.strides

    def _fresh(self, shape: Shape, dtype: np.dtype) -> LazyArray:
        self._use()
        return LazyArray(None, tuple(shape), dtype, cupy.ndarray(shape, dtype))  # cupy.empty without its Python

    @staticmethod
    def _take_storage(x: LazyArray, out: LazyArray) -> None:
        x.value, x.lazy = out.value, None

    @staticmethod
    def _fill(dst: LazyArray, value: Scalar) -> None:
        v = value.value
        dst.value.fill(float(v) if value.dtype in K.HALF_TYPES else v)

    def _kernel(self, root: Any, key: tuple, out_dtype: np.dtype, outputs: tuple = ()) -> Any:
        kernel = self._kernels.get(key)
        if kernel is None:
            program = linearize(root)  # same leaf and scalar order as lazy.flatten
            in_params, out_params, body, preamble = K.elementwise_spec(program, out_dtype, outputs)
            kernel = cupy.ElementwiseKernel(in_params, out_params, body, name="fg_fused", preamble=preamble)
            self._kernels[key] = kernel
        return kernel

    def kernel_source(self, x: LazyArray, out_dtype: Any = None) -> str:
        """The operation body generated for the pending expression ``x`` (for debugging and tests)."""
        program = linearize(x)
        return K.elementwise_spec(program, np.dtype(out_dtype or program.dtype))[2]

    #: Threads per block of the strided elementwise kernel.
    EW_THREADS = 256

    def _ew_plan(self, pkey: tuple, root: Any, dst: Any, values: list, outputs: tuple, written: list) -> Any:
        """How ``_launch_fused`` runs a tree in one layout (``pkey``: structure, dtype, shape, the byte strides
        of the output and each leaf, the interior values written out): the strided kernel's
        :class:`~.launch.PackedLaunch` (the output, each leaf, each extra output, then each scalar filled per
        launch), or False for programs touching float16/bfloat16 (a ``cupy.ElementwiseKernel``). Kept per
        layout, so a training step's launches pay neither the layout walk nor the argument conversions again."""
        key, dtype = pkey[0], pkey[1]
        types = {dtype, *key[1], *key[2], *(c[1] for c in key[0])}
        if not types <= K.RAW_TYPES:
            plan: Any = False
        else:
            shape, n = dst.shape, dst.size
            arrays = (dst, *values, *written)
            if dst.flags.c_contiguous and all([v.shape == shape and v.flags.c_contiguous for v in values]):
                # the common case, what ``collapse`` gives it without the per-axis walk: rank 1 (0 for one element)
                # (extra outputs are fresh contiguous arrays of the output's shape)
                dims: tuple = (n,) if n > 1 else ()
                strides: Any = [(1,) * len(dims)] * len(arrays)
                it = np.int32 if n < 2**31 else np.int64
            else:
                dims, strides = collapse(shape, [tuple([s // v.itemsize for s in v.strides]) for v in arrays])
                it = np.int32 if index_fits_int(n, dims, strides) else np.int64
            rank = len(dims)
            baked = tuple(dims) if rank > 1 and n >= BAKE_DIMS_MIN else None
            kkey = ("ew", key, dtype, rank, outputs, baked, it)
            kernel = self._kernels.get(kkey)
            if kernel is None:
                source = K.strided_source(linearize(root), rank, dtype, "int" if it is np.int32 else "long long",
                                          baked, outputs)
                kernel = self._kernels[kkey] = cupy.RawKernel(source, "fg_ew")
            threads = self.EW_THREADS
            params: list[Any] = [it(n), *[it(d) for d in dims], ARRAY, *[it(s) for s in strides[0]]]
            for st in strides[1:]:
                params += [ARRAY, *[it(s) for s in st]]
            params += list(key[2])  # the scalars, each in its own dtype
            plan = PackedLaunch(kernel, ((n + threads - 1) // threads,), (threads,), params)
        if len(self._ew_plans) >= PLAN_MEMO:
            self._ew_plans.clear()
        self._ew_plans[pkey] = plan
        return plan

    def _launch_fused(self, flat: tuple, root: Any, out: LazyArray, outputs: tuple = (),
                      extras: Sequence[LazyArray] = ()) -> None:
        """Evaluate the tree ``root`` into the view ``out`` (same shape, any layout; converts), and its values
        ``outputs`` into the fresh ``extras`` (``LazyEngine._launch_fused``).

        Programs of non-16-bit types run as this backend's strided kernel (``kernels.strided_source``, a
        ``cupy.RawKernel``: operands by collapsed strides, a contiguous op at rank 1); those touching
        float16/bfloat16 as a ``cupy.ElementwiseKernel``.
        """
        dst = out.value
        n = dst.size
        if n == 0:
            return
        self._use()
        key, leaves, scalars = flat
        dtype = dst.dtype
        stats = self.stats
        stats["fused_launches"] += 1
        stats["fused_ops"] += len(key[0])
        values = list(map(_value, leaves))
        written = list(map(_value, extras)) if extras else []
        pkey = (key, dtype, dst.shape, dst.strides, *map(_strides, values), outputs)
        plan = self._ew_plans.get(pkey)
        if plan is None:
            plan = self._ew_plan(pkey, root, dst, values, outputs, written)
        if plan is not False:
            plan.launch_split((dst, *values, *written), map(_value, scalars))
            return
        kernel = self._kernel(root, (key, dtype, outputs), dtype, outputs)
        # An input in the output's own layout: pass the output itself so CuPy does not copy it first.
        ptr, strides = dst.data.ptr, dst.strides
        for i, value in enumerate(values):
            if value is not dst and value.data.ptr == ptr and value.strides == strides:
                values[i] = dst
        for sc in scalars:
            values.append(sc.value if sc.dtype not in K.HALF_TYPES else np.float32(sc.value))
        kernel(*values, dst, *written)

    def check_dtype(self, dtype: np.dtype, where: str) -> np.dtype:
        """``dtype`` when CUDA computes it, or a BackendError naming the supported dtypes."""
        if dtype not in K.CudaEmitter.CTYPES:
            raise BackendError(
                f"{where}: dtype {dtype} is not supported on CUDA; supported: bool, (u)int8-64, float16, "
                "bfloat16, float32, float64"
            )
        return dtype

    # ----------------------------------------------------------------- elementwise
    def _unary_method(self, name: str):
        eager = self._eager.get(name)

        def op(a: Array) -> Array:
            if not fusion.is_enabled():
                self._use()
                return eager(self._arr(a)) if eager is not None else getattr(type(self), name)(self, a)
            return self._unary(name, a)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a)`` (lazy; fused with its neighbours)."
        return op

    def _binary_method(self, name: str):
        eager = self._eager[name]
        enabled = fusion.is_enabled

        # CuPy's float floor_divide/remainder differ from NumPy at infinities: keep the generated kernel.
        own_kernel_always = name in ("floor_divide", "remainder")

        def op(a: Array, b: Array) -> Array:
            if not enabled():
                dtype = getattr(a, "dtype", None)
                if dtype is None:
                    dtype = getattr(b, "dtype", None)
                if not (own_kernel_always and dtype is not None and dtype.kind == "f"):
                    return self._eager_binary(eager, name, a, b)
                return self._binary(name, a, b).value  # realized: fusion is off
            return self._binary(name, a, b)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a, b)`` with broadcasting (lazy; fused with its neighbours)."
        return op

    def _eager_binary(self, ufunc: Any, name: str, a: Any, b: Any) -> Any:
        self._use()
        a, b = self._arr(a), self._arr(b)
        # A Python scalar takes the array's dtype (the protocol's rule), as NumPy 2 does for most cases.
        # (bfloat16, kind "V", keeps a Python scalar: CuPy treats it as weak and keeps the array's dtype).
        if not isinstance(a, cupy.ndarray):
            a = np.asarray(a).astype(b.dtype)[()] if b.dtype.kind != "V" else a
        elif not isinstance(b, cupy.ndarray):
            b = np.asarray(b).astype(a.dtype)[()] if a.dtype.kind != "V" else b
        return ufunc(a, b)

    def erf(self, a: Array) -> Array:
        """Error function (fused as CUDA's ``erf``; ``cupyx.scipy.special.erf`` with fusion off)."""
        if fusion.is_enabled():
            return self._node("erf", (a,), self.check_dtype(np.dtype(a.dtype), "erf"))
        from cupyx.scipy.special import erf

        a = self._arr(a)
        if a.dtype in K.HALF_TYPES:
            return erf(a.astype(np.float32)).astype(a.dtype)
        return erf(a)

    def where(self, cond: Array, a: Array, b: Array) -> Array:
        if not fusion.is_enabled():
            self._use()
            return super().where(self._arr(cond), self._arr(a), self._arr(b))
        return self._where(cond, a, b)

    def cast(self, a: Array, dtype: np.dtype) -> Array:
        dtype = np.dtype(dtype)
        if a.dtype == dtype:
            return a
        self.check_dtype(dtype, "cast")
        if not fusion.is_enabled():
            self._use()
            return self._arr(a).astype(dtype)
        out = self._cast(a, dtype)
        if dtype in K.HALF_TYPES and a.dtype not in K.HALF_TYPES and type(out) is LazyArray:
            # A 16-bit float made inside a fused chain of wider types would be an intermediate of a type CuPy
            # declares only for kernel arguments (float32 -> float16 -> float32 failed to compile): store it.
            self.realize(out)
        return out

    # ----------------------------------------------------------------- host exchange and creation
    def host_call(self, fn: Any, *arrays: Array, sink: bool = False) -> Any:
        if self.capturing and sink:  # run after each launch, on copies the graph makes
            copies = tuple(self.assign(self.full(a.shape, 0, a.dtype), a) for a in arrays)
            self.after_launch.append((fn, copies))
            return None
        self._no_capture("host work (a store collective)")
        return fn(*arrays)

    def _no_capture(self, what: str) -> None:
        if self.capturing:
            raise FlowError(
                f"{what} inside fg.jit/fg.capture: a CUDA graph cannot read device memory on the host or copy host "
                "memory in while it is recorded (no .item(), .numpy(), print, float(), if on a tensor, "
                "fg.tensor(...) of host data). Return the tensor from the step function and read it after "
                "the replay, or create constants before capturing"
            )

    def from_host(self, array: np.ndarray) -> Array:
        self._no_capture("copying host data to the device")
        self._use()
        array = np.asarray(array)
        if not array.dtype.isnative:  # a foreign byte order (e.g. read from a big-endian file)
            array = array.astype(array.dtype.newbyteorder("="))
        self.check_dtype(array.dtype, "from_host")
        try:
            return cupy.asarray(array)
        except (TypeError, ValueError) as exc:
            raise BackendError(f"from_host: CuPy cannot hold {array.dtype} arrays here ({exc})") from exc

    def to_host(self, a: Array) -> np.ndarray:
        self._no_capture("reading a tensor on the host")
        self._use()
        return cupy.asnumpy(self._arr(a))

    def from_dlpack(self, obj: Any) -> Array:
        """Zero-copy import of a DLPack-capable CUDA array (a torch CUDA tensor, a CuPy array ...)."""
        self._use()
        return cupy.from_dlpack(obj)

    def to_dlpack(self, a: Array, *args: Any, **kwargs: Any) -> Any:
        return self._arr(a).__dlpack__(*args, **kwargs)

    def dlpack_device(self, a: Array) -> tuple[int, int]:
        return self._arr(a).__dlpack_device__()

    def full(self, shape: Shape, value: float | int | bool, dtype: np.dtype) -> Array:
        self._use()
        return cupy.full(tuple(shape), value, dtype=self.check_dtype(np.dtype(dtype), "full"))

    def arange(self, start: float, stop: float, step: float, dtype: np.dtype) -> Array:
        self._use()
        if step == 0:
            raise BackendError("arange: step must not be zero")
        return cupy.arange(start, stop, step, dtype=dtype)

    # ----------------------------------------------------------------- random (Philox on the device)
    def seed(self, seed: int) -> None:
        self._no_capture("seeding the generator")
        self._use()
        seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        host = np.array([seed, 0], dtype=np.uint64)
        if self._rng_state is None:
            self._rng_state = cupy.asarray(host)
        else:
            self._rng_state.set(host)

    def get_rng_state(self) -> Any:
        self._use()
        if self.capturing:  # inside a CUDA graph: a device copy, taken each time the graph runs
            return self._rng_state.copy()
        return cupy.asnumpy(self._rng_state).view(np.int64)  # [seed, counter]

    def set_rng_state(self, state: Any) -> None:
        self._use()
        if isinstance(state, cupy.ndarray):  # a device copy from get_rng_state inside a graph
            self._rng_state[...] = state.view(cupy.uint64)
            return
        self._no_capture("setting the generator state from the host")
        host = np.ascontiguousarray(state, dtype=np.int64).view(np.uint64)
        if self._rng_state is None:
            self._rng_state = cupy.asarray(host)
        else:
            self._rng_state.set(host)

    def _draw(self, kernel: str, out: Any, per: int, extra: Sequence[Any] = ()) -> Any:
        n = out.size
        if n == 0:
            return out
        self._use()
        if self._rng is None:
            self._rng = K.rng_module(cupy)
        blocks = -(-n // per)
        threads = 256
        grid = (-(-blocks // threads),)
        self._rng.get_function(kernel)(grid, (threads,), (out, np.int64(n), self._rng_state, *extra))
        self._rng.get_function("fg_rng_advance")((1,), (1,), (self._rng_state, np.uint64(blocks)))
        return out

    def _float_dtype(self, dtype: Any, where: str) -> np.dtype:
        dtype = self.check_dtype(np.dtype(dtype), where)
        if dtype.kind != "f" and dtype != K.BF16:
            raise BackendError(f"{where}: needs a floating dtype, got {dtype}")
        return dtype

    def uniform(self, shape: Shape, dtype: np.dtype) -> Array:
        dtype = self._float_dtype(dtype, "uniform")
        self._use()
        if dtype == K.F64:
            return self._draw("fg_uniform_f64", cupy.empty(tuple(shape), K.F64), 2)
        # Few enough random bits that rounding to the dtype never reaches 1.0.
        bits = {K.F32: 24, K.F16: 11, K.BF16: 8}[dtype]
        out = self._draw("fg_uniform_f32", cupy.empty(tuple(shape), K.F32), 4, (np.int32(bits),))
        return out if dtype == K.F32 else self.cast(out, dtype)

    def normal(self, shape: Shape, dtype: np.dtype) -> Array:
        dtype = self._float_dtype(dtype, "normal")
        self._use()
        if dtype == K.F64:
            return self._draw("fg_normal_f64", cupy.empty(tuple(shape), K.F64), 2)
        out = self._draw("fg_normal_f32", cupy.empty(tuple(shape), K.F32), 4)
        return out if dtype == K.F32 else self.cast(out, dtype)

    def randint(self, low: int, high: int, shape: Shape, dtype: np.dtype) -> Array:
        dtype = self.check_dtype(np.dtype(dtype), "randint")
        if dtype.kind not in "iu":
            raise BackendError(f"randint: needs an integer dtype, got {dtype}")
        if high <= low:
            raise BackendError(f"randint: needs low < high, got low={low}, high={high}")
        self._use()
        out = self._draw("fg_randint", cupy.empty(tuple(shape), _I64), 2,
                         (np.int64(low), np.uint64(int(high) - int(low))))
        return out if dtype == _I64 else self.cast(out, dtype)

    # ----------------------------------------------------------------- reductions (realize, then CuPy)
    def sum(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        if type(a) is LazyArray and a.lazy is not None and axes and a.dtype != K.BF16 and fusion.is_enabled():
            if 0 not in a.shape:
                return self._fused_sum(a, tuple(axes), keepdims)
        a = self._arr(a)
        if a.dtype in K.HALF_TYPES:
            return cupy.sum(a.astype(np.float32), axis=axes, keepdims=keepdims).astype(a.dtype)
        if OWN_REDUCTIONS and axes and a.dtype in K.RSUM_TYPES and a.size:
            # A realized float32/float64 array: the same kernel as a pending one (a copy program), whose
            # launch is a few microseconds of host time against ``cupy.sum``'s ~30.
            return self._fused_sum(LazyArray(None, a.shape, a.dtype, a), tuple(axes), keepdims)
        return super().sum(a, axes, keepdims)

    def _fused_sum(self, a: LazyArray, axes: tuple[int, ...], keepdims: bool) -> Any:
        """``sum`` of a pending expression (or a realized array: a copy program) as one reduction kernel that
        computes the expression on the fly."""
        dtype = a.dtype
        if dtype.kind == "f":
            out_dtype = dtype
        else:
            out_dtype = np.sum(np.zeros(1, dtype)).dtype  # NumPy's: int64 for bool and signed ints
        acc = K.F32 if dtype in K.HALF_TYPES else out_dtype
        ndim = len(a.shape)
        axes = tuple(sorted({ax % ndim for ax in axes}))
        flat = flatten(a)
        if OWN_REDUCTIONS and out_dtype in K.RSUM_TYPES and all(leaf.dtype in K.RSUM_TYPES for leaf in flat[1]):
            return self._own_sum(a, axes, keepdims, out_dtype, flat)
        kept = split_reduction(a.shape, axes)
        stage_dtype = acc if kept else out_dtype
        key = ("sum", flat[0], stage_dtype)
        kernel = self._kernels.get(key)
        if kernel is None:
            spec = K.sum_spec(linearize(a), acc, stage_dtype)
            kernel = cupy.ReductionKernel(name="fg_fused_sum", **spec)
            self._kernels[key] = kernel
        args: list[Any] = [leaf.value for leaf in flat[1]]
        args += [s.value if s.dtype not in K.HALF_TYPES else np.float32(s.value) for s in flat[2]]
        stats = self.stats
        stats["fused_launches"] += 1
        stats["fused_ops"] += len(flat[0][0]) + 1
        if not kept:
            return kernel(*args, axis=axes, keepdims=keepdims)
        # Two stages: the fused kernel keeps the ``kept`` axes as outputs (enough thread blocks to fill the
        # GPU), then a plain sum of those partials, which are small.
        inner = tuple(ax for ax in axes if ax not in kept)
        partial = kernel(*args, axis=inner, keepdims=True)
        out = cupy.sum(partial, axis=kept, keepdims=keepdims)
        if not keepdims:
            out = out.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))
        return out.astype(out_dtype, copy=False)

    def _own_sum(self, a: LazyArray, axes: tuple[int, ...], keepdims: bool, out_dtype: np.dtype,
                 flat: tuple) -> Any:
        """``sum`` of a float32/float64 expression (or realized array) with this backend's reduction kernel.

        Kept and reduced axes are collapsed separately (contiguous runs merge), each output gets ``parts``
        thread blocks when there are too few outputs to fill the GPU, and a second, small pass of the same
        kernel adds the partial sums. The layout work is done once per program, layout and axes
        (``_sum_plan``).
        """
        key_struct, leaves, scalars = flat
        values = list(map(_value, leaves))
        pkey = (key_struct, out_dtype, a.shape, axes, keepdims, *map(_strides, values))
        plan = self._sum_plans.get(pkey)
        if plan is None:
            plan = self._sum_plan(pkey, a, values)
        launch, size, transports, parts, n_out, out_shape = plan
        out = cupy.ndarray(size, out_dtype)
        launch.launch_split((out, *values), [t(sc.value) for t, sc in zip(transports, scalars)] if scalars else ())
        stats = self.stats
        stats["fused_launches"] += 1
        stats["fused_ops"] += len(key_struct[0]) + 1
        if parts > 1:
            partial = LazyArray(None, (n_out, parts), out_dtype, out.reshape(n_out, parts))
            out = self._own_sum(partial, (1,), False, out_dtype, flatten(partial))
        return out.reshape(out_shape)

    def _sum_plan(self, pkey: tuple, a: LazyArray, values: list) -> tuple:
        """``(packed launch, partials, scalar transport types, parts, outputs, result shape)`` of one
        ``_own_sum`` layout (``pkey``: structure, dtype, shape, axes, keepdims, strides); the launch takes the
        partials' buffer, each leaf, then each scalar."""
        key_struct, out_dtype, shape, axes, keepdims = pkey[:5]
        kept_shape, (kdims, kstrides), (rdims, rstrides) = reduction_layout(
            shape, axes, [tuple(s // v.itemsize for s in v.strides) for v in values])
        n_out, n_in = math.prod(kept_shape), math.prod(shape[d] for d in axes)
        serial = n_in <= K.SERIAL_SUM_MAX
        threads = 256 if n_in >= 1024 or serial else max(32, 1 << (n_in - 1).bit_length())
        parts = 1
        if n_out < MIN_REDUCTION_BLOCKS and n_in >= 16 * threads:
            parts = min(-(-MIN_REDUCTION_BLOCKS // n_out), n_in // (8 * threads), 1024)
        key = ("rsum", serial, key_struct, len(kdims), len(rdims), out_dtype)
        kernel = self._kernels.get(key)
        if kernel is None:
            make = K.rsum_serial_source if serial else K.rsum_source
            source = make(linearize(a), len(kdims), len(rdims), out_dtype, out_dtype)
            kernel = cupy.RawKernel(source, "fg_rsum_serial" if serial else "fg_rsum")
            self._kernels[key] = kernel
        i64 = np.int64
        params: list[Any] = [i64(n_in), i64(n_out if serial else parts), *map(i64, kdims), *map(i64, rdims), ARRAY]
        for ks, rs in zip(kstrides, rstrides):
            params += [ARRAY, *map(i64, ks), *map(i64, rs)]
        transports = tuple(K.scalar_transport(d).type for d in key_struct[2])
        params += [np.dtype(t) for t in transports]
        out_shape = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keepdims else kept_shape
        grid = (-(-n_out // threads),) if serial else (n_out * parts,)
        plan = (PackedLaunch(kernel, grid, (threads,), params), n_out * parts, transports, parts, n_out, out_shape)
        if len(self._sum_plans) >= PLAN_MEMO:
            self._sum_plans.clear()
        self._sum_plans[pkey] = plan
        return plan

    def prod(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        return super().prod(self._arr(a), axes, keepdims)

    def max(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        return super().max(self._arr(a), axes, keepdims)

    def min(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        return super().min(self._arr(a), axes, keepdims)

    def any(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        return super().any(self._arr(a), axes, keepdims)

    def all(self, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
        self._use()
        return super().all(self._arr(a), axes, keepdims)

    def argmax(self, a: Array, axis: int, keepdims: bool) -> Array:
        self._use()
        a = self._arr(a)
        if a.ndim == 0:  # NumPy accepts axis 0 of a 0-d array; CuPy does not
            return cupy.zeros((), dtype=_I64)
        return super().argmax(a, axis, keepdims)

    def argmin(self, a: Array, axis: int, keepdims: bool) -> Array:
        self._use()
        a = self._arr(a)
        if a.ndim == 0:
            return cupy.zeros((), dtype=_I64)
        return super().argmin(a, axis, keepdims)

    def cumsum(self, a: Array, axis: int) -> Array:
        self._use()
        a = self._arr(a)
        if a.dtype == _BOOL:
            return cupy.cumsum(a, axis=axis).astype(_BOOL)
        return super().cumsum(a, axis)

    # ----------------------------------------------------------------- movement
    def reshape(self, a: Array, shape: Shape) -> Array:
        self._use()
        return self._arr(a).reshape(shape)

    def permute(self, a: Array, axes: Sequence[int]) -> Array:
        return self._arr(a).transpose(axes)

    def expand(self, a: Array, shape: Shape) -> Array:
        return cupy.broadcast_to(self._arr(a), shape)

    def slice(self, a: Array, index: tuple[slice, ...]) -> Array:
        return self._arr(a)[index]

    def flip(self, a: Array, axes: Sequence[int]) -> Array:
        return cupy.flip(self._arr(a), axis=tuple(axes))

    def pad(self, a: Array, widths: Sequence[tuple[int, int]], value: float) -> Array:
        self._use()
        a = self._arr(a)
        shape = tuple(n + lo + hi for n, (lo, hi) in zip(a.shape, widths))
        out = cupy.full(shape, value, dtype=a.dtype)
        out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(a.shape, widths))] = a
        return out

    def _strides(self, a: Array) -> tuple[int, ...] | None:
        return self._arr(a).strides  # a pending expression counts as contiguous: never asked

    def is_contiguous(self, a: Array) -> bool:
        # A pending expression realizes into a fresh row-major array, so it counts as contiguous without running.
        if type(a) is LazyArray:
            return a.lazy is not None or bool(a.value.flags.c_contiguous)
        return bool(a.flags.c_contiguous)

    def contiguous(self, a: Array) -> Array:
        self._use()
        if type(a) is LazyArray:
            # The array itself when it already is contiguous (callers test identity to decide to copy).
            if self._arr(a).flags.c_contiguous:
                return a
            a = a.value
        if a.flags.c_contiguous:
            return a
        return cupy.ascontiguousarray(a) if a.ndim else a.copy()

    def assign(self, dst: Array, src: Array | float) -> Array:
        self._use()
        dst = self._arr(dst)
        return self._assign(LazyArray(None, dst.shape, dst.dtype, dst), src).value

    @staticmethod
    def _update_layout(p: Any, state: tuple) -> bool:
        """Whether a fused optimizer kernel takes parameter ``p`` and its ``state`` buffers (cupy arrays):
        contiguous float32/float64 arrays of one dtype and shape."""
        return p.dtype in (K.F32, K.F64) and p.flags.c_contiguous and all(
            x.dtype == p.dtype and x.shape == p.shape and x.flags.c_contiguous for x in state)

    def _optimizer_operands(self, p: Array, g: Array, state: tuple) -> tuple | None:
        """``(p, g, state)`` as cupy arrays for a fused optimizer kernel, or None (the generic path runs) unless
        ``p`` and the state buffers are contiguous float32/float64 arrays of one dtype and shape."""
        self._use()
        p, state = self._arr(p), tuple(self._arr(x) for x in state)
        if not self._update_layout(p, state):
            return None
        g = self._arr(g)
        if g.shape != p.shape:
            return None
        return p, g if g.dtype == p.dtype else g.astype(p.dtype), state

    def _update_step(self, spec: UpdateKernel, p: Array, g: Array, state: tuple, steps: tuple,
                     scalars: tuple) -> bool:
        """Run the fused optimizer update ``spec`` in place on ``p`` and ``state``; False where it cannot."""
        operands = self._optimizer_operands(p, g, state)
        if operands is None:
            return False
        p, g, state = operands
        device = not is_host_scalar(steps[0])
        if device:
            steps = tuple(self._arr(x) for x in steps)
            if any(x.dtype != K.F32 for x in steps):
                return False
            steps = tuple(x.reshape(1) for x in steps)
        t = p.dtype.type
        key = (spec.name, device)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = cupy.ElementwiseKernel(*K.update_spec(spec, device), name=f"fg_{spec.name}")
            self._kernels[key] = kernel
        for buffer in (p, *state):  # pending expressions reading the old values run first
            self._flush_readers(id(buffer.data.mem))
        kernel(g, *(steps if device else (t(x) for x in steps)), *(t(x) for x in scalars), p, *state)
        return True

    #: Multi-tensor Adam tables kept (one per distinct set of parameter, gradient and state addresses).
    ADAM_TABLES = 8

    def adam_step_multi(self, params: Sequence[Array], grads: Sequence[Array], ms: Sequence[Array],
                        vs: Sequence[Array], beta1: float, beta2: float, step_size: Any, eps_hat: Any,
                        l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                        v_maxs: Sequence[Array] | None = None) -> tuple:
        """Optional fused composite (see ``Backend.adam_step_multi``): one launch updates every tensor, each
        thread block one chunk of one tensor found through a device table of pointers and sizes (PyTorch's
        ``multi_tensor_apply``), with the statements of ``adam_step``'s kernel (bit for bit the same).

        ``step_size``/``eps_hat`` are host numbers, or 0-d float32 device arrays inside ``fg.jit``/``fg.capture``
        (read on the device at each replay). The table is cached by the tensors' addresses. One built while a
        CUDA graph records becomes a copy in the graph (from pinned memory this backend keeps for the
        process's life, with the device table, since every replay reads them). With AMSGrad, a device
        ``decay``, or any ``p``, ``m``, ``v`` that is not a contiguous float32/float64 array of one dtype, the
        generic loop over ``adam_step`` runs instead.
        """
        device_steps = not (is_host_scalar(step_size) and is_host_scalar(eps_hat))
        fits = v_maxs is None and is_host_scalar(decay)
        if fits and device_steps:
            steps = (self._arr(step_size), self._arr(eps_hat))
            fits = all(x.dtype == K.F32 and x.size == 1 for x in steps)
        checked = self._adam_checked(params, grads, ms, vs) if fits and params else None
        if checked is None:
            return super().adam_step_multi(params, grads, ms, vs, beta1, beta2, step_size, eps_hat, l2, decay,
                                           maximize, v_maxs)
        static, gs = checked
        dtype = static.dtype
        gptrs = tuple(map(pointer_of, gs if static.nonempty is None else static.nonempty(gs)))
        key = (dtype, static.layout, gptrs)
        table = self._adam_tables.get(key)
        if table is None:  # new gradient addresses (most steps): the parameters' part of the table is kept
            host = static.template.copy()
            if gptrs:
                host[1:5 * len(gptrs):5] = gptrs
            if len(self._adam_tables) >= self.ADAM_TABLES:
                old = self._adam_tables.pop(next(iter(self._adam_tables)))
                if old[2][1] is not None:  # its staging buffer goes back to the pool: the copy must be done
                    old[2][1].synchronize()
            device, staging = self._upload_async(host, recorded=self.capturing)
            table = self._adam_tables[key] = (device, static.blocks, staging)
        if self.capturing and not any(t is table for t in self._graph_tables):
            self._graph_tables.append(table)  # a graph reads it at every replay: never freed
        for storage in self._readers.keys() & static.storage_set:  # pending readers of the old values run first
            self._flush_readers(storage)
        t = dtype.type
        rest = [t(x) for x in adam_update_scalars(beta1, beta2, l2, decay, maximize)]
        if gptrs:
            if device_steps:
                kernel = self._row_kernel(R.ADAM_MULTI_TABLE_DEVICE, dtype, ("adam_multi_device",))
                self._call(kernel, (table[1],), (256,),
                           (table[0], np.int64(len(gptrs)), *(x.reshape(1) for x in steps), *rest))
            else:
                kernel = self._row_kernel(R.ADAM_MULTI_TABLE, dtype, ("adam_multi",))
                self._call(kernel, (table[1],), (256,),
                           (table[0], np.int64(len(gptrs)), t(step_size), t(eps_hat), *rest))
        ps, ms_out, vs_out = static.arrays
        return list(ps), list(ms_out), list(vs_out), None

    def _adam_checked(self, params: Sequence[Array], grads: Sequence[Array], ms: Sequence[Array],
                      vs: Sequence[Array]) -> tuple[_AdamSet, list] | None:
        """``(static, grads)`` for ``adam_step_multi``, or None where its kernel does not take the arrays.

        ``static`` describes the parameters and their state, which a training loop passes again at every step
        (the same ``cupy.ndarray`` objects: the update is in place). It is checked once (``_update_layout``, one
        dtype for all) and found again by the arrays' identities, so a step re-checks only its gradients
        (``grads``: contiguous, of the parameters' dtype). A full check per parameter per step cost about 10 us
        of host time on CUDA.
        """
        self._use()
        given = (*params, *ms, *vs)
        # the steady state: the raw arrays this update wrote at the last step, taken as they are (C calls)
        arrays = list(given) if all(map(_is, map(type, given), _NDARRAYS)) else [self._arr(x) for x in given]
        ids = tuple(map(id, arrays))
        static = self._adam_static.get(ids)
        # the arrays still the ones checked (their weak references' referents, compared in C calls)
        if static is None or static.refs is None or not all(map(operator.is_, map(_deref, static.refs), arrays)):
            n = len(params)
            triples = []
            for p, m, v in zip(arrays[:n], arrays[n:2 * n], arrays[2 * n:]):
                if p.dtype != arrays[0].dtype or not self._update_layout(p, (m, v)):
                    return None
                triples.append((p, m, v))
            try:
                refs = tuple([weakref.ref(a) for a in arrays])
            except TypeError:  # an array type without weak references: checked at every step
                refs = None
            work = [t for t in triples if t[0].size]
            # the kernel's table: per tensor (p, g, m, v, size) with g filled in per step, then (tensor, start)
            # per block of ADAM_CHUNK elements
            entries = [[p.data.ptr, 0, m.data.ptr, v.data.ptr, p.size] for p, m, v in work]
            blocks = [[k, start] for k, (p, _, _) in enumerate(work) for start in range(0, p.size, R.ADAM_CHUNK)]
            template = np.array([w for row in entries + blocks for w in row] or [0], dtype=np.int64)
            storages = tuple({id(a.data.mem): None for a in arrays})
            nonempty = [i for i, (p, _, _) in enumerate(triples) if p.size]
            static = _AdamSet(refs, arrays[0].dtype, storages, tuple(triples),
                              tuple((a.data.ptr, a.size) for p, m, v in work for a in (p, m, v)), template,
                              len(blocks), [p.shape for p, _, _ in triples], [arrays[0].dtype] * n,
                              None if len(nonempty) == n else picker(nonempty), frozenset(storages),
                              (arrays[:n], arrays[n:2 * n], arrays[2 * n:]))
            if refs is not None:
                if len(self._adam_static) >= self.ADAM_TABLES:
                    self._adam_static.pop(next(iter(self._adam_static)))
                self._adam_static[ids] = static
        dtype = static.dtype
        # the common case checked in C calls: contiguous arrays of the parameters' shapes and dtype
        gs = list(grads) if all(map(_is, map(type, grads), _NDARRAYS)) else [self._arr(g) for g in grads]
        if (list(map(_shape, gs)) == static.shapes and list(map(_dtype, gs)) == static.dtypes
                and all(map(_c_contiguous, gs))):
            return static, gs
        gs = []
        for (p, _, _), g in zip(static.triples, grads):
            g = self._arr(g)
            if g.shape != p.shape:
                return None
            if g.dtype != dtype:
                g = g.astype(dtype)
            elif not g.flags.c_contiguous:
                g = cupy.ascontiguousarray(g)
            gs.append(g)
        return static, gs

    @staticmethod
    def _upload_async(host: np.ndarray, recorded: bool = False) -> tuple[Any, tuple]:
        """``host`` copied to the device without waiting for the queue: staged in pinned memory and copied on
        the current stream. (``cupy.asarray`` of pageable memory is a synchronous copy that waits for every
        queued kernel first: the per-step table of the multi-tensor Adam made the eager convnet step wait
        for the GPU, 70 ms of host time a step.) Returns the device array and ``(staging buffer, event)``,
        which must stay alive until the event has passed. ``recorded``: the copy is being recorded into a CUDA
        graph, which repeats it at every replay: no event (the caller keeps the staging buffer for good)."""
        pinned = cupy.cuda.alloc_pinned_memory(host.nbytes)
        staged = np.frombuffer(pinned, host.dtype, host.size).reshape(host.shape)
        staged[...] = host
        device = cupy.empty(host.shape, host.dtype)
        stream = cupy.cuda.get_current_stream()
        # The runtime call, not ``ndarray.set``: CuPy refuses host-to-device copies on a capturing stream, where
        # CUDA records one from pinned memory as a copy node of the graph.
        runtime = cupy.cuda.runtime
        runtime.memcpyAsync(device.data.ptr, pinned.ptr, host.nbytes, runtime.memcpyHostToDevice, stream.ptr)
        return device, (pinned, None if recorded else stream.record())

    # ----------------------------------------------------------------- LayerNorm (shared row kernels)
    def _call(self, kernel: Any, grid: tuple, block: tuple, args: Sequence[Any]) -> None:
        """``kernel(grid, block, args)`` (a ``cupy.RawKernel``) through a :class:`~.launch.PackedLaunch` kept per
        kernel, launch shape and argument types: the shared row kernels (LayerNorm, batch norm, column sums, the
        GRU cell, pooling, the multi-tensor Adam) launch with the same ones at every step, and CuPy converts
        every argument of every call (see ``launch.py``). ``args``: ``cupy.ndarray`` s (their data pointers)
        and NumPy scalars; anything else is launched by CuPy as given."""
        key = (kernel, grid, block, tuple(map(type, args)))
        plan = self._row_launches.get(key)
        if plan is None:
            if not all(type(a) is cupy.ndarray or isinstance(a, np.generic) for a in args):
                kernel(grid, block, tuple(args))
                return
            if len(self._row_launches) >= PLAN_MEMO:
                self._row_launches.clear()
            plan = self._row_launches[key] = PackedLaunch(
                kernel, grid, block, [ARRAY if type(a) is cupy.ndarray else a.dtype for a in args])
        plan.launch(args)

    def _row_kernel(self, spec: R.RowKernel | Callable[[], R.RowKernel], dtype: np.dtype, key: tuple) -> Any:
        """The compiled shared row kernel ``spec`` for ``dtype`` (cached by ``key``; ``spec`` may be a function
        making it, called only when ``key`` is not compiled yet)."""
        key = ("row", *key, dtype)
        kernel = self._kernels.get(key)
        if kernel is None:
            if not isinstance(spec, R.RowKernel):
                spec = spec()
            kernel = self._kernels[key] = cupy.RawKernel(K.row_kernel_source(spec, dtype), spec.name)
        return kernel

    def _row_operand(self, a: Array, where: str) -> Any:
        """``a`` realized and row-major, as the ``cupy.ndarray`` a shared row kernel reads or writes (the lazy
        engine's hook for its own row-kernel launches, ``_launch_rows``)."""
        self._use()
        return self._dense(a)

    def _launch_rows(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype,
                     groups: int, width: int, args: Sequence[Any]) -> None:
        """Run a shared row kernel with ``groups`` thread blocks, each sized for ``width`` elements (the lazy
        engine's hook): ``args`` in the kernel's parameter order, an array (realized, row-major) standing for its
        buffer and offset, an ``int`` for a ``long``, a ``float`` for a ``T`` scalar."""
        pkey = (key, dtype, groups, width, *map(type, args))
        plan = self._row_launches.get(pkey)
        if plan is None:
            # an int is a long, a float a T, an array its buffer (a lazy engine's array: its ``value``) and an
            # offset, 0 here: written into the plan once
            params: list[Any] = []
            for a in args:
                if type(a) is int:
                    params.append(_I64)
                elif type(a) is float:
                    params.append(dtype)
                else:
                    params += [LAZY if type(a) is LazyArray else ARRAY, np.int64(0)]
            if len(self._row_launches) >= PLAN_MEMO:
                self._row_launches.clear()
            plan = self._row_launches[pkey] = PackedLaunch(
                self._row_kernel(spec, dtype, key), (groups,), (max(32, R.row_group(width, R.MAX_GROUP)),), params)
        plan.launch(args)

    def max_pool_blocks(self, a: Array, kernel: tuple[int, ...]) -> Array:
        """One kernel (the shared ``row_kernels.MAX_POOL_BLOCKS``) for float32/float64 and 1-3 spatial dims;
        the generic window loop otherwise."""
        dims = R.pool_blocks_dims(a.shape, kernel, a.dtype)
        if dims is None:
            return super().max_pool_blocks(a, kernel)
        self._use()
        out_shape, geometry = dims
        x = cupy.ascontiguousarray(self._arr(a))
        y = cupy.ndarray(out_shape, dtype=x.dtype)
        if y.size:
            k = self._row_kernel(R.MAX_POOL_BLOCKS, x.dtype, ("max_pool_blocks",))
            self._call(k, (-(-y.size // 256),), (256,),
                       (np.int64(y.size), *map(np.int64, geometry), x, np.int64(0), y))
        return y

    def max_pool_blocks_backward(self, a: Array, best: Array, g: Array, kernel: tuple[int, ...]) -> Array:
        """One kernel (the shared ``row_kernels.MAX_POOL_BLOCKS_BACKWARD``: each block's winner found again,
        the whole block written) where the forward took its kernel; the generic loop otherwise."""
        dims = R.pool_blocks_dims(a.shape, kernel, a.dtype, g.dtype)
        if dims is None:
            return super().max_pool_blocks_backward(a, best, g, kernel)
        self._use()
        _, geometry = dims
        x = cupy.ascontiguousarray(self._arr(a))
        gy = cupy.ascontiguousarray(self._arr(g))
        gx = cupy.ndarray(x.shape, dtype=x.dtype)
        if gy.size:
            k = self._row_kernel(R.MAX_POOL_BLOCKS_BACKWARD, x.dtype, ("max_pool_blocks_backward",))
            self._call(k, (-(-gy.size // 256),), (256,),
                       (np.int64(gy.size), *map(np.int64, geometry), x, np.int64(0), gy, np.int64(0), gx))
        return gx  # an empty g tiles an empty input: nothing to write

    def _gru_kernel(self, backward: bool, arrays: tuple, biases: tuple) -> tuple | None:
        """``Backend.gru_cell``/``gru_cell_backward`` as one kernel (the shared ``row_kernels.gru_cell_*``) for
        the operands ``row_kernels.gru_layout`` takes; None otherwise (the primitives run)."""
        layout = R.gru_layout(arrays, biases, backward)
        if layout is None:
            return None
        rows, hidden, result_shapes = layout
        self._use()
        # a pending sum of two gradient contributions is added (and written out) by the backward kernel itself
        reads, g_sum = self._gradient_reads(arrays[0], backward and rows * hidden > 0)
        ops = list(map(self._arr, (*reads, *arrays[1:], *[b for b in biases if b is not None])))
        if not all(map(_c_contiguous, ops)):
            ops = [cupy.ascontiguousarray(a) for a in ops]
        dtype = ops[0].dtype
        outs = tuple([cupy.ndarray(s, dtype) for s in result_shapes])
        if rows * hidden:
            spec = R.gru_kernel(biases, backward, g_sum is not None)
            # each operand's buffer, then its offset (0: CuPy's pointer has it), built in C calls
            args = [np.int64(rows * hidden), np.int64(hidden), *itertools.chain.from_iterable(zip(ops, _ZEROS))]
            written = outs if g_sum is None else (*outs, g_sum.value)
            self._call(self._row_kernel(spec, dtype, (spec.name,)), (-(-rows * hidden // 256),), (256,),
                       (*args, *written))
            if g_sum is not None:
                self._realized_into(arrays[0], g_sum)
        return outs

    def _strip_launch(self, spec: R.RowKernel | Callable[[], R.RowKernel], key: tuple, dtype: np.dtype,
                      rows: int, cols: int, sums: int, args: list[Any]) -> Any:
        """Run a column-sum kernel (``row_kernels._strip_sums``) over ``(rows, cols)``: the ``(sums, cols)``
        sums, the row chunks' partial sums added by a second launch when there are several."""
        kernel = self._row_kernel(spec, dtype, key)
        layout = self._strip_layouts.get((kernel, rows, cols))
        if layout is None:
            # the registers a computed input needs may allow fewer than STRIP_GROUP threads per block (a driver
            # query, once per kernel and shape like the rest of the layout)
            limit = 1 << (min(R.STRIP_GROUP, kernel.max_threads_per_block).bit_length() - 1)
            width, lanes, parts, chunk = R.param_grad_layout(rows, cols, limit)
            strips = -(-cols // width)
            sizes = tuple(np.int64(v) for v in (rows, cols, chunk, width, strips, parts * cols))
            if len(self._strip_layouts) >= PLAN_MEMO:
                self._strip_layouts.clear()
            layout = self._strip_layouts[(kernel, rows, cols)] = ((parts * strips,), (width * lanes,), parts, sizes)
        grid, block, parts, sizes = layout
        partial = cupy.ndarray((sums, parts, cols), dtype=dtype)
        self._call(kernel, grid, block, (*sizes, *args, partial))
        return partial.reshape(sums, cols) if parts == 1 else self.sum(partial, (1,), False)

    def bias_grad(self, g: Array) -> Array:
        """One column-sum kernel (``row_kernels.column_sum``) for a float32/float64 ``g``, which computes a
        pending ``g`` itself and writes it out (``LazyEngine._row_input``); the generic default otherwise."""
        self._use()
        if g.dtype not in (K.F32, K.F64) or len(g.shape) != 2 or 0 in g.shape:
            return super().bias_grad(g)
        rows, cols = g.shape
        dtype = g.dtype
        computed = self._row_input(g, True)
        if computed is None:
            sums = self._strip_launch(R.column_sum, ("column_sum",), dtype, rows, cols, 1,
                                      [self._dense(g), np.int64(0)])
        else:
            flat, g_out = computed
            sums = self._strip_launch(lambda: R.column_sum(self._prologue(g)), ("column_sum", flat[0]), dtype,
                                      rows, cols, 1, [*self._prologue_args(flat), g_out.value])
            self._realized_into(g, g_out)
        return sums.reshape(cols)

    @staticmethod
    def _prologue_args(flat: tuple) -> list[Any]:
        """The kernel arguments of a computed input (``LazyEngine._row_input``'s ``flat``): each leaf with
        offset 0 (CuPy's pointer has it) and its two element strides, then the scalars."""
        args: list[Any] = []
        zero, i64 = np.int64(0), np.int64
        for leaf in flat[1]:
            value = leaf.value
            s0, s1 = value.strides  # a computed input is 2-d (``_row_input``)
            item = value.itemsize
            args += [value, zero, i64(s0 // item), i64(s1 // item)]
        return args + list(map(_value, flat[2]))

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   residual: Array | None = None) -> tuple:
        """Optional fused composite (see ``Backend.layer_norm``): one kernel, one thread block per row, for
        float32/float64 ``x`` with ``weight``/``bias`` of its dtype; the generic default otherwise (16-bit
        inputs come back here in float32). A pending ``x`` (a linear layer's bias and activation) is computed
        by the kernel itself (``LazyEngine._row_input``), which writes it out for the backward: no kernel of
        its own first. A ``residual`` is added by the kernel as it writes ``y``."""
        self._use()
        dtype = x.dtype
        if dtype not in (K.F32, K.F64) or len(x.shape) != 2 or (weight is not None and weight.dtype != dtype) or (
                bias is not None and bias.dtype != dtype) or (
                residual is not None and (residual.dtype != dtype or tuple(residual.shape) != tuple(x.shape))):
            return super().layer_norm(x, weight, bias, eps, residual)
        rows, cols = x.shape
        computed = self._row_input(x, rows * cols > 0)
        pending = x
        zero = np.int64(0)
        args: list[Any] = [np.int64(cols)]
        if computed is None:
            args += [self._dense(x), zero]
        else:
            flat, x_out = computed
            args += self._prologue_args(flat)
        dense = self._dense
        w = None if weight is None else dense(weight)
        b = None if bias is None else dense(bias)
        res = None if residual is None else dense(residual)
        y = cupy.ndarray((rows, cols), dtype=dtype)
        mean, rstd = cupy.ndarray((rows,), dtype=dtype), cupy.ndarray((rows,), dtype=dtype)
        if rows and cols:
            for t in (w, b, res):
                if t is not None:
                    args += [t, zero]
            args += [y, mean, rstd, dtype.type(eps)]
            has = (w is not None, b is not None)
            added = res is not None
            if computed is None:
                kernel = self._row_kernel(lambda: R.layer_norm_forward(*has, None, added), dtype,
                                          ("layer_norm", *has, added))
            else:
                kernel = self._row_kernel(lambda: R.layer_norm_forward(*has, self._prologue(pending), added),
                                          dtype, ("layer_norm", *has, added, flat[0]))
                args.append(x_out.value)
            self._call(kernel, (rows,), (max(32, R.row_group(cols, R.MAX_GROUP)),), args)
            if computed is not None:
                self._realized_into(pending, x_out)
        return y, mean, rstd

    def layer_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """Optional fused composite (see ``Backend.layer_norm_backward``): ``gx`` in one kernel (one thread
        block per row), ``gw``/``gb`` in one kernel of column sums (plus one sum of row chunks for many rows)."""
        self._use()
        if x.dtype not in (K.F32, K.F64) or len(x.shape) != 2 or g.dtype != x.dtype or mean.dtype != x.dtype or (
                weight is not None and weight.dtype != x.dtype):
            return super().layer_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        rows, cols = x.shape
        dtype = x.dtype
        # a pending sum of two gradient contributions is added (and written out) by the gx kernel itself
        reads, g_sum = self._gradient_reads(g, need_x and rows * cols > 0)
        dense = self._dense
        gs = list(map(dense, reads))
        x, mean, rstd = dense(x), dense(mean), dense(rstd)
        zero = np.int64(0)
        gx = gw = gb = None
        if need_x:
            gx = cupy.ndarray((rows, cols), dtype=dtype)
            if rows and cols:
                args: list[Any] = [np.int64(cols)]
                for a in gs:
                    args += [a, zero]
                args += [x, zero, mean, rstd]
                if weight is not None:
                    args += [dense(weight), zero]
                paired = g_sum is not None
                kernel = self._row_kernel(lambda: R.layer_norm_backward(weight is not None, paired), dtype,
                                          ("layer_norm_backward", weight is not None, paired))
                self._call(kernel, (rows,), (max(32, R.row_group(cols, R.MAX_GROUP)),),
                           (*args, gx, *([g_sum.value] if paired else [])))
        if g_sum is not None:
            self._realized_into(g, g_sum)
        g = gs[0] if g_sum is None else g_sum.value
        if need_w or need_b:
            if rows == 0:
                sums = cupy.zeros((2, cols), dtype=dtype)
            else:
                sums = self._strip_launch(R.LAYER_NORM_PARAM_GRADS, ("layer_norm_param_grads",), dtype, rows, cols,
                                          2, [g, zero, x, zero, mean, rstd])
            gw = _row_view(sums, 0) if need_w else None
            gb = _row_view(sums, 1) if need_b else None
        return gx, gw, gb

    # ----------------------------------------------------------------- linear algebra
    def _blas_handle(self) -> Cublas:
        if self._blas is None:
            self._blas = Cublas(cupy)
        return self._blas

    # ----------------------------------------------------------------- cuDNN (convolutions, attention)
    _CUDNN_TYPES = frozenset({np.dtype(np.float16), K.BF16, np.dtype(np.float32), np.dtype(np.float64)})

    def cudnn(self) -> cudnn_lib.Cudnn | None:
        """This device's cuDNN (see ``backends/cuda/cudnn.py``), or None when ``fg.backends.cudnn.enabled`` is
        False or the frontend is not installed (said once on stderr, with how to install it)."""
        if not flags.cudnn.enabled:
            return None
        if self._cudnn is None:
            if not cudnn_lib.is_available():
                cudnn_lib.note_once()
                return None
            self._use()
            self._cudnn = cudnn_lib.Cudnn(cupy, lambda: self.capturing)
        return self._cudnn

    def native_conv(self, dtype: np.dtype, nd: int) -> bool:
        """True where cuDNN is on, for 1-d to 3-d float16 / bfloat16 / float32 / float64 convolutions."""
        return np.dtype(dtype) in self._CUDNN_TYPES and 1 <= nd <= 3 and self.cudnn() is not None

    def _cudnn_conv(self, op: str, a: Any, b: Any, out_shape: tuple, stride, padding, dilation, fallback: Any,
                    bias: Any = None) -> Any:
        self._use()
        a, b = cupy.ascontiguousarray(self._arr(a)), cupy.ascontiguousarray(self._arr(b))
        if bias is not None:
            bias = cupy.ascontiguousarray(self._arr(bias))
        try:
            return self.cudnn().conv(op, a, b, tuple(out_shape), stride, padding, dilation, flags.cudnn.allow_tf32,
                                     bias)
        except BackendError:
            if self.capturing:
                raise
            return fallback()  # a problem cuDNN has no engine for (float64 3-d, say): the generic composite

    @staticmethod
    def _conv_out_shape(x: Array, w: Array, stride, padding, dilation) -> tuple[int, ...]:
        """``(N, C_out, *out)`` of a convolution of ``x`` by ``w`` (``Backend.conv_forward``'s formula)."""
        return (x.shape[0], w.shape[0]) + tuple(
            (s + 2 * p - d * (k - 1) - 1) // st + 1
            for s, p, k, st, d in zip(x.shape[2:], padding, w.shape[2:], stride, dilation))

    def conv_forward(self, x: Array, w: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int) -> Array:
        """cuDNN's ``conv_fprop`` (see ``Backend.conv_forward``)."""
        out = self._conv_out_shape(x, w, stride, padding, dilation)
        return self._cudnn_conv("fprop", x, w, out, stride, padding, dilation,
                                lambda: super(CupyBackend, self).conv_forward(x, w, stride, padding, dilation,
                                                                              groups))

    def conv_forward_bias(self, x: Array, w: Array, b: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                          dilation: tuple[int, ...], groups: int) -> Array:
        """cuDNN's ``conv_fprop`` and ``bias`` as one graph (see ``Backend.conv_forward_bias``): the bias is added
        as the convolution's results are written (a 128x64x32x32 input, 128 3x3 filters, float32 with TF32:
        0.174 ms against 0.222 ms for the convolution and a separate add; with a ReLU after it the separate
        passes cost 0.319 ms). 1-d and 2-d convolutions (the ones checked against torch with a fused graph);
        3-d ones, and problems cuDNN has no fused engine for, run the convolution and the generic add."""
        def generic() -> Array:
            return super(CupyBackend, self).conv_forward_bias(x, w, b, stride, padding, dilation, groups)

        if x.ndim > 4:
            return generic()
        out = self._conv_out_shape(x, w, stride, padding, dilation)
        return self._cudnn_conv("fprop", x, w, out, stride, padding, dilation, generic, b)

    def conv_input_grad(self, g: Array, w: Array, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """cuDNN's ``conv_dgrad`` (see ``Backend.conv_input_grad``)."""
        return self._cudnn_conv("dgrad", g, w, x_shape, stride, padding, dilation,
                                lambda: super(CupyBackend, self).conv_input_grad(g, w, x_shape, stride, padding,
                                                                                 dilation, groups))

    def conv_weight_grad(self, x: Array, g: Array, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """cuDNN's ``conv_wgrad`` (see ``Backend.conv_weight_grad``)."""
        return self._cudnn_conv("wgrad", x, g, w_shape, stride, padding, dilation,
                                lambda: super(CupyBackend, self).conv_weight_grad(x, g, w_shape, stride, padding,
                                                                                  dilation, groups))

    _SDPA_TYPES = frozenset({np.dtype(np.float16), K.BF16})

    def native_sdpa(self, dtype: np.dtype, head_dim: int) -> bool:
        """True for float16/bfloat16 with a head size cuDNN's fused attention takes (a multiple of 8, <= 128)."""
        return (np.dtype(dtype) in self._SDPA_TYPES and head_dim % 8 == 0 and 8 <= head_dim <= 128
                and self.cudnn() is not None)

    def sdpa_forward(self, q: Array, k: Array, v: Array, scale: float, causal: bool) -> tuple[Array, Array]:
        """cuDNN's fused attention forward (see ``Backend.sdpa_forward``)."""
        self._use()
        q, k, v = (cupy.ascontiguousarray(self._arr(a)) for a in (q, k, v))
        return self.cudnn().sdpa_forward(q, k, v, None, scale, causal)

    def sdpa_backward(self, q: Array, k: Array, v: Array, out: Array, dout: Array, stats: Array, scale: float,
                      causal: bool) -> tuple[Array, Array, Array]:
        """cuDNN's fused attention backward (see ``Backend.sdpa_backward``)."""
        self._use()
        q, k, v, out, dout, stats = (cupy.ascontiguousarray(self._arr(a)) for a in (q, k, v, out, dout, stats))
        return self.cudnn().sdpa_backward(q, k, v, out, dout, stats, None, scale, causal)

    def matmul(self, a: Array, b: Array) -> Array:
        self._use()
        a, b = self._arr(a), self._arr(b)
        if a.dtype != b.dtype:
            raise BackendError(f"matmul: operands have dtypes {a.dtype} and {b.dtype}; cast one first")
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError("matmul: operands must have at least one axis (use mul for scalars)")
        if a.dtype not in GEMM_TYPES:
            if self.capturing:
                raise FlowError(
                    f"matmul of {a.dtype} inside fg.capture: only float matmul is captured (cuBLAS)"
                )
            return cupy.matmul(a, b)
        plan = self._gemm_plan(a, b) if a.ndim == 2 and b.ndim == 2 else None
        if plan is not None:  # the common 2-d case: the layout worked out on an earlier call
            out = cupy.ndarray(plan[:2], a.dtype)
            self._planned_gemm(plan, a, b, out, False)
            return out
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        if squeeze_a:
            a = a[None, :]
        if squeeze_b:
            b = b[:, None]
        m, k, n, batch = matmul_dims(a.shape, b.shape)
        out = cupy.ndarray(batch + (m, n), a.dtype)
        if out.size:
            if k == 0:
                out.fill(0)
            else:
                nb = math.prod(batch)
                op_a = self._gemm_operand(a, batch, m, k)
                op_b = self._gemm_operand(b, batch, k, n)
                self._blas_handle().gemm(a.dtype, m, n, k, op_a[0], op_b[0], out.data.ptr, nb)
                del op_a, op_b  # the staged copies live until the call is enqueued
        if squeeze_a or squeeze_b:
            out = out.reshape(out.shape[:-2] + (() if squeeze_a else (m,)) + (() if squeeze_b else (n,)))
        return out

    accumulates_in_place = True

    def matmul_accumulate(self, dst: Array, a: Array, b: Array) -> Array:
        """``Backend.matmul_accumulate``: one cuBLAS GEMM with ``beta = 1`` into ``dst`` (its pending sum, if
        any, run first) when ``dst`` is a contiguous float array of the product's shape and ``a``, ``b`` are 2-d
        of its dtype; the generic ``add_into(dst, matmul(a, b))`` otherwise."""
        self._use()
        if self._gemm_accumulate(dst, self._arr(a), self._arr(b)):
            return dst
        return super().matmul_accumulate(dst, a, b)

    def bias_grad_accumulate(self, dst: Array, g: Array) -> Array:
        """``Backend.bias_grad_accumulate``: ``dst += ones(1, rows) @ g``, one GEMM with ``beta = 1`` (the ones
        row kept per length and dtype; outside a CUDA graph's recording, where it is made), for a float
        ``g`` ``(rows, cols)``; the generic default otherwise."""
        self._use()
        gv = self._arr(g)
        if gv.ndim == 2 and gv.dtype in GEMM_TYPES:
            key = (gv.shape[0], gv.dtype)
            ones = self._ones_rows.get(key)
            if ones is None and not self.capturing:
                if len(self._ones_rows) >= 16:
                    self._ones_rows.clear()
                ones = self._ones_rows[key] = cupy.ones((1, gv.shape[0]), gv.dtype)
            if ones is not None and self._gemm_accumulate(dst, ones, gv):
                return dst
        return super().bias_grad_accumulate(dst, g)

    def _gemm_accumulate(self, dst: Array, av: Any, bv: Any) -> bool:
        """``dst += av @ bv`` by one cuBLAS GEMM with ``beta = 1`` where ``av``, ``bv`` are 2-d float arrays of
        ``dst``'s dtype and ``dst`` (its pending sum run first) is contiguous with the product's size; False
        (nothing done) otherwise."""
        dims = accumulate_dims(dst, av, bv) if av.dtype in GEMM_TYPES else None
        if dims is None:
            return False
        out = self._arr(dst)
        if not out.flags.c_contiguous:
            return False
        self._flush_readers(id(out.data.mem))  # pending expressions reading the old sum run first
        plan = self._gemm_plan(av, bv)
        if plan is not None:
            self._planned_gemm(plan, av, bv, out, True)
            return True
        m, k, n = dims
        op_a = self._gemm_operand(av, (), m, k)
        op_b = self._gemm_operand(bv, (), k, n)
        self._blas_handle().gemm(av.dtype, m, n, k, op_a[0], op_b[0], out.data.ptr, 1, accumulate=True)
        del op_a, op_b  # the staged copies live until the call is enqueued
        return True

    #: 2-d GEMM layouts kept by ``_gemm_plan`` (the dict is emptied when full).
    GEMM_PLANS = 1024

    def _gemm_plan(self, a: Any, b: Any) -> tuple | None:
        """``(m, n, run)`` of the 2-d float GEMM ``a @ b`` when both operands are read in place (no staging copy)
        and the product is not empty: what ``matmul`` and ``_gemm_operand`` work out from the shapes and
        strides, and the cuBLAS call with it bound (``Cublas.planned_2d``'s ``run``), kept per layout so a
        repeated call (every step of a training loop) only reads its pointers (about 10 us of Python a call on
        an H200's host). None otherwise."""
        key = (a.shape, a.strides, b.shape, b.strides, a.dtype)
        plan = self._gemm_plans.get(key, self._gemm_plans)  # the dict itself marks a layout not seen yet
        if plan is not self._gemm_plans:
            return plan
        plan = None
        (m, k), (k2, n) = a.shape, b.shape
        if a.dtype == b.dtype and a.dtype in GEMM_TYPES and k == k2 and m * n * k:
            (_, a_ld, a_col, _), a_base = self._gemm_operand(a, (), m, k)
            (_, b_ld, b_col, _), b_base = self._gemm_operand(b, (), k, n)
            if a_base is a and b_base is b:
                plan = (m, n, self._blas_handle().planned_2d(a.dtype, m, n, k, a_ld, a_col, b_ld, b_col))
        if len(self._gemm_plans) >= self.GEMM_PLANS:
            self._gemm_plans.clear()
        self._gemm_plans[key] = plan
        return plan

    def _planned_gemm(self, plan: tuple, a: Any, b: Any, out: Any, accumulate: bool) -> None:
        """``out = a @ b`` (``+=`` with ``accumulate``) through the layout ``plan`` of ``_gemm_plan``."""
        plan[2](a.data.ptr, b.data.ptr, out.data.ptr, accumulate)

    @staticmethod
    def _gemm_operand(x: Any, batch: Shape, rows: int, cols: int) -> tuple[tuple[int, int, bool, int], Any]:
        """``((pointer, ld, column-major?, batch stride), keep-alive array)`` of one matmul operand."""
        item = x.dtype.itemsize
        nbx = x.ndim - 2
        own_batch = math.prod(x.shape[:-2])
        if own_batch == 1:
            mat = x.reshape(x.shape[-2:]) if nbx else x
            batch_stride = 0
        else:
            mat = None
        if mat is None:
            # Batched: one uniform batch stride over the (broadcast) batch axes, else a contiguous copy.
            full = cupy.broadcast_to(x, batch + (rows, cols))
            strides = [s // item for s in full.strides[:-2]]
            dims = list(batch)
            step = None
            ok = all(s % item == 0 for s in full.strides)
            for d in range(len(dims) - 1, -1, -1):
                if dims[d] == 1:
                    continue
                if step is None:
                    step = strides[d]
                    expect = step * dims[d]
                elif strides[d] != expect:
                    ok = False
                    break
                else:
                    expect *= dims[d]
            if not ok or step is None or step <= 0:
                full = cupy.ascontiguousarray(full)
                step = rows * cols
            x3 = full
            batch_stride = step
            sr, sc = x3.strides[-2] // item, x3.strides[-1] // item
            base = x3
        else:
            sr, sc = mat.strides[0] // item, mat.strides[1] // item
            base = mat
        ok_div = all(s % item == 0 for s in base.strides[-2:])
        if ok_div and (cols == 1 or sc == 1) and (rows == 1 or sr >= max(cols, 1)):
            ld = sr if rows > 1 else max(cols, 1)
            col_major = False
        elif ok_div and (rows == 1 or sr == 1) and (cols == 1 or sc >= max(rows, 1)):
            ld = sc if cols > 1 else max(rows, 1)
            col_major = True
        else:
            base = cupy.ascontiguousarray(base)
            if batch_stride:
                batch_stride = rows * cols
            ld, col_major = max(cols, 1), False
        return (base.data.ptr, ld, col_major, batch_stride), base

    # ----------------------------------------------------------------- indexing
    def _offsets(self, a: Any, axis: int, index: Any) -> Any:
        """Element offsets into ``a`` (contiguous) for ``take_along_axis(a, index, axis)``; negatives wrap."""
        n = a.shape[axis]
        item = a.dtype.itemsize
        index = index.astype(_I64, copy=False)
        off = cupy.where(index < 0, index + n, index) * (a.strides[axis] // item)
        for d, size in enumerate(index.shape):
            if d != axis:
                shape = [1] * index.ndim
                shape[d] = size
                off = off + cupy.arange(size, dtype=_I64).reshape(shape) * (a.strides[d] // item)
        return off

    def argsort(self, a: Array, axis: int, descending: bool) -> Array:
        self._use()
        return super().argsort(self._arr(a), axis, descending)

    def gather(self, a: Array, axis: int, index: Array) -> Array:
        self._use()
        a = cupy.ascontiguousarray(self._arr(a))
        index = self._arr(index)
        if index.ndim != a.ndim or not 0 <= axis < max(a.ndim, 1):
            raise ShapeError(f"gather: index shape {index.shape} and axis {axis} do not fit array shape {a.shape}")
        if index.size == 0:
            return cupy.empty(index.shape, dtype=a.dtype)
        if a.ndim == 0:
            return a.copy()
        return a.reshape(-1).take(self._offsets(a, axis, index))

    def _scatter(self, a: Any, axis: int, index: Any, src: Any, accumulate: bool) -> Any:
        self._use()
        out = cupy.array(self._arr(a), order="C", copy=True)
        index = self._arr(index)
        if index.size == 0:
            return out
        if out.ndim == 0:
            raise ShapeError("scatter: needs an array with at least one axis")
        if isinstance(src, SCALAR_TYPES):
            values = cupy.full(index.shape, src, dtype=out.dtype)
        else:
            values = cupy.broadcast_to(self._arr(src).astype(out.dtype, copy=False), index.shape)
        import cupyx

        offsets = self._offsets(out, axis, index).reshape(-1)
        flat = out.reshape(-1)
        values = values.reshape(-1)
        if accumulate:
            cupyx.scatter_add(flat, offsets, values)
            return out
        # Duplicate targets: the last write in index order wins, as in NumPy (a GPU store order is arbitrary).
        winner = cupy.full(flat.size, -1, dtype=np.int32)
        cupyx.scatter_max(winner, offsets, cupy.arange(offsets.size, dtype=np.int32))
        written = winner >= 0
        picked = values.take(cupy.maximum(winner, 0))
        return cupy.where(written, picked, flat).reshape(out.shape)

    # ----------------------------------------------------------------- runtime
    def synchronize(self) -> None:
        self._no_capture("synchronize()")
        self._device.synchronize()

    def memory_stats(self) -> dict[str, int]:
        pool = cupy.get_default_memory_pool()
        with self._device:
            used = int(pool.used_bytes())
            return {
                "allocated": used,
                "reserved": int(pool.total_bytes()),
                "peak": max(_PEAK.get(self.index, 0), used),
                "total": self.total_memory,
            }

    def reset_peak_memory_stats(self) -> None:
        """Start the peak (``memory_stats()['peak']``) again from the bytes allocated now."""
        with self._device:
            _PEAK[self.index] = int(cupy.get_default_memory_pool().used_bytes())

    supports_graph_capture = True

    def graph_session(self) -> Any:
        """A :class:`~flowgraph.backends.cuda.graph.GraphSession` for ``fg.capture`` on this device."""
        from .graph import GraphSession

        return GraphSession(self)

    def __repr__(self) -> str:
        return f"<CupyBackend {self.device} ({self.device_name})>"


def _one_device() -> None:
    """``CupyBackend._use`` where the process sees one device, always current."""


def _device_count() -> int:
    """Visible CUDA devices; 0 (never raises) without a driver or GPU."""
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver, no device, broken install: no CUDA devices
        return 0


def _realize_inherited() -> None:
    """Give every public ArrayBackend method that CupyBackend does not override a realizing wrapper.

    A primitive added to ArrayBackend later then still receives ``cupy.ndarray`` s, never LazyArrays. Methods
    the lazy engine defines (``concatenate``) are overrides too: a wrapper of ArrayBackend's would shadow them.
    """
    import functools

    def unwrap(backend: CupyBackend, x: Any) -> Any:
        if type(x) is LazyArray:
            return backend._arr(x)
        if isinstance(x, (list, tuple)) and any(type(v) is LazyArray for v in x):
            return type(x)(backend._arr(v) for v in x)
        return x

    overriding = CupyBackend.__mro__[:CupyBackend.__mro__.index(ArrayBackend)]
    for name, fn in vars(ArrayBackend).items():
        if name.startswith("_") or not callable(fn) or any(name in vars(cls) for cls in overriding):
            continue

        def make(fn: Any) -> Any:
            @functools.wraps(fn)
            def method(self: CupyBackend, *args: Any, **kwargs: Any) -> Any:
                self._use()
                return fn(self, *(unwrap(self, a) for a in args), **{k: unwrap(self, v) for k, v in kwargs.items()})

            return method

        setattr(CupyBackend, name, make(fn))


_realize_inherited()
