"""flowgraph's own cuBLAS handle, through ctypes on the libcublas that CuPy loaded.

CuPy refuses cuBLAS while a stream is capturing a CUDA graph. A handle of our own, with its stream and
workspace set before each call, records into the graph and replays correctly, so every float matmul of
the CUDA backend (eager and captured alike) goes through :class:`Cublas`.

Row-major ``C = A @ B`` is computed as the column-major ``C^T = B^T A^T``: a row-major operand is a
column-major transpose for free, and a transposed view (a column-major operand) is passed with ``op T``.

float32 GEMMs follow ``fg.backends.cuda.matmul.allow_tf32`` (``flowgraph.backends.flags``), read at each call:
exact float32 (``cublasSgemmStridedBatched`` in the default math mode, which never uses TF32) when false, and
``cublasGemmStridedBatchedEx`` with ``CUBLAS_COMPUTE_32F_FAST_TF32`` when true.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import numpy as np

from ...errors import BackendError
from ..flags import tf32_matmul_allowed
from .kernels import BF16, F16, F32, F64

_OP_N, _OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16F, _CUDA_R_16BF = 0, 1, 2, 14
#: cublasComputeType_t: float32 accumulation; the same with inputs rounded to TF32 on tensor cores.
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1
#: Workspace given to cuBLAS (NVIDIA recommends 32 MiB on Hopper).
WORKSPACE_BYTES = 32 << 20

_LIB: list[Any] = []


def _find_library() -> Any:
    """libcublas as loaded by CuPy (so the versions agree), else the usual sonames."""
    if _LIB:
        return _LIB[0]
    candidates: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                name = os.path.basename(path)
                if name.startswith("libcublas.so") and path not in candidates:
                    candidates.append(path)
    except OSError:
        pass
    try:
        from cuda import pathfinder  # type: ignore[import-not-found]

        loaded = pathfinder.load_nvidia_dynamic_lib("cublas")
        candidates.append(loaded.abs_path)
    except Exception:  # noqa: BLE001 - optional helper; the sonames below still apply
        pass
    found = ctypes.util.find_library("cublas")
    candidates += [c for c in ("libcublas.so.13", "libcublas.so.12", found or "libcublas.so") if c]
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            lib.cublasCreate_v2  # noqa: B018 - probe the symbol
        except (OSError, AttributeError) as exc:
            errors.append(f"{path}: {exc}")
            continue
        _declare(lib)
        _LIB.append(lib)
        return lib
    tried = "; ".join(errors)
    raise BackendError(f"could not load libcublas for flowgraph's own cuBLAS handle; tried {tried}")


def _declare(lib: Any) -> None:
    c_int, c_ll, vp = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    common = [vp, c_int, c_int, c_int, c_int, c_int]
    lib.cublasSgemmStridedBatched.argtypes = common + [
        vp, vp, c_int, c_ll, vp, c_int, c_ll, vp, vp, c_int, c_ll, c_int,
    ]
    lib.cublasDgemmStridedBatched.argtypes = lib.cublasSgemmStridedBatched.argtypes
    lib.cublasGemmStridedBatchedEx.argtypes = common + [
        vp, vp, c_int, c_int, c_ll, vp, c_int, c_int, c_ll, vp, vp, c_int, c_int, c_ll, c_int, c_int, c_int,
    ]
    for name in ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
                 "cublasSgemmStridedBatched", "cublasDgemmStridedBatched", "cublasGemmStridedBatchedEx"):
        getattr(lib, name).restype = c_int


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BackendError(f"cuBLAS {what} failed with status {status}")


#: matmul dtypes this handle computes: dtype -> cudaDataType.
GEMM_TYPES = {F32: _CUDA_R_32F, F64: _CUDA_R_64F, F16: _CUDA_R_16F, BF16: _CUDA_R_16BF}


def compute_type(dtype: np.dtype) -> int:
    """The ``cublasComputeType_t`` of a float16/bfloat16/float32 GEMM through ``cublasGemmStridedBatchedEx``:
    float32 accumulation, with TF32 inputs for float32 when ``allow_tf32`` is on."""
    return _COMPUTE_32F_FAST_TF32 if dtype == F32 and tf32_matmul_allowed() else _COMPUTE_32F


class Cublas:
    """One cuBLAS handle for one device, bound to CuPy's current stream at each call."""

    def __init__(self, cupy: Any):
        self.cupy = cupy
        self.lib = _find_library()
        handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self._stream = -1
        self._one = {F32: ctypes.c_float(1.0), F64: ctypes.c_double(1.0)}
        self._zero = {F32: ctypes.c_float(0.0), F64: ctypes.c_double(0.0)}
        self._current_stream = cupy.cuda.get_current_stream

    def _bind_stream(self) -> None:
        ptr = self._current_stream().ptr
        if ptr != self._stream:
            # cublasSetStream resets the workspace to the default pool: set ours again after it.
            _check(self.lib.cublasSetStream_v2(self.handle, ptr), "cublasSetStream")
            _check(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, WORKSPACE_BYTES),
                   "cublasSetWorkspace")
            self._stream = ptr

    def gemm(
        self,
        dtype: np.dtype,
        m: int,
        n: int,
        k: int,
        a: tuple[int, int, bool, int],
        b: tuple[int, int, bool, int],
        c_ptr: int,
        batch: int,
        accumulate: bool = False,
    ) -> None:
        """Row-major ``C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]`` (``C +=`` with ``accumulate``).

        ``a`` and ``b`` are ``(pointer, leading dimension, column-major?, batch stride)`` in elements;
        ``C`` is contiguous.
        """
        self._bind_stream()
        a_ptr, lda, a_col, a_stride = a
        b_ptr, ldb, b_col, b_stride = b
        op_b = _OP_T if b_col else _OP_N
        op_a = _OP_T if a_col else _OP_N
        tf32 = dtype == F32 and tf32_matmul_allowed()
        if (dtype == F32 and not tf32) or dtype == F64:
            fn = self.lib.cublasSgemmStridedBatched if dtype == F32 else self.lib.cublasDgemmStridedBatched
            status = fn(
                self.handle, op_b, op_a, n, m, k, ctypes.byref(self._one[dtype]), b_ptr, ldb, b_stride,
                a_ptr, lda, a_stride, ctypes.byref((self._one if accumulate else self._zero)[dtype]), c_ptr, n,
                m * n, batch,
            )
        else:
            t = GEMM_TYPES[dtype]
            status = self.lib.cublasGemmStridedBatchedEx(
                self.handle, op_b, op_a, n, m, k, ctypes.byref(self._one[F32]), b_ptr, t, ldb, b_stride,
                a_ptr, t, lda, a_stride, ctypes.byref((self._one if accumulate else self._zero)[F32]), c_ptr, t, n,
                m * n, batch,
                compute_type(dtype), _GEMM_DEFAULT,
            )
        if status:  # the message is formatted only on failure (str(dtype) alone costs microseconds per call)
            _check(status, f"gemm ({dtype}, m={m}, n={n}, k={k}, batch={batch})")

    def planned_2d(self, dtype: np.dtype, m: int, n: int, k: int, lda: int, a_col: bool, ldb: int,
                   b_col: bool) -> Any:
        """``run(a_ptr, b_ptr, c_ptr, accumulate)``: ``gemm`` of one 2-d layout (no batch) with everything but
        the three pointers and beta worked out once: the routine, the operations, the scalars' references and
        the argument list around the pointers. A training step repeats its few layouts at every call
        (``CupyBackend._gemm_plan`` keeps the ``run`` per layout): about 90 bytecodes of argument work a GEMM
        in ``gemm``, a dozen here. A float32 GEMM while TF32 is allowed goes through ``gemm`` (read per call,
        as there)."""
        def general(a_ptr: int, b_ptr: int, c_ptr: int, accumulate: bool) -> None:
            self.gemm(dtype, m, n, k, (a_ptr, lda, a_col, 0), (b_ptr, ldb, b_col, 0), c_ptr, 1, accumulate)

        if dtype != F32 and dtype != F64:
            return general
        fn = self.lib.cublasSgemmStridedBatched if dtype == F32 else self.lib.cublasDgemmStridedBatched
        one, zero = ctypes.byref(self._one[dtype]), ctypes.byref(self._zero[dtype])
        head = (self.handle, _OP_T if b_col else _OP_N, _OP_T if a_col else _OP_N, n, m, k, one)
        tail = (n, m * n, 1)
        bind, tf32_allowed, exact = self._bind_stream, tf32_matmul_allowed, dtype == F64

        def run(a_ptr: int, b_ptr: int, c_ptr: int, accumulate: bool) -> None:
            if not exact and tf32_allowed():
                general(a_ptr, b_ptr, c_ptr, accumulate)
                return
            bind()
            status = fn(*head, b_ptr, ldb, 0, a_ptr, lda, 0, one if accumulate else zero, c_ptr, *tail)
            if status:
                _check(status, f"gemm ({dtype}, m={m}, n={n}, k={k})")

        return run

    def __del__(self) -> None:
        try:
            self.lib.cublasDestroy_v2(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
