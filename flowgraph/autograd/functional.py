"""``fg.autograd.grad``: gradients of outputs with respect to chosen inputs, without touching ``.grad``."""

from __future__ import annotations

from ..errors import FlowError
from .node import run_backward


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool = False):
    """Return ``d(outputs)/d(inputs)`` as a tuple (PyTorch's ``torch.autograd.grad``)."""
    from ..tensor import Tensor, ones_like

    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    gs = []
    for o, g in zip(outputs, grad_outputs):
        if not o.requires_grad:
            raise FlowError("autograd.grad: an output does not require grad (it is not connected to any input)")
        if g is None:
            if o.numel() != 1:
                raise FlowError(f"autograd.grad: grad_outputs is required for a non-scalar output of shape {o.shape}")
            g = ones_like(o)
        gs.append(g)
    if retain_graph is None:
        retain_graph = create_graph
    result = run_backward(outputs, gs, retain_graph, create_graph, capture=inputs, allow_unused=allow_unused)
    return tuple(result)
