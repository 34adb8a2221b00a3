"""The CUDA backend on CuPy (``"cuda:N"``): fused elementwise kernels, own cuBLAS, device RNG, CUDA graphs.

Importing this package is cheap and never imports CuPy: it holds ``matmul`` (``fg.backends.cuda.matmul``, the
TF32 flag, PyTorch's ``torch.backends.cuda.matmul``; see ``flowgraph.backends.flags``). ``CupyBackend`` and
``LazyArray`` import CuPy on first access; the registry does that only when a ``cuda`` device is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..flags import cuda_matmul as matmul


def __getattr__(name: str) -> Any:
    if name in ("CupyBackend", "LazyArray"):
        return getattr(importlib.import_module(".backend", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CupyBackend", "LazyArray", "matmul"]
