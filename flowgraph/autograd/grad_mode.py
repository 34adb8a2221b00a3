"""Gradient-recording switches: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``detect_anomaly``.

The flags live on one module-level object read on every op's hot path (an attribute read). Like PyTorch's,
they are thread-local in effect: each switch restores the previous value on exit.
"""

from __future__ import annotations

import functools
import threading


class _GradState(threading.local):
    """Per-thread switches read by every op."""

    def __init__(self) -> None:
        self.enabled = True
        self.anomaly = False
        self.autocast = None  # the low-precision DType inside fg.autocast(...), else None
        # Inside fg.capture's warm-up and recording on a graph-capable device: a list collecting callables
        # to run before every replay (optimizers register "copy this Python lr to its device scalar").
        self.capture_hooks = None
        # While fg.jit records a step's backend calls (cpu, opencl): optimizer and GradScaler steps become
        # host units, whose Python runs again on every replay (see flowgraph.optim.optimizer.replayed_unit).
        self.host_units = False


STATE = _GradState()


class _Switch:
    """Base of the context managers/decorators that set a flag and restore it."""

    _attr = "enabled"
    _value = True

    def __enter__(self):
        self._prev = getattr(STATE, self._attr)
        setattr(STATE, self._attr, self._value)
        return self

    def __exit__(self, *exc) -> None:
        setattr(STATE, self._attr, self._prev)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_Switch):  # noqa: N801 - PyTorch's name
    """Context manager/decorator: ops inside record no graph (inference, optimizer updates)."""

    _value = False


class enable_grad(_Switch):  # noqa: N801
    """Context manager/decorator: turn recording back on inside a ``no_grad`` block."""

    _value = True


class set_grad_enabled(_Switch):  # noqa: N801
    """Set recording on or off: a plain call (``fg.set_grad_enabled(False)``), a context manager
    (``with fg.set_grad_enabled(False): ...``) or a decorator (``@fg.set_grad_enabled(False)``), as in PyTorch."""

    def __init__(self, mode: bool):
        self._value = bool(mode)
        self._prev = STATE.enabled
        STATE.enabled = self._value  # the plain-call form takes effect at once

    def __call__(self, fn):
        STATE.enabled = self._prev  # used as a decorator: only calls of fn switch the mode
        mode = self._value

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper

    def __enter__(self):
        STATE.enabled = self._value
        return self

    def __exit__(self, *exc) -> None:
        STATE.enabled = self._prev


class detect_anomaly(_Switch):  # noqa: N801
    """Context manager: check every op's forward output and every backward gradient for NaN/inf and raise
    ``fg.AnomalyError`` naming the op (and, for backward, the forward op whose gradient went bad)."""

    _attr = "anomaly"
    _value = True


def is_grad_enabled() -> bool:
    """Whether ops currently record the graph."""
    return STATE.enabled
