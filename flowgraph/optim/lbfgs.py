"""``LBFGS``: limited-memory BFGS with an optional strong-Wolfe line search (``step(closure)``).

The algorithm, its stopping rules and its line search are PyTorch's ``torch/optim/lbfgs.py`` (itself a port
of Lua torch's ``lbfgs.lua`` and ``lswolfe.lua``), followed line by line so that a run takes the same
iterates as ``torch.optim.LBFGS``. Not SciPy's ``minimize(method="L-BFGS-B")`` or ``line_search``: they
are different algorithms (other initial step, history and bracketing rules), so they would not reproduce
PyTorch's steps, and they work on host arrays rather than on the parameters' device.

Vector work (gradients, directions, the two-loop recursion) is tensor ops on the parameters' device; the
scalars the algorithm branches on (dot products, losses, step lengths) are Python floats, one host read each,
as in PyTorch where every such comparison also synchronises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..autograd.grad_mode import enable_grad, no_grad
from ..errors import FlowError
from ..tensor import Tensor, cat, zeros
from .optimizer import Optimizer, ParamsT, check_range, write_


def _cubic_interpolate(x1: float, f1: float, g1: float, x2: float, f2: float, g2: float,
                       bounds: tuple[float, float] | None = None) -> float:
    """The minimiser of the cubic through ``(x1, f1)``, ``(x2, f2)`` with slopes ``g1``, ``g2``, clamped to
    ``bounds`` (default: the interval between the points); the midpoint when the cubic has no minimum."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _dot(a: Tensor, b: Tensor) -> float:
    return float(a.dot(b).item())


def _strong_wolfe(obj_func: Callable[[list[Tensor], float, Tensor], tuple[float, Tensor]], x: list[Tensor],
                  t: float, d: Tensor, f: float, g: Tensor, gtd: float, c1: float = 1e-4, c2: float = 0.9,
                  tolerance_change: float = 1e-9, max_ls: int = 25) -> tuple[float, Tensor, float, int]:
    """A step length ``t`` along ``d`` meeting the strong Wolfe conditions (bracketing, then zoom by cubic
    interpolation): returns ``(loss, flat gradient, t, function evaluations)``."""
    d_norm = float(d.abs().max().item())
    g = g.clone()
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = _dot(g_new, d)

    # bracket an interval containing a point satisfying the Wolfe criteria
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    ls_iter = 0
    bracket: list[float] = []
    bracket_f: list[float] = []
    bracket_g: list[Tensor] = []
    bracket_gtd: list[float] = []
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        # interpolate
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        # next step
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.clone(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1

    # reached the maximum number of iterations?
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0.0, t], [f, f_new], [g, g_new]

    # zoom phase: refine the bracket until a point satisfies the criteria
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1],
                               bracket_gtd[1])
        # too close to a boundary (or outside): move 10% of the bracket away from the nearest end
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False

        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1

        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            # Armijo condition not met, or not lower than the lowest point
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new.clone(), gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True  # Wolfe conditions met
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                # the old high becomes the new low
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            # the new point becomes the new low
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new.clone(), gtd_new

    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


def _loss_value(loss: Any) -> float:
    """The closure's loss as a Python float."""
    if isinstance(loss, Tensor):
        return float(loss.item())
    try:
        return float(loss)
    except (TypeError, ValueError) as exc:
        raise FlowError(f"LBFGS.step: the closure must return the loss (a one-element tensor or a number), "
                        f"got {type(loss).__name__}") from exc


def _scalar(value: Any) -> Any:
    """A stored scalar as a Python float (a loaded PyTorch state dict may hold 0-d tensors); None stays."""
    if value is None or isinstance(value, float):
        return value
    return float(value.item()) if isinstance(value, Tensor) else float(value)


class LBFGS(Optimizer):
    """PyTorch's ``torch.optim.LBFGS`` (same arguments, defaults, state and iterates)::

        opt = optim.LBFGS(model.parameters(), lr=1, history_size=10, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)          # up to max_iter iterations, re-evaluating the closure as needed

    One ``step`` runs up to ``max_iter`` L-BFGS iterations (at most ``max_eval`` closure calls, default
    ``max_iter * 5 // 4``) and stops early when the gradient's largest entry is ``<= tolerance_grad`` or the
    loss or the step changes by less than ``tolerance_change``. Without a line search each iteration moves
    by ``lr`` along the L-BFGS direction (the first one by ``min(1, 1 / |g|_1) * lr``); with
    ``line_search_fn="strong_wolfe"`` the step length meets the strong Wolfe conditions.

    All parameters form one group on one device (as in PyTorch). The state (kept under the first parameter,
    PyTorch's layout) holds ``func_evals``, ``n_iter``, ``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``,
    ``H_diag``, ``prev_flat_grad``, ``prev_loss`` and ``al``; the scalars among them are Python floats.
    """

    _host_scalars = ("t", "H_diag", "prev_loss", "ro", "al")

    def __init__(self, params: ParamsT, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size,
                        line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        self._params: list[Tensor] = self.param_groups[0]["params"]
        devices = sorted({str(p.device) for p in self._params})
        if len(devices) > 1:
            raise FlowError(f"LBFGS: all parameters must be on one device (as in PyTorch), got {devices}; "
                            "move the model with model.to(device) first")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """LBFGS has a single parameter group: a second one is refused (PyTorch refuses it too)."""
        if self.param_groups:
            raise FlowError("LBFGS doesn't support per-parameter options (parameter groups): pass one list "
                            "of parameters, e.g. optim.LBFGS(model.parameters())")
        super().add_param_group(param_group)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_range("LBFGS", "lr", group["lr"], 0.0)
        for name in ("max_iter", "max_eval", "history_size"):
            value = group[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FlowError(f"LBFGS: invalid {name} {value!r}; it must be an integer >= 1")
        check_range("LBFGS", "tolerance_grad", group["tolerance_grad"], 0.0)
        check_range("LBFGS", "tolerance_change", group["tolerance_change"], 0.0)
        if group["line_search_fn"] not in (None, "strong_wolfe"):
            raise FlowError(f"LBFGS: invalid line_search_fn {group['line_search_fn']!r}; it must be None or "
                            "'strong_wolfe'")

    # ------------------------------------------------------------------ flat views of the parameters
    def _gather_flat_grad(self) -> Tensor:
        return cat([zeros(p.numel(), dtype=p.dtype, device=p.device) if p.grad is None else p.grad.reshape(-1)
                    for p in self._params], 0)

    def _add_grad(self, step_size: float, update: Tensor) -> None:
        offset = 0
        for p in self._params:
            numel = p.numel()
            write_(p, p + update[offset:offset + numel].reshape(p.shape) * step_size)
            offset += numel

    def _clone_param(self) -> list[Tensor]:
        return [p.clone() for p in self._params]

    def _set_param(self, params_data: list[Tensor]) -> None:
        for p, data in zip(self._params, params_data):
            write_(p, data)

    def _directional_evaluate(self, closure: Callable[[], Any], x: list[Tensor], t: float, d: Tensor
                              ) -> tuple[float, Tensor]:
        """The loss and flat gradient at ``x + t * d``; the parameters are put back to ``x`` afterwards."""
        self._add_grad(t, d)
        with enable_grad():
            loss = _loss_value(closure())
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    # ------------------------------------------------------------------ the step
    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Run up to ``max_iter`` iterations; ``closure`` re-evaluates the model (zero_grad, forward,
        backward) and returns the loss. Returns the loss of the first evaluation, as PyTorch does."""
        if closure is None:
            raise FlowError("LBFGS.step needs a closure that clears the gradients, computes the loss, calls "
                            "loss.backward() and returns the loss: opt.step(closure)")
        if len(self.param_groups) != 1:
            raise FlowError(f"LBFGS.step: expected one parameter group, found {len(self.param_groups)}")

        group = self.param_groups[0]
        lr = group["lr"]
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]

        # LBFGS's state is global; it is kept under the first parameter (PyTorch's layout).
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        with enable_grad():
            orig_loss = closure()
        loss = _loss_value(orig_loss)
        current_evals = 1
        state["func_evals"] += 1

        flat_grad = self._gather_flat_grad()
        if float(flat_grad.abs().max().item()) <= tolerance_grad:
            return orig_loss

        d = state.get("d")
        t = _scalar(state.get("t"))
        old_dirs = state.get("old_dirs")
        old_stps = state.get("old_stps")
        ro = None if state.get("ro") is None else [_scalar(r) for r in state["ro"]]
        h_diag = _scalar(state.get("H_diag"))
        prev_flat_grad = state.get("prev_flat_grad")
        prev_loss = _scalar(state.get("prev_loss"))

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1

            # ---- the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                h_diag = 1.0
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = _dot(y, s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:  # drop the oldest pair (limited memory)
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / _dot(y, y)  # scale of the initial inverse Hessian

                # the two-loop recursion: d = -H g with the L-BFGS inverse Hessian H
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = _dot(old_stps[i], q) * ro[i]
                    q = q - old_dirs[i] * al[i]
                r = q * h_diag
                for i in range(num_old):
                    be_i = _dot(old_dirs[i], r) * ro[i]
                    r = r + old_stps[i] * (al[i] - be_i)
                d = r

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                write_(prev_flat_grad, flat_grad)
            prev_loss = loss

            # ---- the step length
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / float(flat_grad.abs().sum().item())) * lr
            else:
                t = lr
            gtd = _dot(flat_grad, d)  # directional derivative
            if gtd > -tolerance_change:
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                x_init = self._clone_param()

                def obj_func(x: list[Tensor], t: float, d: Tensor) -> tuple[float, Tensor]:
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                                  max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = float(flat_grad.abs().max().item()) <= tolerance_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    # re-evaluate only if another iteration follows (stochastic settings gain nothing)
                    with enable_grad():
                        loss = _loss_value(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = float(flat_grad.abs().max().item()) <= tolerance_grad
                    ls_func_evals = 1

            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            # ---- stopping rules
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if float((d * t).abs().max().item()) <= tolerance_change:  # lack of progress
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state["d"] = d
        state["t"] = t
        state["old_dirs"] = old_dirs
        state["old_stps"] = old_stps
        state["ro"] = ro
        state["H_diag"] = h_diag
        state["prev_flat_grad"] = prev_flat_grad
        state["prev_loss"] = prev_loss
        return orig_loss
