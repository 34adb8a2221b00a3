"""Shared helpers for the optim tests: identical parameters, data and loss in flowgraph and torch."""

from __future__ import annotations

import numpy as np

import flowgraph as fg

SHAPES = [(4, 3), (4,), (2, 4)]

# Tightest tolerance that holds for all the optimizer grids over 20 steps (float32; the update formulas are
# PyTorch's, evaluated in a fused-friendly order, so they differ by a few ulps per step).
RTOL, ATOL = 1e-5, 1e-6


def initial_values(seed: int = 0) -> list[np.ndarray]:
    """A few float32 parameter values, the same in both frameworks."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)


def fg_params(device: str, seed: int = 0) -> list[fg.Tensor]:
    return [fg.tensor(v, device=device, requires_grad=True) for v in initial_values(seed)]


def torch_params(seed: int = 0):
    import torch

    return [torch.tensor(v, requires_grad=True) for v in initial_values(seed)]


def loss_fn(params, x, y):
    """A small MLP loss with an L2 term; written once, it runs on flowgraph and torch tensors alike."""
    w1, b1, w2 = params
    h = (x @ w1.transpose(0, 1) + b1).tanh()
    out = h @ w2.transpose(0, 1)
    return ((out - y) ** 2).mean() + (w1 * w1).sum() * 0.01


class Pair:
    """The same model in both frameworks, stepped together."""

    def __init__(self, device: str, seed: int = 0, sign: float = 1.0):
        import torch

        self.sign = sign  # -1 with maximize=True: maximising -loss keeps the run bounded

        self.device = device
        self.fp = fg_params(device, seed)
        self.tp = torch_params(seed)
        x, y = data()
        self.fx, self.fy = fg.tensor(x, device=device), fg.tensor(y, device=device)
        self.tx, self.ty = torch.tensor(x), torch.tensor(y)

    def fg_backward(self, params=None):
        """Gradients of flowgraph's parameters, computed by torch from their current values.

        The optimizer tests compare update rules, so both sides take their gradients from the same code;
        flowgraph's own autograd is checked against torch in tests/autograd (and by test_fg_autograd_training_*).
        """
        import torch

        params = params or self.fp
        mirror = [torch.tensor(p.detach().numpy(), requires_grad=True) for p in params]
        loss = loss_fn(mirror, self.tx, self.ty) * self.sign
        loss.backward()
        for p, m in zip(params, mirror):
            if p.requires_grad:
                p.grad = fg.tensor(m.grad.numpy(), device=p.device)
        return loss

    def fg_autograd_backward(self):
        loss = loss_fn(self.fp, self.fx, self.fy) * self.sign
        loss.backward()
        return loss

    def torch_backward(self, params=None):
        if params is not None and params[0].dtype != self.tx.dtype:  # the float64 reference run
            loss = loss_fn(params, self.tx.to(params[0].dtype), self.ty.to(params[0].dtype)) * self.sign
            loss.backward()
            return loss
        loss = loss_fn(params or self.tp, self.tx, self.ty) * self.sign
        loss.backward()
        return loss


def step_both(pair: Pair, fopt, topt, *schedulers, autograd: bool = False) -> None:
    """One step of both frameworks on ``pair``: zero the gradients, backward, optimizer steps, then
    ``schedulers`` (flowgraph's and torch's, in any order). ``autograd``: flowgraph's gradients from its own
    autograd instead of the analytic ones."""
    fopt.zero_grad()
    topt.zero_grad()
    (pair.fg_autograd_backward if autograd else pair.fg_backward)()
    pair.torch_backward()
    fopt.step()
    topt.step()
    for sched in schedulers:
        sched.step()


def assert_close_params(fp, tp, rtol: float, atol: float, where: str = "") -> None:
    for i, (a, b) in enumerate(zip(fp, tp)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"parameter {i} {where}")


def run_pair(pair: Pair, fopt, topt, steps: int, rtol: float = RTOL, atol: float = ATOL, reference=None) -> None:
    """Step both optimizers ``steps`` times, comparing the parameters after each step.

    With ``reference`` (a float64 torch run of the same optimizer, see ``float64_reference``) the tolerance is
    derived from float32 arithmetic instead of fixed: flowgraph's distance to the float64 trajectory may be at
    most 4x torch's own float32 distance to it, plus a rounding floor that grows by one ulp of the parameters
    per step (the error of any float32 evaluation order). That holds on every CPU, and still catches a wrong
    update (an error of the order of the learning rate).
    """
    for step in range(steps):
        step_both(pair, fopt, topt)
        if reference is None:
            assert_close_params(pair.fp, pair.tp, rtol, atol, f"after step {step + 1}")
            continue
        ref_params, ref_opt = reference
        ref_opt.zero_grad()
        pair.torch_backward(ref_params)
        ref_opt.step()
        for i, (f, t, r) in enumerate(zip(pair.fp, pair.tp, ref_params)):
            r = r.detach().numpy()
            err_fg = np.abs(f.detach().numpy().astype(np.float64) - r).max()
            err_torch = np.abs(t.detach().numpy().astype(np.float64) - r).max()
            floor = 4 * (step + 1) * np.finfo(np.float32).eps * max(np.abs(r).max(), 1.0)
            assert err_fg <= 4 * err_torch + floor, (
                f"parameter {i} after step {step + 1}: flowgraph is {err_fg:.3g} from the float64 trajectory, "
                f"torch's float32 run {err_torch:.3g} (allowed {4 * err_torch + floor:.3g})"
            )


def float64_reference(pair: Pair, name: str, opts: dict):
    """torch's optimizer run in float64 from the same start: the trajectory both float32 runs approximate."""
    import torch

    params = [torch.tensor(p.detach().numpy().astype(np.float64), requires_grad=True) for p in pair.tp]
    return params, getattr(torch.optim, name)(params, **opts)
