"""``Adam`` and ``AdamW``: adaptive moment estimation, with L2 or decoupled weight decay and AMSGrad."""

from __future__ import annotations

import math
from typing import Any

from ..tensor import Tensor, zeros_like
from .optimizer import Optimizer, ParamsT, check_betas, check_range, write_


def adam_scalars(group: dict[str, Any], step: float) -> tuple[float, float]:
    """Adam's per-step scalars ``(step_size, eps_hat)``: all the host-side math of one Adam step.

    ``p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)`` is computed as ``p -= m * step_size / (sqrt(v) + eps_hat)``
    with ``step_size = lr * sqrt(bc2) / bc1`` and ``eps_hat = eps * sqrt(bc2)`` (``bc = 1 - beta**step``):
    one array pass fewer.
    """
    beta1, beta2 = group["betas"]
    if isinstance(step, Tensor):  # device scalars inside fg.capture: the same math as tensor ops
        sqrt_bc2 = (1 - beta2 ** step).sqrt()
    else:
        sqrt_bc2 = math.sqrt(1 - beta2 ** step)
    return group["lr"] * sqrt_bc2 / (1 - beta1 ** step), group["eps"] * sqrt_bc2


def decayed_grad(p: Tensor, grad: Tensor, group: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """``(g, p_base)`` for the Adam family: ``g`` with maximize and L2 decay applied, ``p_base`` the parameter
    after decoupled decay (``p * (1 - lr * wd)``, an expression folded into the final write, not written)."""
    g = -grad if group["maximize"] else grad
    wd = group["weight_decay"]
    if wd == 0:
        return g, p
    if group.get("decoupled_weight_decay", False):
        return g, p * (1 - group["lr"] * wd)
    return g + p * wd, p


def update_moments(state: dict[str, Any], g: Tensor, betas: tuple[float, float]) -> tuple[Tensor, Tensor]:
    """Write the new first and second moments in place and return them::

        exp_avg    = beta1 * exp_avg    + (1 - beta1) * g
        exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    """
    beta1, beta2 = betas
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    m = write_(exp_avg, exp_avg * beta1 + g * (1 - beta1))
    v = write_(exp_avg_sq, exp_avg_sq * beta2 + (g * (1 - beta2)) * g)
    return m, v


class Adam(Optimizer):
    """PyTorch's ``torch.optim.Adam`` (same arguments, defaults and update)::

        g = -grad if maximize else grad
        p *= 1 - lr * weight_decay  (decoupled)   or   g += weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g        (v_max = max(v_max, v) with amsgrad)
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    The update is the backend's ``adam_step`` (``Backend.adam_step``), which writes ``p``, ``m`` and ``v`` in
    place (the decoupled decay is folded into the parameter's single write).

    >>> opt = optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    """

    _name = "Adam"
    _capturable = True
    _host_scalars = ("step",)

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        name = self._name
        check_range(name, "lr", group["lr"], 0.0)
        check_range(name, "eps", group["eps"], 0.0)
        check_betas(name, group["betas"])
        check_range(name, "weight_decay", group["weight_decay"], 0.0)

    def _init_state(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = 0.0
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_like(p)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One step through the backend's ``adam_step`` (``Backend.adam_step``: its generic default is the
        formula above in primitives; NumPy, CUDA and OpenCL override it with in-place passes or one kernel).

        Inside ``fg.capture`` ``step_size`` and ``eps_hat`` (and AdamW's decay with a device ``lr``) are 0-d
        device tensors; their arrays are passed.
        """
        state["step"] += 1
        buffers = (p, state["exp_avg"], state["exp_avg_sq"], state["max_exp_avg_sq"] if group["amsgrad"] else None)
        args, kwargs = _step_arguments(group, state["step"])
        new = p._backend.adam_step(p._data, grad._data, buffers[1]._data, buffers[2]._data, *args, **kwargs,
                                   v_max=None if buffers[3] is None else buffers[3]._data)
        for t, data in zip(buffers, new):
            if t is not None:
                t._data = data
                t._bump_version()

    def _update_all(self, items: Any) -> None:
        """The step of every prepared parameter, batched: the parameters of one group that share a dtype, a
        device and a step count go to one ``Backend.adam_step_multi`` call (one launch on CUDA, one per 8
        tensors on OpenCL), which gives each exactly what ``adam_step`` would.

        Inside ``fg.jit``/``fg.capture`` the step counts are 0-d device tensors. Their values are not read:
        each is paired with a host *shadow* count kept on every Python-level step. A replayed graph advances
        exactly the parameters that stepped when it was recorded, all by one, so equal shadows mean equal
        device counts at every replay; a batch's step scalars are computed once, from its first count. A
        device count with no shadow (state loaded since) takes ``_update`` alone, and so does every parameter
        of a subclass that overrides ``_update`` (its own update must run)."""
        if type(self)._update is not Adam._update:
            super()._update_all(items)
            return
        shadows = self.__dict__.setdefault("_shadow_steps", {})
        batches: dict[tuple, list] = {}
        on_device: list[dict[str, Any]] = []
        for p, state, group in items:
            step = state["step"]
            if isinstance(step, Tensor):
                shadow = shadows.get(id(state))
                if shadow is None or shadow[0] is not step:
                    self._update(p, p.grad, state, group)
                    continue
                on_device.append(state)
                count: Any = ("device", shadow[1] + 1)
                shadows[id(state)] = (step, shadow[1] + 1)
            else:
                state["step"] += 1
                count = state["step"]
            key = (id(group["params"]), id(p._backend), p._data.dtype, count)
            batches.setdefault(key, []).append((p, state, group))
        self._increment_device_steps(on_device)
        for batch in batches.values():
            group = batch[0][2]
            amsgrad = group["amsgrad"]
            args, kwargs = _step_arguments(group, batch[0][1]["step"])
            new = batch[0][0]._backend.adam_step_multi(
                [p._data for p, _, _ in batch], [p.grad._data for p, _, _ in batch],
                [s["exp_avg"]._data for _, s, _ in batch], [s["exp_avg_sq"]._data for _, s, _ in batch],
                *args, **kwargs, v_maxs=[s["max_exp_avg_sq"]._data for _, s, _ in batch] if amsgrad else None)
            new_p, new_m, new_v, new_vmax = new
            for i, (p, s, _) in enumerate(batch):  # the updated arrays (the same ones, where in place), versions bumped
                m, v = s["exp_avg"], s["exp_avg_sq"]
                p._data, m._data, v._data = new_p[i], new_m[i], new_v[i]
                p._bump_version()
                m._bump_version()
                v._bump_version()
                if amsgrad:
                    v_max = s["max_exp_avg_sq"]
                    v_max._data = new_vmax[i]
                    v_max._bump_version()

    def _increment_device_steps(self, states: list[dict[str, Any]]) -> None:
        """Add one to the device step counts of ``states``: one in-place add on a shared array of counts
        (``_device_scalars``) when every count of it steps, else one add per count (inside a captured step
        each add is a kernel: 28 of residual_tower's 245)."""
        arrays = self.__dict__.get("_step_arrays", {})
        done: set[int] = set()
        stepping = {id(s) for s in states}
        for state in states:
            if id(state) in done:
                continue
            found = arrays.get(id(state["step"]))
            if found is not None:
                counts, members = found
                if all(id(s) in stepping and s["step"] is view for s, view in members):
                    counts += 1  # every member's count, in place, in one launch
                    done.update(id(s) for s, _ in members)
                    continue
            state["step"] += 1  # in place, on the device
            done.add(id(state))

    def _device_scalars(self, group: dict[str, Any], state: dict[str, Any], p: Tensor, hooks: list
                        ) -> dict[str, Any]:
        """As ``Optimizer._device_scalars``; a step count moved to the device gets its host shadow (see
        ``_update_all``). The counts of all of a group's parameters on ``p``'s device move together, as 0-d
        views of one array, so a step that advances them all does it in one launch."""
        host = state.get("step")
        if "step" in state and not isinstance(host, Tensor):
            self._share_device_steps(group, p.device)
        view = super()._device_scalars(group, state, p, hooks)
        if not isinstance(host, Tensor) and isinstance(state.get("step"), Tensor):
            self.__dict__.setdefault("_shadow_steps", {})[id(state)] = (state["step"], float(host))
        return view

    def _share_device_steps(self, group: dict[str, Any], device: Any) -> None:
        """Move the host step counts of ``group``'s parameters on ``device`` into one float32 device array,
        each state holding a 0-d view of its own element (its own count: nothing is shared but the storage),
        each with its host shadow."""
        from ..tensor import tensor

        members = []
        for q in group["params"]:  # the parameters this step updates, as ``_prepared`` picks them
            if q.grad is None or not q.requires_grad or q.device != device:
                continue
            st = self.state[q]
            if not st:
                self._init_state(q, st, group)
            if "step" in st and not isinstance(st["step"], Tensor):
                members.append(st)
        if len(members) < 2:
            return
        counts = tensor([float(st["step"]) for st in members], dtype="float32", device=device)
        shadows = self.__dict__.setdefault("_shadow_steps", {})
        arrays = self.__dict__.setdefault("_step_arrays", {})
        views = []
        for i, st in enumerate(members):
            host = float(st["step"])
            st["step"] = counts[i]
            shadows[id(st)] = (st["step"], host)
            views.append((st, st["step"]))
        for _, v in views:
            arrays[id(v)] = (counts, views)


def _step_arguments(group: dict[str, Any], step: Any) -> tuple[tuple, dict[str, Any]]:
    """``adam_step``'s scalar arguments for one step of ``group`` at step count ``step`` (after the increment):
    ``(beta1, beta2, step_size, eps_hat)`` and the keywords ``l2``, ``decay``, ``maximize``."""
    step_size, eps_hat = adam_scalars(group, step)
    wd = group["weight_decay"]
    decoupled = group.get("decoupled_weight_decay", False)
    beta1, beta2 = group["betas"]
    decay = 1 - group["lr"] * wd if decoupled and wd else 1.0
    return ((beta1, beta2, _array(step_size), _array(eps_hat)),
            dict(l2=0.0 if decoupled else wd, decay=_array(decay), maximize=group["maximize"]))


def _array(x: Any) -> Any:
    """A step scalar for a backend call: a device tensor's array, a host number as is."""
    return x._data if isinstance(x, Tensor) else x


class AdamW(Adam):
    """PyTorch's ``torch.optim.AdamW``: Adam with decoupled weight decay (``p *= 1 - lr * weight_decay``),
    default ``weight_decay=1e-2``.

    >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    _name = "AdamW"

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, fused: bool | None = None) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, fused=fused, decoupled_weight_decay=True)
