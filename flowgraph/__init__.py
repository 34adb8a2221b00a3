"""flowgraph: a deep-learning framework with its own tensor and autograd over NumPy, CuPy and OpenCL
backends, PyTorch-parity nn/optim, a fluent graph builder, a graph tree and a live training monitor.

    import flowgraph as fg
    from flowgraph import nn, optim

    x = fg.tensor([[1.0, 2.0]], requires_grad=True)
    y = (x * 2 + 1).relu().sum()
    y.backward()

Importing flowgraph is cheap: array libraries for accelerators (CuPy, PyOpenCL) and the monitor's web
stack load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import autograd
from .autograd import detect_anomaly, enable_grad, gradcheck, is_grad_enabled, no_grad, set_grad_enabled
from .backends import available_devices, get_backend, get_float32_matmul_precision, set_float32_matmul_precision
from .errors import (
    AnomalyError,
    BackendError,
    CheckpointError,
    FlowError,
    GradcheckError,
    IndexOutOfRangeError,
    PathError,
    ShapeError,
)
from .tensor import *  # noqa: F401,F403 - the functional API (fg.zeros, fg.matmul, ...)
from .tensor import Tensor, bfloat16, bool_, float16, float32, float64, int32, int64
from .tensor.dtype import DType

bool = bool_  # noqa: A001 - PyTorch spells it fg.bool
float = float32  # noqa: A001 - torch.float
double = float64
half = float16
long = int64

__version__ = "0.1.0"

# Names resolved on first access, so `import flowgraph` stays fast and light.
_LAZY: dict[str, tuple[str, str | None]] = {
    "nn": ("flowgraph.nn", None),
    "optim": ("flowgraph.optim", None),
    "builder": ("flowgraph.builder", None),
    "tree": ("flowgraph.tree", None),
    "monitor": ("flowgraph.monitor", None),
    "distributed": ("flowgraph.distributed", None),
    "utils": ("flowgraph.utils", None),
    "onnx": ("flowgraph.onnx", None),
    "FlowBuilder": ("flowgraph.builder", "FlowBuilder"),
    "MergeOp": ("flowgraph.builder", "MergeOp"),
    "Graph": ("flowgraph.builder", "Graph"),
    "PathKind": ("flowgraph.tree", "PathKind"),
    "migrate_checkpoint": ("flowgraph.tree", "migrate_checkpoint"),
    "LoadReport": ("flowgraph.tree", "LoadReport"),
    "MigrateReport": ("flowgraph.tree", "MigrateReport"),
    "Monitor": ("flowgraph.monitor", "Monitor"),
    "capture": ("flowgraph.runtime", "capture"),
    "jit": ("flowgraph.runtime", "jit"),
    "cuda": ("flowgraph.cuda", None),
    "accelerator": ("flowgraph.accelerator", None),
    "serialization": ("flowgraph.serialization", None),
    "save": ("flowgraph.serialization", "save"),
    "load": ("flowgraph.serialization", "load"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'flowgraph' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def device(spec: str) -> str:
    """Normalise a device spec: ``fg.device("cuda") == "cuda:0"``."""
    from .backends import parse_device

    return parse_device(spec)


__all__ = [
    "AnomalyError", "BackendError", "CheckpointError", "DType", "FlowError", "GradcheckError",
    "IndexOutOfRangeError", "PathError",
    "ShapeError", "Tensor", "autograd", "available_devices", "bfloat16", "bool", "detect_anomaly", "device",
    "enable_grad", "float16", "float32", "float64", "get_backend", "gradcheck", "int32", "int64",
    "is_grad_enabled", "no_grad", "set_grad_enabled",
    "get_float32_matmul_precision", "set_float32_matmul_precision",
]
