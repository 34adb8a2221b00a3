"""LBFGS against torch.optim.LBFGS in float64: iterates, closure counts and state, with and without the
strong-Wolfe line search, on a Rosenbrock problem and a tiny MLP."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import optim

from .helpers import data, initial_values, loss_fn

torch = pytest.importorskip("torch")

X0 = np.array([-1.2, 1.0, 0.3, -0.7])


def rosenbrock(x):
    """Rosenbrock's valley in the first two coordinates plus a quadratic bowl in the others (either framework)."""
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2 + ((x[2:] - 0.5) ** 2).sum()


def _float64(device):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")


class Problem:
    """The same parameters and loss in both frameworks (float64); each side's own autograd gives gradients."""

    def __init__(self, device, kind):
        self.kind = kind
        if kind == "rosenbrock":
            start = [X0]
        else:
            start = [v.astype(np.float64) for v in initial_values()]
            x, y = data()
            self.fx, self.fy = (fg.tensor(a.astype(np.float64), device=device) for a in (x, y))
            self.tx, self.ty = (torch.tensor(a.astype(np.float64)) for a in (x, y))
        self.fp = [fg.tensor(v, dtype=fg.float64, device=device, requires_grad=True) for v in start]
        self.tp = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in start]

    def loss(self, params, torch_side):
        if self.kind == "rosenbrock":
            return rosenbrock(params[0])
        x, y = (self.tx, self.ty) if torch_side else (self.fx, self.fy)
        return loss_fn(params, x, y)

    def closures(self, fopt, topt):
        calls = [0, 0]

        def fg_closure():
            calls[0] += 1
            fopt.zero_grad()
            loss = self.loss(self.fp, False)
            loss.backward()
            return loss

        def torch_closure():
            calls[1] += 1
            topt.zero_grad()
            loss = self.loss(self.tp, True)
            loss.backward()
            return loss

        return fg_closure, torch_closure, calls


# (problem, options, steps, atol): Rosenbrock's valley amplifies rounding (each side's autograd and dot products
# round differently), so its iterates agree to 1e-8 after a few steps; the MLP's to 1e-10.
CASES = [
    ("rosenbrock", dict(lr=0.1, history_size=3, max_iter=12), 3, 1e-8),      # history full: oldest pairs dropped
    ("rosenbrock", dict(lr=0.1, max_iter=15), 2, 1e-8),
    ("rosenbrock", dict(line_search_fn="strong_wolfe", history_size=3), 4, 1e-8),
    ("rosenbrock", dict(line_search_fn="strong_wolfe"), 3, 1e-8),
    ("mlp", dict(lr=0.5, max_iter=8), 2, 1e-10),
    ("mlp", dict(line_search_fn="strong_wolfe", max_iter=10, history_size=4), 3, 1e-10),
    ("mlp", dict(line_search_fn="strong_wolfe", max_iter=15, max_eval=12, tolerance_change=1e-6), 2, 1e-10),
]


def _ids(case):
    kind, opts, _, _ = case
    return kind + "-" + "-".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_matches_torch_float64(device, case):
    _float64(device)
    kind, opts, steps, atol = case
    prob = Problem(device, kind)
    fopt = optim.LBFGS(prob.fp, **opts)
    topt = torch.optim.LBFGS(prob.tp, **opts)
    fg_closure, torch_closure, calls = prob.closures(fopt, topt)
    for step in range(steps):
        f_loss = fopt.step(fg_closure)
        t_loss = topt.step(torch_closure)
        assert calls[0] == calls[1], f"closure calls after step {step + 1}: {calls[0]} vs torch's {calls[1]}"
        np.testing.assert_allclose(f_loss.item(), t_loss.item(), rtol=1e-9, atol=atol)
        for i, (a, b) in enumerate(zip(prob.fp, prob.tp)):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-8, atol=atol,
                                       err_msg=f"parameter {i} after step {step + 1}")
        # The whole state after the first step (its history is full then); near the minimum, later steps'
        # curvature pairs are differences of nearly equal gradients, too ill-conditioned to compare to 1e-6.
        assert_same_lbfgs_state(fopt.state_dict(), topt.state_dict(), atol, values=step == 0)


def assert_same_lbfgs_state(fsd, tsd, atol, values=True):
    """PyTorch's layout (all state under parameter 0), keys, counters and (``values``) every entry, scalars
    compared as numbers."""
    assert list(fsd["state"]) == list(tsd["state"]) == [0]
    assert {k: v for k, v in fsd["param_groups"][0].items()} == tsd["param_groups"][0]
    mine, theirs = fsd["state"][0], tsd["state"][0]
    assert set(mine) == set(theirs)
    assert mine["func_evals"] == theirs["func_evals"] and mine["n_iter"] == theirs["n_iter"]
    assert len(mine["old_dirs"]) == len(theirs["old_dirs"])
    if not values:
        return

    def value(v):
        if v is None:
            return np.nan
        return v.numpy() if isinstance(v, fg.Tensor) else np.asarray(v.detach() if hasattr(v, "detach") else v)

    for key in sorted(set(theirs) - {"func_evals", "n_iter"}):
        a, b = mine[key], theirs[key]
        if isinstance(b, list):
            assert len(a) == len(b), key
            for i, (x, y) in enumerate(zip(a, b)):
                np.testing.assert_allclose(value(x), value(y), rtol=1e-6, atol=atol, err_msg=f"{key}[{i}]")
        else:
            np.testing.assert_allclose(value(a), value(b), rtol=1e-6, atol=atol, err_msg=key)


def test_load_torch_state_dict_and_continue(device):
    """A torch LBFGS state dict (tensor lists, 0-d tensors) loads, and the next steps follow torch's."""
    _float64(device)
    prob = Problem(device, "mlp")
    opts = dict(line_search_fn="strong_wolfe", max_iter=6, history_size=5)
    fopt = optim.LBFGS(prob.fp, **opts)
    topt = torch.optim.LBFGS(prob.tp, **opts)
    fg_closure, torch_closure, calls = prob.closures(fopt, topt)
    topt.step(torch_closure)
    with fg.no_grad():
        for f, t in zip(prob.fp, prob.tp):
            f.copy_(fg.tensor(t.detach().numpy(), device=device))
    fopt.load_state_dict(topt.state_dict())
    state = fopt.state[prob.fp[0]]
    assert isinstance(state["ro"][0], float) and isinstance(state["old_dirs"][0], fg.Tensor)
    assert state["old_dirs"][0].device == prob.fp[0].device
    for step in range(2):
        fopt.step(fg_closure)
        topt.step(torch_closure)
        for a, b in zip(prob.fp, prob.tp):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-8, atol=1e-10)


def test_own_state_dict_round_trip(device):
    _float64(device)
    straight, resumed = Problem(device, "rosenbrock"), Problem(device, "rosenbrock")
    opts = dict(line_search_fn="strong_wolfe", max_iter=5)
    opt_a, opt_b = optim.LBFGS(straight.fp, **opts), optim.LBFGS(resumed.fp, **opts)
    close_a, _, _ = straight.closures(opt_a, None)
    close_b, _, _ = resumed.closures(opt_b, None)
    opt_a.step(close_a)
    opt_b.step(close_b)
    opt_c = optim.LBFGS(resumed.fp, **opts)
    opt_c.load_state_dict(opt_b.state_dict())
    close_c, _, _ = resumed.closures(opt_c, None)
    for _ in range(2):
        opt_a.step(close_a)
        opt_c.step(close_c)
    assert (straight.fp[0].detach().numpy() == resumed.fp[0].detach().numpy()).all()


def test_float32_reaches_the_minimum_as_torch_does(device):
    """In float32 the algorithm's scalars round differently from torch's (Python floats here, float32 0-d
    tensors there) and Rosenbrock's valley amplifies that within one step of 20 iterations, so the float32
    check is the outcome: both reach the minimum (1, 1, 0.5, 0.5) in two steps."""
    fx = fg.tensor(X0, dtype=fg.float32, device=device, requires_grad=True)
    tx = torch.tensor(X0, dtype=torch.float32, requires_grad=True)
    fopt = optim.LBFGS([fx], line_search_fn="strong_wolfe")
    topt = torch.optim.LBFGS([tx], line_search_fn="strong_wolfe")

    def fg_closure():
        fopt.zero_grad()
        loss = rosenbrock(fx)
        loss.backward()
        return loss

    def torch_closure():
        topt.zero_grad()
        loss = rosenbrock(tx)
        loss.backward()
        return loss

    for _ in range(2):
        fopt.step(fg_closure)
        topt.step(torch_closure)
    assert fx.dtype == fg.float32 and fopt.state[fx]["d"].dtype == fg.float32
    for x in (fx.detach().numpy(), tx.detach().numpy()):
        np.testing.assert_allclose(x, [1.0, 1.0, 0.5, 0.5], atol=1e-4)


def test_with_lr_scheduler_matches_torch(device):
    _float64(device)
    from flowgraph.optim import lr_scheduler

    prob = Problem(device, "mlp")
    fopt = optim.LBFGS(prob.fp, lr=0.8, max_iter=4)
    topt = torch.optim.LBFGS(prob.tp, lr=0.8, max_iter=4)
    fs = lr_scheduler.StepLR(fopt, step_size=2, gamma=0.5)
    ts = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
    fg_closure, torch_closure, _ = prob.closures(fopt, topt)
    for _ in range(5):
        fopt.step(fg_closure)
        topt.step(torch_closure)
        fs.step()
        ts.step()
        assert fopt.param_groups[0]["lr"] == topt.param_groups[0]["lr"]
        for a, b in zip(prob.fp, prob.tp):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-8, atol=1e-10)


def test_stops_at_once_on_a_stationary_point(device):
    p = fg.tensor([0.0, 0.0], device=device, requires_grad=True)
    opt = optim.LBFGS([p])

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 0.0
    assert opt.state[p]["func_evals"] == 1 and opt.state[p]["n_iter"] == 0


def test_defaults_are_pytorchs():
    mine = optim.LBFGS([fg.tensor([1.0], requires_grad=True)]).defaults
    theirs = torch.optim.LBFGS([torch.tensor([1.0], requires_grad=True)]).defaults
    assert mine == theirs
    assert optim.LBFGS([fg.tensor([1.0], requires_grad=True)], max_iter=8).defaults["max_eval"] == 10


def test_errors():
    p = fg.tensor([1.0], requires_grad=True)
    with pytest.raises(fg.FlowError, match="per-parameter options"):
        optim.LBFGS([{"params": [p]}, {"params": [fg.tensor([2.0], requires_grad=True)]}])
    opt = optim.LBFGS([p])
    with pytest.raises(fg.FlowError, match="per-parameter options"):
        opt.add_param_group({"params": [fg.tensor([2.0], requires_grad=True)]})
    with pytest.raises(fg.FlowError, match=r"LBFGS.step needs a closure"):
        opt.step()
    with pytest.raises(fg.FlowError, match=r"invalid line_search_fn 'armijo'; it must be None or 'strong_wolfe'"):
        optim.LBFGS([p], line_search_fn="armijo")
    with pytest.raises(fg.FlowError, match=r"invalid history_size 0; it must be an integer >= 1"):
        optim.LBFGS([p], history_size=0)
    with pytest.raises(fg.FlowError, match="invalid lr"):
        optim.LBFGS([p], lr=-1.0)
    with pytest.raises(fg.FlowError, match="closure must return the loss"):
        opt.step(lambda: "loss")


def test_parameter_without_gradient_counts_as_zero(device):
    """A parameter the loss does not use (``.grad`` None) enters the flat gradient as zeros and stays put,
    while the others follow torch."""
    _float64(device)
    fx = fg.tensor(X0, dtype=fg.float64, device=device, requires_grad=True)
    fu = fg.tensor([3.0, 4.0], dtype=fg.float64, device=device, requires_grad=True)
    tx = torch.tensor(X0, dtype=torch.float64, requires_grad=True)
    tu = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    fopt = optim.LBFGS([fu, fx], line_search_fn="strong_wolfe", max_iter=6)
    topt = torch.optim.LBFGS([tu, tx], line_search_fn="strong_wolfe", max_iter=6)

    def fg_closure():
        fopt.zero_grad()
        loss = rosenbrock(fx)
        loss.backward()
        return loss

    def torch_closure():
        topt.zero_grad()
        loss = rosenbrock(tx)
        loss.backward()
        return loss

    fopt.step(fg_closure)
    topt.step(torch_closure)
    assert fu.grad is None and fu.detach().numpy().tolist() == [3.0, 4.0]
    np.testing.assert_allclose(fx.detach().numpy(), tx.detach().numpy(), rtol=1e-8, atol=1e-10)
    assert list(fopt.state) == [fu] and fopt.state[fu]["d"].shape == (6,)
