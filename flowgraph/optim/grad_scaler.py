"""``GradScaler``: dynamic loss scaling for mixed-precision training (PyTorch's ``torch.amp.GradScaler``).

Multiply the loss by a large scale before ``backward()`` so small float16 gradients do not flush to zero;
unscale the gradients before the optimizer uses them; skip the step when any gradient overflowed (inf/NaN)
and lower the scale; raise it again after ``growth_interval`` clean steps::

    scaler = optim.GradScaler()
    for x, y in batches:
        opt.zero_grad()
        with fg.autocast(fg.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)                       # optional: e.g. to clip the true gradients
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)                           # skipped if a gradient is inf/NaN
        scaler.update()

The scale, the growth counter and the inf flags are device tensors updated with tensor ops; ``step()``
reads one flag back to the host (as PyTorch's does). Inside ``fg.capture`` it reads nothing: the step runs
and is undone on the device where a gradient overflowed, so a captured mixed-precision step keeps skipping
bad steps on every replay. It works on every backend and with float32 too.
"""

from __future__ import annotations

from typing import Any

from ..autograd.grad_mode import STATE, no_grad
from ..errors import FlowError
from ..tensor import Tensor, float32, full, int32, stack, where
from .optimizer import Optimizer, replayed_unit

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Dynamic loss scaler with PyTorch's arguments and defaults.

    ``enabled=False`` turns every method into a pass-through (``scale`` returns its input, ``step`` just
    calls ``optimizer.step()``), so one training loop serves both precisions. ``device`` is accepted for
    PyTorch compatibility; the scale lives on the device of the first tensor passed to :meth:`scale`.
    """

    def __init__(self, device: str | None = None, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if enabled:
            if growth_factor <= 1.0:
                raise FlowError(f"GradScaler: growth_factor must be > 1.0, got {growth_factor}")
            if not 0.0 < backoff_factor < 1.0:
                raise FlowError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
            if not isinstance(growth_interval, int) or growth_interval <= 0:
                raise FlowError(f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}")
            if not init_scale > 0:
                raise FlowError(f"GradScaler: init_scale must be > 0, got {init_scale}")
        self._device = device
        self._enabled = enabled
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._scale: Tensor | None = None
        self._growth_tracker: Tensor | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ scaling
    def _lazy_init(self, device: str) -> None:
        self._scale = full((), self._init_scale, dtype=float32, device=device)
        self._growth_tracker = full((), self._init_growth_tracker, dtype=int32, device=device)

    def scale(self, outputs: Any) -> Any:
        """Multiply a tensor (or a nested list/tuple of tensors) by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise FlowError(f"GradScaler.scale: expected a Tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    def _state(self, optimizer: Optimizer) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer), {"stage": _READY, "found_inf_per_device": {}})

    def _check_scale(self, where: str) -> Tensor:
        if self._scale is None:
            raise FlowError(f"GradScaler.{where}: no scale yet; call scaler.scale(loss).backward() first")
        return self._scale

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and record whether any is inf/NaN.

        Call at most once per optimizer between ``update()`` calls, and before ``step()``.
        """
        if not self._enabled:
            return
        if STATE.host_units:  # inside fg.jit's recording on cpu/opencl: replayed with its Python
            params = _params(optimizer)
            if params:
                replayed_unit(params[0]._backend, params, lambda: self.unscale_(optimizer))
                return
        state = self._state(optimizer)
        if state["stage"] is _UNSCALED:
            raise FlowError("GradScaler.unscale_() has already been called on this optimizer since the last update()")
        if state["stage"] is _STEPPED:
            raise FlowError("GradScaler.unscale_() is being called after step(); call it before scaler.step()")
        scale = self._check_scale("unscale_")
        with no_grad():
            inv_scale = scale.double().reciprocal().float()
            flags: dict[str, list[Tensor]] = {}
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype.name == "float16":
                        raise FlowError("GradScaler: attempting to unscale float16 gradients; keep the "
                                        "parameters in float32 (autocast computes in float16 for you)")
                    flags.setdefault(g.device, []).append(g.isfinite().all())
                    g.mul_(inv_scale.to(g.device))
            found = {dev: stack(fs).logical_not().any().float() for dev, fs in flags.items()}
        if not found:  # no gradients: record a clean flag so step() can proceed as PyTorch does
            found = {scale.device: full((), 0.0, dtype=float32, device=scale.device)}
        state["found_inf_per_device"] = found
        state["stage"] = _UNSCALED

    def step(self, optimizer: Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (if not done yet) and run ``optimizer.step()`` unless a gradient was inf/NaN.

        Returns what ``optimizer.step`` returned, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise FlowError("GradScaler.step: closures are not supported while the scaler is enabled")
        if STATE.host_units:  # inside fg.jit's recording on cpu/opencl: the inf check runs on every replay
            params = _params(optimizer)
            if params:
                return replayed_unit(params[0]._backend, params, lambda: self.step(optimizer, *args, **kwargs))
        state = self._state(optimizer)
        if state["stage"] is _STEPPED:
            raise FlowError("GradScaler.step() has already been called since the last update()")
        if state["stage"] is _READY:
            self.unscale_(optimizer)
        flags = list(state["found_inf_per_device"].values())
        found = flags[0] if len(flags) == 1 else stack([f.to(flags[0].device) for f in flags]).sum()
        result = None
        if STATE.capture_hooks is not None:
            result = self._masked_step(optimizer, found, args, kwargs)
        elif not found.item():  # the one host read per step
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    @staticmethod
    def _masked_step(optimizer: Optimizer, found: Tensor, args: tuple, kwargs: dict) -> Any:
        """Inside ``fg.capture``: no host read. The step always runs, then every parameter and optimizer
        state tensor it touched is put back where ``found`` says a gradient overflowed (a device-side
        skip: two extra passes per tensor, replayed with the graph)."""
        tensors: list[Tensor] = []
        with no_grad():
            for p, st, _ in optimizer._prepared():  # state exists and step counts are device tensors now
                tensors.append(p)
                tensors += [v for v in st.values() if isinstance(v, Tensor)]
            saved = [t.clone() for t in tensors]
        result = optimizer.step(*args, **kwargs)
        with no_grad():
            for t, old in zip(tensors, saved):
                t.copy_(where(found.to(t.device) > 0, old, t))
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Adjust the scale: times ``backoff_factor`` if any step this iteration saw inf/NaN, times
        ``growth_factor`` after ``growth_interval`` clean iterations; or set it to ``new_scale``."""
        if not self._enabled:
            return
        scale = self._check_scale("update")
        if STATE.host_units:  # inside fg.jit's recording on cpu/opencl: replayed with its Python
            replayed_unit(scale._backend, [], lambda: self.update(new_scale))
            return
        tracker = self._growth_tracker
        with no_grad():
            if new_scale is not None:
                value = new_scale if isinstance(new_scale, Tensor) else full((), float(new_scale), dtype=float32,
                                                                            device=scale.device)
                scale.copy_(value)
            else:
                flags = [f.to(scale.device) for s in self._per_optimizer_states.values()
                         for f in s["found_inf_per_device"].values()]
                if not flags:
                    raise FlowError("GradScaler.update: no inf checks were recorded before this update; "
                                    "call scaler.step(optimizer) (or unscale_) first")
                found = stack(flags).sum() > 0
                grown = tracker + 1
                at_interval = grown == self._growth_interval
                bigger = scale * self._growth_factor
                new = where(found, scale * self._backoff_factor,
                            where(at_interval & bigger.isfinite(), bigger, scale))
                new_tracker = where(found | at_interval, tracker * 0, grown)
                scale.copy_(new)
                tracker.copy_(new_tracker)
        self._per_optimizer_states = {}

    # ------------------------------------------------------------------ accessors
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self) -> float:
        """The factor applied after ``growth_interval`` clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor."""
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        """The factor applied after a step with inf/NaN gradients."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor."""
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        """How many clean steps between growths."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval."""
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self._enabled

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, Any]:
        """``{"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}`` (empty when
        disabled), as PyTorch's."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state dict saved by :meth:`state_dict` (also PyTorch's GradScaler's)."""
        if not self._enabled:
            return
        if not state_dict:
            raise FlowError("GradScaler.load_state_dict: the state dict is empty, possibly because it was saved "
                            "from a disabled GradScaler")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            with no_grad():
                self._scale.fill_(self._init_scale)
                self._growth_tracker.fill_(self._init_growth_tracker)


def _params(optimizer: Optimizer) -> list[Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]
