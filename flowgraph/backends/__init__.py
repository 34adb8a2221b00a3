"""Backends: the primitive protocol (``base.Backend``), the NumPy/CuPy array backend, OpenCL, the registry, and
PyTorch's precision flags (``fg.backends.cuda.matmul.allow_tf32``, ``fg.backends.cudnn``; see ``flags``)."""

from . import cuda  # cheap: the CUDA package imports CuPy only when its backend is first used
from .base import Backend
from .flags import cudnn, get_float32_matmul_precision, set_float32_matmul_precision
from .registry import available_devices, get_backend, parse_device, register_backend, seed_all

__all__ = ["Backend", "available_devices", "cuda", "cudnn", "get_backend", "get_float32_matmul_precision",
           "parse_device", "register_backend", "seed_all", "set_float32_matmul_precision"]
