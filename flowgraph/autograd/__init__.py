"""Reverse-mode autograd: nodes, the backward engine, grad modes, ``grad`` and ``gradcheck``."""

from .function import Function, FunctionCtx
from .functional import grad
from .grad_mode import detect_anomaly, enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import gradcheck
from .node import AccumulateGrad, Node, run_backward

__all__ = [
    "AccumulateGrad", "Function", "FunctionCtx", "Node", "detect_anomaly",
    "enable_grad", "grad", "gradcheck", "is_grad_enabled", "no_grad", "run_backward",
    "set_grad_enabled",
]
