"""Automatic mixed precision: ``fg.autocast(dtype)``.

Inside the context, matrix products (``matmul`` and everything built on it: ``Linear``, convolutions,
attention) run in the low-precision ``dtype`` (float16 or bfloat16), while reductions (sum, mean, var),
softmax/log-softmax and therefore losses and normalisation statistics run in float32, as PyTorch's
autocast does. Parameters stay float32: the casts are recorded ops, so gradients reach them in float32.
Use ``optim.GradScaler`` with float16 to keep small gradients from underflowing.

    with fg.autocast(fg.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
"""

from __future__ import annotations

from ..autograd.grad_mode import STATE
from ..errors import FlowError
from .dtype import DType, as_dtype, float32

_LOW = ("float16", "bfloat16")


class autocast:  # noqa: N801 - PyTorch's name
    """Context manager (and decorator) enabling mixed precision for the ops inside it."""

    def __init__(self, dtype: DType | str = "float16", enabled: bool = True, device_type: str | None = None):
        dt = as_dtype(dtype)
        if dt.name not in _LOW:
            raise FlowError(f"autocast: dtype must be float16 or bfloat16, got {dt.name}")
        self.dtype = dt if enabled else None

    def __enter__(self) -> autocast:
        self._prev = STATE.autocast
        STATE.autocast = self.dtype
        return self

    def __exit__(self, *exc) -> None:
        STATE.autocast = self._prev

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.dtype or "float16", enabled=self.dtype is not None):
                return fn(*args, **kwargs)

        return wrapper


def is_autocast_enabled() -> bool:
    """Whether an ``autocast`` context is active in this thread."""
    return STATE.autocast is not None


def low_precision_inputs(*tensors):
    """Cast floating tensors to the autocast dtype (matmul-like ops call this when autocast is on)."""
    dt = STATE.autocast
    return tuple(t.to(dt) if t.dtype.is_floating_point and t.dtype is not dt else t for t in tensors)


def full_precision_input(t):
    """Cast a float16/bfloat16 tensor to float32 (reductions, softmax and losses under autocast)."""
    if STATE.autocast is not None and t.dtype.name in _LOW:
        return t.to(float32)
    return t
