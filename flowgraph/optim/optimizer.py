"""``Optimizer``: the base class every optimizer derives from (PyTorch's ``torch.optim.Optimizer`` surface).

An optimizer holds ``param_groups`` (a list of dicts: ``"params"`` plus that group's hyper-parameters) and
``state`` (a dict from parameter to that parameter's buffers). A user subclass is written as in PyTorch: its
``__init__`` calls ``super().__init__(params, defaults)`` and it overrides ``step(closure=None)``, reading
``self.param_groups``, ``self.state[p]`` and ``self.defaults`` (see :class:`Optimizer`).

flowgraph's own optimizers instead keep the base ``step()``, which walks the groups and, for every
parameter that requires grad and has a ``.grad``, calls the subclass's ``_update``. Updates are written as a
short, fixed sequence of whole-tensor ops under ``fg.no_grad()`` ending in one in-place write per buffer
(:func:`write_`), so a fusing backend can turn one parameter's step into one kernel.

Per-parameter scalars (step count, bias corrections) are Python floats computed in one small helper per
optimizer (``_scalars``). Under ``fg.capture`` on a device with CUDA graphs, the optimizers that set
``_capturable`` (SGD, Adam, AdamW, RMSprop) switch to device scalars instead: each parameter's step count
becomes a 0-d device tensor incremented in place, and each group's learning rate a device scalar that the
captured step refreshes from ``group["lr"]`` before every replay, so schedulers keep working on a captured
step. The same helpers compute the bias corrections with tensor ops then.
"""

from __future__ import annotations

import copy
import functools
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ..autograd.grad_mode import STATE, enable_grad, no_grad
from ..errors import FlowError
from ..tensor import Tensor, tensor
from ..tensor.tensor import _wrap

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


class _Required:
    """Marker for a hyper-parameter that has no default and must be given per group."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def write_(dst: Tensor, new: Tensor) -> Tensor:
    """Write ``new`` into ``dst``'s storage in place: the single write that ends a fused update.

    ``new`` was computed from ``dst`` under ``no_grad`` (same device and shape), so this is ``dst.copy_(new)``
    without its broadcasting and autograd bookkeeping: one backend ``assign`` and a version bump. It is the
    one place to change if updates should write differently (e.g. a fused kernel's output buffer).
    """
    data = new._data
    if data.dtype != dst._data.dtype:
        data = dst._backend.cast(data, dst._data.dtype)
    dst._data = dst._backend.assign(dst._data, data)
    dst._bump_version()
    return dst


def lerp(start: Tensor, end: Tensor, weight: float) -> Tensor:
    """``start + weight * (end - start)``, evaluated as PyTorch's ``lerp_`` is (same rounding)."""
    if weight < 0.5:
        return start + (end - start) * weight
    return end - (end - start) * (1 - weight)


def check_range(where: str, name: str, value: float, low: float, high: float | None = None,
                low_open: bool = False, high_open: bool = True) -> None:
    """Raise a FlowError naming ``name`` and the valid range when ``value`` is outside it."""
    bad = value < low or (low_open and value == low)
    if high is not None:
        bad = bad or value > high or (high_open and value == high)
    if bad or value != value:
        lo = "(" if low_open else "["
        if high is None:
            valid = f"{'>' if low_open else '>='} {low}"
        else:
            valid = f"in {lo}{low}, {high}{')' if high_open else ']'}"
        raise FlowError(f"{where}: invalid {name} {value!r}; it must be {valid}")


def check_betas(where: str, betas: tuple[float, float]) -> None:
    """Check a ``betas`` pair: each in [0, 1)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise FlowError(f"{where}: betas must be a pair (beta1, beta2), got {betas!r}")
    check_range(where, "betas[0] (beta1)", betas[0], 0.0, 1.0)
    check_range(where, "betas[1] (beta2)", betas[1], 0.0, 1.0)


StepHook = Callable[["Optimizer", tuple, dict], Any]


class StepHookHandle:
    """Returned by ``register_step_pre_hook`` / ``register_step_post_hook``: ``remove()`` unregisters the hook
    (PyTorch's ``RemovableHandle``; also a context manager that removes it on exit)."""

    _next_id = 0

    def __init__(self, store: dict[int, StepHook]) -> None:
        self._store = store
        self.id = StepHookHandle._next_id
        StepHookHandle._next_id += 1

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        self._store.pop(self.id, None)

    def __enter__(self) -> StepHookHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def replayed_unit(backend: Any, params: list[Tensor], run: Callable[[], Any]) -> Any:
    """Run ``run()`` now; while ``fg.jit`` records a step's backend calls, as one ``Backend.host_call``.

    An optimizer step decides with Python numbers (step counts, bias corrections, a scheduler's lr, a
    GradScaler's inf check) that a recording of backend calls would freeze. As a host unit its Python runs
    again on every replay, on the replay's gradients and parameters (inputs of the unit) and hands the
    gradients and parameters it leaves back to the recording (its outputs). Returns ``run()``'s result
    outside a recording, None inside one.
    """
    if not STATE.host_units:
        return run()
    with_grad = [p for p in params if p.grad is not None]
    n = len(with_grad)

    def unit(*arrays: Any) -> tuple:
        for p, a in zip(with_grad, arrays[:n]):
            if p.grad is None:
                p.grad = _wrap(a, backend)
            else:
                p.grad._data = a
        for p, a in zip(params, arrays[n:]):
            p._data = a
        previous, STATE.host_units = STATE.host_units, False
        try:
            run()
        finally:
            STATE.host_units = previous
        return tuple(p.grad._data for p in with_grad) + tuple(p._data for p in params)

    backend.host_call(unit, *[p.grad._data for p in with_grad], *[p._data for p in params])
    return None


def _with_step_hooks(step: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an optimizer's ``step`` so that the registered pre- and post-hooks run around it.

    Applied to ``Optimizer.step`` and to every subclass's own ``step`` (by ``__init_subclass__``), so a user
    subclass gets hooks without doing anything. A ``step`` that calls ``super().step()`` runs the hooks once:
    the inner call sees that hooks already ran for this step.
    """
    if getattr(step, "_runs_step_hooks", False):
        return step

    @functools.wraps(step)
    def stepped(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_inside_step"):
            return step(self, *args, **kwargs)
        if STATE.host_units:
            if args or kwargs:
                raise FlowError(f"{type(self).__name__}.step(closure) inside fg.jit: the closure's forward and "
                                "backward cannot be replayed from a host unit; call step(closure) outside the "
                                "jitted function, or compute the loss and backward in the step and call step()")
            params = [p for g in self.param_groups for p in g["params"]]
            if params:
                return replayed_unit(params[0]._backend, params, lambda: stepped(self))
        self._inside_step = True
        try:
            args = (self, *args)  # hooks see the optimizer as args[0], as in PyTorch
            for hook in list(self.__dict__.get("_optimizer_step_pre_hooks", {}).values()):
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise FlowError(f"{type(self).__name__}.step: a step pre-hook must return None or a "
                                        f"tuple (new_args, new_kwargs), got {type(result).__name__}")
                    args, kwargs = result
            out = step(*args, **kwargs)
            for hook in list(self.__dict__.get("_optimizer_step_post_hooks", {}).values()):
                hook(self, args, kwargs)
            return out
        finally:
            self._inside_step = False

    stepped._runs_step_hooks = True  # type: ignore[attr-defined]
    return stepped


class Optimizer:
    """Base class of all optimizers: param groups, per-parameter state, ``zero_grad``, ``step``, state dicts.

    ``params`` is an iterable of tensors, or of dicts each with a ``"params"`` entry and any per-group options
    (those not given take the optimizer's ``defaults``)::

        opt = optim.SGD([{"params": encoder.parameters()},
                         {"params": head.parameters(), "lr": 1e-2}], lr=1e-3, momentum=0.9)

    Subclass it as in PyTorch: call ``super().__init__(params, defaults)`` and override ``step``; hooks,
    ``zero_grad``, ``add_param_group`` and state dicts come from the base::

        class MySGD(optim.Optimizer):
            def __init__(self, params, lr=0.1, momentum=0.9):
                super().__init__(params, dict(lr=lr, momentum=momentum))

            @fg.no_grad()
            def step(self, closure=None):
                loss = None
                if closure is not None:
                    with fg.enable_grad():
                        loss = closure()
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        state = self.state[p]
                        if "momentum_buffer" not in state:
                            state["momentum_buffer"] = p.grad.clone()
                        else:
                            state["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
                        p.add_(state["momentum_buffer"], alpha=-group["lr"])
                return loss

    flowgraph's own optimizers keep the base ``step`` and define two hooks instead (nothing forces a user
    subclass to): ``_init_state(p, state, group)`` fills a new parameter's ``state`` dict, and
    ``_update(p, grad, state, group)`` makes one parameter's step in place (run under ``fg.no_grad()``).
    """

    #: State entries kept as Python floats (PyTorch keeps 0-d tensors): ``load_state_dict`` turns one-element
    #: tensors under these keys into floats. Each optimizer of flowgraph's names its own.
    _host_scalars: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give a subclass's own ``step`` the step hooks (``register_step_pre_hook`` and co.)."""
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__ and callable(cls.__dict__["step"]):
            cls.step = _with_step_hooks(cls.__dict__["step"])

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self._optimizer_step_pre_hooks: OrderedDict[int, StepHook] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, StepHook] = OrderedDict()
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise FlowError(f"{type(self).__name__}: params must be an iterable of tensors or of dicts, "
                            "got a single Tensor; wrap it in a list: [tensor]")
        if isinstance(params, set):
            raise FlowError(f"{type(self).__name__}: parameters must be an ordered collection (list, tuple, "
                            "generator), not a set: the order would change between runs")
        param_groups = list(params)
        if not param_groups:
            raise FlowError(f"{type(self).__name__}: got an empty parameter list; pass model.parameters() "
                            "or a list of param-group dicts")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore attributes (``copy.deepcopy``); PyTorch subclasses call ``super().__setstate__(state)``."""
        self.__dict__.update(state)
        self.__dict__.setdefault("_optimizer_step_pre_hooks", OrderedDict())
        self.__dict__.setdefault("_optimizer_step_post_hooks", OrderedDict())

    def __repr__(self) -> str:
        lines = [type(self).__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {key}: {group[key]}" for key in sorted(group) if key != "params")
        lines.append(")")
        return "\n".join(lines)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (e.g. a part of the model thawed later)."""
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise FlowError(f"{name}.add_param_group: expected a dict with a 'params' entry, "
                            f"got {type(param_group).__name__}")
        if "params" not in param_group:
            raise FlowError(f"{name}.add_param_group: the group dict has no 'params' entry (keys: "
                            f"{sorted(param_group)})")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise FlowError(f"{name}: parameters must be an ordered collection (list, tuple, generator), "
                            "not a set: the order would change between runs")
        else:
            params = list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise FlowError(f"{name}: param group entry {i} is a {type(p).__name__}, expected a Tensor")
            if not p.is_leaf:
                raise FlowError(f"{name}: param group entry {i} is not a leaf tensor (it was computed from "
                                "others); optimize leaves such as nn.Parameter or "
                                "tensor.detach().requires_grad_()")
        group = dict(param_group)
        group["params"] = params
        for key, default in self.defaults.items():
            if default is required and key not in group:
                raise FlowError(f"{name}: parameter group didn't specify a value of required option {key!r}")
            group.setdefault(key, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params):
            raise FlowError(f"{name}: a parameter appears twice in one group")
        if any(id(p) in seen for p in params):
            raise FlowError(f"{name}: some parameters appear in more than one parameter group")
        self._check_group(group)
        self.param_groups.append(group)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate a group's hyper-parameters (subclasses override)."""
        return  # an optional hook: the default does nothing

    # ------------------------------------------------------------------ stepping
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to ``None`` (default) or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with no_grad():
                        p.grad = p.grad.detach()
                        p.grad.zero_()

    def register_step_pre_hook(self, hook: StepHook) -> StepHookHandle:
        """Run ``hook(optimizer, args, kwargs)`` before every ``step``; it may return ``(new_args, new_kwargs)``
        to replace ``step``'s arguments. As in PyTorch, ``args`` starts with the optimizer itself
        (``(opt, closure)`` for ``opt.step(closure)``). Returns a handle whose ``remove()`` unregisters it."""
        handle = StepHookHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook: StepHook) -> StepHookHandle:
        """Run ``hook(optimizer, args, kwargs)`` after every ``step``. Returns a handle with ``remove()``."""
        handle = StepHookHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that requires grad and has a gradient; returns ``closure()``'s loss.

        Parameters whose ``.grad`` is None or that do not require grad (frozen) are skipped and get no state.
        Each parameter's update is the subclass's ``_update``; a user subclass overrides ``step`` itself.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            self._update_all(self._prepared())
        return loss

    def _update_all(self, items: Iterable[tuple[Tensor, dict[str, Any], dict[str, Any]]]) -> None:
        """Make the step of every ``(parameter, state, group view)`` of ``_prepared()``: ``_update`` on each by
        default; an optimizer whose backend updates many tensors in one launch (Adam's ``adam_step_multi``)
        overrides this to batch them."""
        for p, state, view in items:
            self._update(p, p.grad, state, view)

    def _prepared(self):
        """``(parameter, state, group view)`` for every parameter the next step updates, state initialised;
        inside ``fg.capture`` the view's ``lr`` and the state's step count are device tensors."""
        hooks = STATE.capture_hooks
        for group in self.param_groups:
            view = group
            for p in group["params"]:
                if p.grad is None or not p.requires_grad:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state, group)
                if hooks is not None:
                    view = self._device_scalars(group, state, p, hooks)
                yield p, state, view

    #: Whether ``_update`` works with device-tensor ``lr`` and step counts (needed inside ``fg.capture``).
    _capturable = False

    def _device_scalars(self, group: dict[str, Any], state: dict[str, Any], p: Tensor, hooks: list
                        ) -> dict[str, Any]:
        """For a captured step: move ``state["step"]`` to the device and give ``group`` a device ``lr``.

        Returns a view of ``group`` whose ``"lr"`` is a 0-d device tensor; a hook registered with the capture
        copies ``group["lr"]`` into it before every replay. Runs first during the capture's eager warm-up,
        so no host data enters the recording.
        """
        if not self._capturable:
            raise FlowError(
                f"{type(self).__name__} cannot run inside fg.capture: its update branches on step-dependent "
                "Python values; capture SGD, Adam, AdamW or RMSprop, or run this optimizer's step eagerly"
            )
        from ..tensor import full

        if "step" in state and not isinstance(state["step"], Tensor):
            state["step"] = full((), float(state["step"]), dtype="float32", device=p.device)
        cache = self.__dict__.setdefault("_device_lr", {})
        key = (id(group), p.device)
        lr = cache.get(key)
        if lr is None:
            lr = full((), float(group["lr"]), dtype="float32", device=p.device)
            cache[key] = lr

            last = [float(group["lr"])]

            def refresh(lr=lr, group=group, last=last) -> None:
                value = float(group["lr"])
                if value != last[0]:  # a fill is a kernel launch before every replay: only when it changed
                    lr.fill_(value)
                    last[0] = value

            hooks.append(refresh)
        return {**group, "lr": lr}

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """Fill ``state`` with the new parameter ``p``'s buffers."""
        return  # an optional hook: the default does nothing

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One parameter's update, in place under ``no_grad`` (each of flowgraph's optimizers defines it)."""
        name = type(self).__name__
        raise FlowError(f"{name}.step: {name} overrides neither step(closure=None) nor _update(); a subclass "
                        "of optim.Optimizer defines step() as in PyTorch, reading self.param_groups and "
                        "self.state[p]")

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's format: ``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``.

        Parameters are numbered in group order. Buffers are returned by reference, as PyTorch does.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                if id(p) not in index:
                    index[id(p)] = len(index)
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index and s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a dict made by :meth:`state_dict` (buffers are copied onto each parameter's device and dtype).

        Buffers given as other array types (a ``torch.Tensor`` state dict, NumPy arrays) are converted.
        """
        name = type(self).__name__
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise FlowError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups' "
                            "entries (as state_dict() returns)")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise FlowError(f"{name}.load_state_dict: the state dict has {len(saved_groups)} parameter "
                            "groups, "
                            f"this optimizer has {len(self.param_groups)}")
        id_map: dict[int, Tensor] = {}
        for i, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(mine["params"]) != len(saved["params"]):
                raise FlowError(f"{name}.load_state_dict: group {i} has {len(saved['params'])} parameters "
                                "in the "
                                f"state dict and {len(mine['params'])} here")
            for idx, p in zip(saved["params"], mine["params"]):
                id_map[idx] = p
        new_state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for idx, buffers in state_dict["state"].items():
            key = int(idx)
            if key not in id_map:
                raise FlowError(f"{name}.load_state_dict: state for parameter index {key}, "
                                "which no group lists")
            p = id_map[key]
            new_state[p] = {k: _load_value(k, v, p, self._host_scalars) for k, v in buffers.items()}
        new_groups = []
        for mine, saved in zip(self.param_groups, saved_groups):
            group = copy.deepcopy({k: v for k, v in saved.items() if k != "params"})
            group["params"] = mine["params"]
            new_groups.append(group)
        self.state = new_state
        self.param_groups = new_groups


Optimizer.step = _with_step_hooks(Optimizer.step)  # type: ignore[method-assign]  # subclasses: __init_subclass__


def _load_value(key: str, value: Any, p: Tensor, host_scalars: tuple[str, ...]) -> Any:
    """A state entry as this optimizer keeps it, with PyTorch's casting rules.

    Entries named in ``host_scalars`` become Python floats when they hold one number. Tensors (flowgraph's,
    torch's, NumPy arrays) are copied onto ``p``'s device; floating ones take ``p``'s dtype too, except
    ``step``. Lists, tuples and dicts (LBFGS's history) are converted item by item; anything else is copied.
    """
    if isinstance(value, (list, tuple)):
        return type(value)(_load_value(key, v, p, host_scalars) for v in value)
    if isinstance(value, dict):
        return {k: _load_value(k, v, p, host_scalars) for k, v in value.items()}
    if isinstance(value, Tensor):
        loaded = value
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor (torch is not a dependency)
        host = value.detach().cpu()
        loaded = tensor(host.float().numpy() if str(host.dtype) == "torch.bfloat16" else host.numpy())
    elif hasattr(value, "__array__") and not isinstance(value, (int, float)):
        loaded = tensor(value)
    else:
        return copy.deepcopy(value)
    if key in host_scalars and loaded.numel() == 1:
        return float(loaded.item())
    if loaded.dtype.is_floating_point and p.dtype.is_floating_point and key != "step":
        loaded = loaded.to(p.dtype)  # cast where the value is (a device without float64 never sees one)
    return loaded.to(p.device).clone()
