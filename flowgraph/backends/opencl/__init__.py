"""The OpenCL backend: flowgraph's primitives on PyOpenCL with generated, fused, cached kernels.

``flowgraph.backends.registry`` imports this package only when an ``opencl`` device is first used (or
listed), so ``import flowgraph`` never imports pyopencl. Without pyopencl, ``OpenCLBackend.list_devices()``
returns ``[]`` and constructing the backend raises a BackendError saying how to install it.
"""

from .array import CLArray
from .backend import OpenCLBackend
from .runtime import compile_stats, list_devices

__all__ = ["CLArray", "OpenCLBackend", "compile_stats", "list_devices"]
