"""The CUDA backend on CuPy (``"cuda:N"``): fused elementwise kernels, own cuBLAS, device RNG, CUDA graphs.

Importing this package imports CuPy; the registry does that only when a ``cuda`` device is first used.
"""

from .backend import CupyBackend, LazyArray

__all__ = ["CupyBackend", "LazyArray"]
