"""``fg.capture``: record a whole training step once and replay it as one CUDA graph.

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    graphed = fg.capture(step, x0, y0)   # 3 real warm-up steps on (x0, y0), then the recording
    for x, y in batches:
        loss = graphed(x, y)             # inputs copied into static buffers, one graph launch
    print(loss.item())

How it works: the step runs ``warmup`` times eagerly on a side stream (kernels compile, the optimizer
creates its state, a private memory pool fills), then once more while the stream records a CUDA graph
(forward, backward and optimizer step; nothing runs then). A replay copies the new inputs into the static
input tensors and launches the graph; the returned tensors are the same static outputs every time,
overwritten by each replay.

Rules a captured step must follow (flowgraph raises a FlowError where it can tell):

* No host reads or host data inside the step (``.item()``, ``.numpy()``, ``print(t)``, ``if t:``,
  ``fg.tensor(host_data)``): there is no value while recording.
* Python runs once, at capture: Python numbers are frozen into the graph. Keep what changes per step in
  device tensors, updated in place. flowgraph's SGD, Adam, AdamW and RMSprop do that by themselves inside
  ``capture``: step counts become device tensors and each group's ``lr`` a device scalar refreshed from
  ``group["lr"]`` before every replay (so lr schedulers work); other optimizers raise a FlowError.
* Parameters and optimizer state must be updated in place (``copy_``, ``add_``): the graph writes the
  addresses it saw while recording.
* Shapes and dtypes of the inputs are fixed; a replay with other shapes raises.

On a device without graph support (``cpu``, ``opencl``) ``capture`` runs the same warm-up steps and
returns a step that runs eagerly with the same calling convention, so code written for it runs
everywhere and trains the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .autograd.grad_mode import STATE
from .errors import FlowError
from .tensor.tensor import Tensor, _wrap


def _tensors_in(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors_in(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors_in(x)]
    return []


class CapturedStep:
    """A step function recorded once and replayed with new inputs (see :func:`capture`)."""

    def __init__(self, step_fn: Callable[..., Any], example_inputs: tuple[Any, ...], warmup: int = 3):
        if not callable(step_fn):
            raise FlowError(f"capture: step_fn must be callable, got {type(step_fn).__name__}")
        if warmup < 1:
            raise FlowError(
                f"capture: warmup must be >= 1 (kernels compile and state appears there), got {warmup}"
            )
        tensors = [x for x in example_inputs if isinstance(x, Tensor)]
        if not tensors:
            raise FlowError(
                "capture: pass at least one example input tensor (it fixes the device and shapes)"
            )
        self.step_fn = step_fn
        self.backend = tensors[0]._backend
        for t in tensors:
            if t._backend is not self.backend:
                raise FlowError(
                    f"capture: example inputs live on {self.backend.device} and {t.device}; "
                    "put them on one device"
                )
        bk = self.backend
        #: The static input tensors (own storage); replays copy new inputs into them.
        self.static_inputs = tuple(
            _wrap(bk.assign(bk.full(x.shape, 0, x._data.dtype), x._data), bk) if isinstance(x, Tensor) else x
            for x in example_inputs
        )
        for s, x in zip(self.static_inputs, example_inputs):
            if isinstance(x, Tensor) and x.requires_grad:
                s.requires_grad_(True)
        #: Whether the step replays as a CUDA graph (False: the device has none and the step runs eagerly).
        self.captured = bk.supports_graph_capture
        self.session = bk.graph_session() if self.captured else None
        self.outputs: Any = None
        if not self.captured:
            # No graphs here: the same real warm-up steps, so a run does not depend on the device.
            for _ in range(warmup):
                self.outputs = step_fn(*self.static_inputs)
            return
        #: Callables run before every replay (optimizers refresh their device learning rates here).
        self.pre_replay: list[Callable[[], None]] = []
        previous_hooks = STATE.capture_hooks
        STATE.capture_hooks = self.pre_replay
        try:
            with self.session.warmup():
                for _ in range(warmup):
                    step_fn(*self.static_inputs)
            with self.session.capture():
                outputs = step_fn(*self.static_inputs)
                for t in _tensors_in(outputs):
                    t._data = bk.contiguous(t._data)  # finish pending fused work inside the graph
        except FlowError:
            raise
        except Exception as exc:
            raise FlowError(
                f"capture: the step failed while its CUDA graph was recorded ({type(exc).__name__}: {exc}); "
                "the step must run on the device without host reads (see flowgraph.runtime)"
            ) from exc
        finally:
            STATE.capture_hooks = previous_hooks
        self.outputs = outputs

    def _copy_inputs(self, inputs: tuple[Any, ...]) -> None:
        if len(inputs) != len(self.static_inputs):
            raise FlowError(f"captured step takes {len(self.static_inputs)} inputs, got {len(inputs)}")
        bk = self.backend
        for i, (static, new) in enumerate(zip(self.static_inputs, inputs)):
            if not isinstance(static, Tensor):
                if new is not static and new != static:
                    raise FlowError(
                        f"captured step: input {i} was the constant {static!r} at capture, is {new!r} now; "
                        "non-tensor inputs are frozen into the graph"
                    )
                continue
            if isinstance(new, Tensor):
                if new._backend is not bk:
                    raise FlowError(f"captured step: input {i} is on {new.device}, the graph on {bk.device}")
                data = new._data
            else:
                data = bk.from_host(np.asarray(new, dtype=static._data.dtype))
            if tuple(data.shape) != tuple(static.shape) or data.dtype != static._data.dtype:
                raise FlowError(
                    f"captured step: input {i} has shape {tuple(data.shape)} and dtype {data.dtype}, the "
                    f"graph was recorded for {tuple(static.shape)} {static._data.dtype}; capture again for "
                    "other shapes"
                )
            if data is not static._data:
                bk.assign(static._data, data)

    def __call__(self, *inputs: Any) -> Any:
        """Copy ``inputs`` into the static inputs and run the step; returns the (static) outputs."""
        self._copy_inputs(inputs)
        if not self.captured:
            return self.step_fn(*self.static_inputs)
        for hook in self.pre_replay:
            hook()
        self.session.replay()
        return self.outputs

    def __repr__(self) -> str:
        mode = "CUDA graph" if self.captured else "eager"
        return f"<CapturedStep {getattr(self.step_fn, '__name__', 'step')} on {self.backend.device} ({mode})>"


def capture(step_fn: Callable[..., Any], *example_inputs: Any, warmup: int = 3) -> CapturedStep:
    """Record ``step_fn(*example_inputs)`` (forward, backward, optimizer step) as one replayable CUDA graph.

    The first ``warmup`` calls are real, eager steps on the example inputs; the recording then runs
    nothing. Call the result with new inputs of the same shapes and dtypes; it returns ``step_fn``'s
    outputs, the same tensors each time (read or clone them before the next call). See the module
    documentation for the rules a captured step follows. On devices without CUDA graphs the step runs
    eagerly.
    """
    return CapturedStep(step_fn, example_inputs, warmup=warmup)


__all__ = ["CapturedStep", "capture"]
