"""Precision and algorithm flags with PyTorch's names and defaults: ``fg.backends.cuda.matmul.allow_tf32``,
``fg.backends.cudnn.*`` and ``fg.set_float32_matmul_precision``.

    import flowgraph as fg
    fg.backends.cuda.matmul.allow_tf32 = True        # float32 matmuls on CUDA may use TF32 tensor cores
    fg.set_float32_matmul_precision("high")          # the same switch, PyTorch's other spelling
    fg.backends.cudnn.allow_tf32 = True; fg.backends.cudnn.benchmark = True   # accepted (see below)

``matmul.allow_tf32`` (default ``False``, as PyTorch since 1.12) is read by the CUDA backend at every float32
matmul: when true, cuBLAS computes with ``CUBLAS_COMPUTE_32F_FAST_TF32`` (inputs rounded to TF32's 10-bit
mantissa, float32 accumulation: about 1e-3 relative error, several times the speed on Ampere and later);
when false, exact float32 (``CUBLAS_COMPUTE_32F``). Inside ``fg.capture`` the value at capture time is recorded
with the step. It affects only CUDA float32 matmuls (``@``, ``Linear``, the matmul of a convolution, attention);
the CPU and OpenCL always compute float32 matmuls exactly.

``float32_matmul_precision`` is the same setting in PyTorch's words: ``"highest"`` is ``allow_tf32 = False``;
``"high"`` and ``"medium"`` are ``allow_tf32 = True`` (PyTorch's ``"medium"`` may also use bfloat16 internally;
flowgraph uses TF32 for both).

``cudnn``: read by the CUDA backend's cuDNN path (``flowgraph/backends/cuda/cudnn.py``, NVIDIA's
``nvidia-cudnn-frontend``, the ``cuda`` extra). ``enabled`` (default ``True``) sends convolutions and float16 /
bfloat16 attention through cuDNN where it is installed; ``False`` runs flowgraph's own kernels. ``allow_tf32``
(default ``True``, as PyTorch) lets float32 convolutions use TF32 tensor cores; ``False`` deselects the engines
cuDNN marks as tensor-core ones for float32, as PyTorch does. The OpenCL backend reads it too, as the switch for
float32 convolutions: on an NVIDIA GPU of compute capability 8.0 or later its implicit-GEMM kernels then multiply
on the tensor cores in TF32 (``flowgraph/backends/opencl/conv.py``); elsewhere OpenCL convolutions are exact.
``benchmark`` (default ``False``) is kept for scripts written for PyTorch: cuDNN's heuristics pick the engine
either way. ``deterministic`` (default ``False``) is kept but does not change the CUDA ``scatter_add``
(embedding and indexing backward), whose atomic float additions may sum in a varying order.
"""

from __future__ import annotations

from ..errors import FlowError

_PRECISIONS = ("highest", "high", "medium")
_STATE = {"float32_matmul_precision": "highest"}


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise FlowError(f"{name} must be True or False, got {value!r}")
    return value


def set_float32_matmul_precision(precision: str) -> None:
    """PyTorch's ``torch.set_float32_matmul_precision``: ``"highest"`` (exact float32, the default), ``"high"``
    or ``"medium"`` (both let CUDA float32 matmuls use TF32; same as ``fg.backends.cuda.matmul.allow_tf32``)."""
    if precision not in _PRECISIONS:
        raise FlowError(f"set_float32_matmul_precision: precision must be one of {list(_PRECISIONS)}, got "
                        f"{precision!r}")
    _STATE["float32_matmul_precision"] = precision


def get_float32_matmul_precision() -> str:
    """The current float32 matmul precision: ``"highest"``, ``"high"`` or ``"medium"``."""
    return _STATE["float32_matmul_precision"]


def tf32_matmul_allowed() -> bool:
    """Whether float32 matmuls may use TF32 now (what the CUDA backend reads at each matmul)."""
    return _STATE["float32_matmul_precision"] != "highest"


class CudaMatmulFlags:
    """``fg.backends.cuda.matmul``: ``allow_tf32`` (default ``False``), PyTorch's ``torch.backends.cuda.matmul``."""

    __slots__ = ()

    @property
    def allow_tf32(self) -> bool:
        """Whether CUDA float32 matmuls may use TF32 tensor cores (``True`` unless the precision is "highest")."""
        return tf32_matmul_allowed()

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        set_float32_matmul_precision("high" if _check_bool("fg.backends.cuda.matmul.allow_tf32", value)
                                     else "highest")

    def __setattr__(self, name: str, value: object) -> None:
        if name != "allow_tf32":
            raise FlowError(f"fg.backends.cuda.matmul has no setting {name!r}; the one setting is allow_tf32")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"fg.backends.cuda.matmul(allow_tf32={self.allow_tf32})"


class CudnnFlags:
    """``fg.backends.cudnn``: PyTorch's cuDNN flags (see the module docstring for what each one changes).
    ``allow_tf32`` defaults to ``True``, ``benchmark`` and ``deterministic`` to ``False``, ``enabled`` to
    ``True``, as in PyTorch."""

    _DEFAULTS = {"allow_tf32": True, "benchmark": False, "deterministic": False, "enabled": True}

    def __init__(self) -> None:
        self.__dict__.update(self._DEFAULTS)

    def __setattr__(self, name: str, value: object) -> None:
        if name not in self._DEFAULTS:
            raise FlowError(f"fg.backends.cudnn has no setting {name!r}; the settings are {sorted(self._DEFAULTS)}")
        self.__dict__[name] = _check_bool(f"fg.backends.cudnn.{name}", value)

    @staticmethod
    def is_available() -> bool:
        """Whether cuDNN's frontend and libraries load in this process (``torch.backends.cudnn.is_available``);
        ``fg.backends.cudnn.unavailable_reason()`` says why not."""
        from .cuda import cudnn as lib

        return lib.is_available()

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when cuDNN is available, otherwise the import or library error that keeps it off."""
        from .cuda import cudnn as lib

        return lib.unavailable_reason()

    def __repr__(self) -> str:
        return "fg.backends.cudnn(" + ", ".join(f"{k}={self.__dict__[k]}" for k in self._DEFAULTS) + ")"


#: ``fg.backends.cuda.matmul``
cuda_matmul = CudaMatmulFlags()
#: ``fg.backends.cudnn``
cudnn = CudnnFlags()

__all__ = ["CudaMatmulFlags", "CudnnFlags", "cuda_matmul", "cudnn", "get_float32_matmul_precision",
           "set_float32_matmul_precision", "tf32_matmul_allowed"]
