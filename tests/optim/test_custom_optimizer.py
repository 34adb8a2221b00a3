"""A user-written optimizer subclass, PyTorch style: the same source trains identically in both frameworks.

``make_momentum_sgd`` is the SGD-with-momentum a PyTorch tutorial writes (``torch.optim.SGD`` as it read
before its foreach rewrite), renamed and parametrised only by the library it runs on: nothing in it knows
flowgraph's internals (``_update``, ``_init_state``, ``write_``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.optim import lr_scheduler
from flowgraph.optim.optimizer import required as fg_required

from .helpers import ATOL, RTOL, Pair, assert_close_params, run_pair

torch = pytest.importorskip("torch")


def make_momentum_sgd(lib, Optimizer, required):  # noqa: N803 - the class is a parameter here
    """The tutorial class, for ``lib`` = ``torch`` or ``flowgraph``."""

    class MomentumSGD(Optimizer):
        def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False):
            if lr is not required and lr < 0.0:
                raise ValueError(f"Invalid learning rate: {lr}")
            if momentum < 0.0:
                raise ValueError(f"Invalid momentum value: {momentum}")
            if weight_decay < 0.0:
                raise ValueError(f"Invalid weight_decay value: {weight_decay}")
            defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                            nesterov=nesterov)
            if nesterov and (momentum <= 0 or dampening != 0):
                raise ValueError("Nesterov momentum requires a momentum and zero dampening")
            super().__init__(params, defaults)

        def __setstate__(self, state):
            super().__setstate__(state)
            for group in self.param_groups:
                group.setdefault("nesterov", False)

        @lib.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with lib.enable_grad():
                    loss = closure()

            for group in self.param_groups:
                weight_decay = group["weight_decay"]
                momentum = group["momentum"]
                dampening = group["dampening"]
                nesterov = group["nesterov"]

                for p in group["params"]:
                    if p.grad is None:
                        continue
                    d_p = p.grad
                    if weight_decay != 0:
                        d_p = d_p.add(p, alpha=weight_decay)
                    if momentum != 0:
                        param_state = self.state[p]
                        if "momentum_buffer" not in param_state:
                            buf = param_state["momentum_buffer"] = lib.clone(d_p).detach()
                        else:
                            buf = param_state["momentum_buffer"]
                            buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
                        if nesterov:
                            d_p = d_p.add(buf, alpha=momentum)
                        else:
                            d_p = buf

                    p.add_(d_p, alpha=-group["lr"])

            return loss

    return MomentumSGD


FgMomentumSGD = make_momentum_sgd(fg, optim.Optimizer, fg_required)
TorchMomentumSGD = make_momentum_sgd(torch, torch.optim.Optimizer,
                                     pytest.importorskip("torch.optim.optimizer").required)

OPTIONS = [
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.05),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_tutorial_subclass_matches_torch(device, opts):
    """Same gradients in, the same parameters out after every one of 20 steps (the float64-derived
    tolerance of the built-in optimizers' tests), and the same state dict."""
    pair = Pair(device)
    fopt = FgMomentumSGD(pair.fp, **opts)
    topt = TorchMomentumSGD(pair.tp, **opts)
    ref_params = [torch.tensor(p.detach().numpy().astype(np.float64), requires_grad=True) for p in pair.tp]
    run_pair(pair, fopt, topt, 20, reference=(ref_params, TorchMomentumSGD(ref_params, **opts)))
    fsd, tsd = fopt.state_dict(), topt.state_dict()
    assert fsd["param_groups"] == tsd["param_groups"]
    assert sorted(fsd["state"]) == sorted(tsd["state"]) == [0, 1, 2]
    for idx, entry in tsd["state"].items():
        assert set(fsd["state"][idx]) == set(entry) == {"momentum_buffer"}
        np.testing.assert_allclose(fsd["state"][idx]["momentum_buffer"].numpy(),
                                   entry["momentum_buffer"].numpy(), rtol=1e-4, atol=1e-5)


def test_tutorial_subclass_trains_a_model_like_torch(device):
    """End to end on an nn model with flowgraph's own autograd, a closure and a scheduler (float64 where
    the device has it, so the comparison is tight)."""
    wide = fg.get_backend(device).supports_float64
    dtype, tdtype = (fg.float64, torch.float64) if wide else (fg.float32, torch.float32)
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(tdtype)
    with torch.no_grad():
        for fp, tp in zip(model.parameters(), tmodel.parameters()):
            tp.copy_(torch.tensor(fp.detach().numpy()))
    model = model.to(device, dtype)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((16, 3)), rng.standard_normal((16, 2))
    fx, fy = fg.tensor(x, dtype=dtype, device=device), fg.tensor(y, dtype=dtype, device=device)
    tx, ty = torch.tensor(x, dtype=tdtype), torch.tensor(y, dtype=tdtype)
    fopt = FgMomentumSGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    topt = TorchMomentumSGD(tmodel.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    fsched = lr_scheduler.StepLR(fopt, step_size=5, gamma=0.5)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=5, gamma=0.5)

    def fg_closure():
        fopt.zero_grad()
        loss = nn.functional.mse_loss(model(fx), fy)
        loss.backward()
        return loss

    def torch_closure():
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(tmodel(tx), ty)
        loss.backward()
        return loss

    first = None
    for _ in range(15):
        floss, tloss = fopt.step(fg_closure), topt.step(torch_closure)
        first = floss.item() if first is None else first
        fsched.step()
        tsched.step()
        np.testing.assert_allclose(floss.item(), tloss.item(), rtol=1e-9 if wide else 1e-5)
    assert floss.item() < 0.8 * first  # it trained
    tol = dict(rtol=1e-9, atol=1e-11) if wide else dict(rtol=RTOL * 10, atol=ATOL * 10)
    assert_close_params(list(model.parameters()), list(tmodel.parameters()), **tol)


def test_state_dict_round_trip_and_torch_state_dict(device):
    """The subclass's state dict reloads into a fresh instance (continuing identically), and a torch state
    dict of the torch subclass loads into the flowgraph one (continuing in step with torch)."""
    opts = dict(lr=0.1, momentum=0.9, weight_decay=0.01)
    straight, resumed = Pair(device), Pair(device)
    opt_a, opt_b = FgMomentumSGD(straight.fp, **opts), FgMomentumSGD(resumed.fp, **opts)

    def one(pair, opt):
        opt.zero_grad()
        pair.fg_backward()
        opt.step()

    for _ in range(4):
        one(straight, opt_a)
        one(resumed, opt_b)
    opt_c = FgMomentumSGD(resumed.fp, lr=5.0)
    opt_c.load_state_dict(opt_b.state_dict())
    assert opt_c.param_groups[0]["momentum"] == 0.9
    for _ in range(4):
        one(straight, opt_a)
        one(resumed, opt_c)
    for a, b in zip(straight.fp, resumed.fp):
        assert (a.detach().numpy() == b.detach().numpy()).all()

    pair = Pair(device)
    topt = TorchMomentumSGD(pair.tp, **opts)
    for _ in range(3):
        topt.zero_grad()
        pair.torch_backward()
        topt.step()
    with fg.no_grad():
        for f, t in zip(pair.fp, pair.tp):
            f.copy_(fg.tensor(t.detach().numpy(), device=device))
    fopt = FgMomentumSGD(pair.fp, lr=1.0)
    fopt.load_state_dict(topt.state_dict())
    assert isinstance(fopt.state[pair.fp[0]]["momentum_buffer"], fg.Tensor)
    run_pair(pair, fopt, topt, 5)


def test_add_param_group_zero_grad_and_required_option(device):
    pair = Pair(device)
    opt = FgMomentumSGD(pair.fp[:2], lr=0.1, momentum=0.5)
    opt.add_param_group({"params": pair.fp[2], "lr": 0.01})
    assert opt.param_groups[1]["momentum"] == 0.5 and opt.param_groups[1]["nesterov"] is False
    pair.fg_backward()
    opt.step()
    assert set(opt.state) == set(pair.fp)
    opt.zero_grad(set_to_none=False)
    assert all((p.grad.numpy() == 0).all() for p in pair.fp)
    opt.zero_grad()
    assert all(p.grad is None for p in pair.fp)
    with pytest.raises(fg.FlowError, match="required option 'lr'"):
        FgMomentumSGD(pair.fp)  # lr=required and not given, as torch's "didn't specify a value of required"
    clone = copy.deepcopy(opt)  # the tutorial's __setstate__ calls the base one
    assert clone.param_groups[1]["lr"] == 0.01 and clone is not opt


def test_step_hooks(device):
    """Pre- and post-hooks run around a subclass's step as in torch; a pre-hook may replace the arguments;
    removed hooks stop running."""
    calls = {"fg": [], "torch": []}
    for name, cls, p in (("fg", FgMomentumSGD, fg.tensor([1.0, -2.0], device=device, requires_grad=True)),
                         ("torch", TorchMomentumSGD, torch.tensor([1.0, -2.0], requires_grad=True))):
        opt = cls([p], lr=0.1, momentum=0.9)
        log = calls[name]

        def closure(p=p, opt=opt, log=log):
            log.append("closure")
            opt.zero_grad()
            loss = (p * p).sum()
            loss.backward()
            return loss

        def pre(optimizer, args, kwargs, log=log, closure=closure, opt=opt):
            assert optimizer is opt
            log.append(("pre", len(args), sorted(kwargs)))
            return (optimizer, closure), {}

        def post(optimizer, args, kwargs, log=log):
            log.append(("post", len(args), sorted(kwargs)))

        h_pre = opt.register_step_pre_hook(pre)
        h_post = opt.register_step_post_hook(post)
        loss = opt.step()  # the pre-hook supplies the closure
        assert float(loss.item()) == 5.0
        h_pre.remove()
        opt.step()
        h_post.remove()
        opt.step()
    # args start with the optimizer itself, as in torch
    assert calls["fg"] == calls["torch"] == [("pre", 1, []), "closure", ("post", 2, []), ("post", 1, [])]


def test_hooks_on_builtin_optimizers_and_super_step(device):
    """Every optimizer's step runs the hooks, once even when a subclass's step calls super().step()."""
    p = fg.tensor([1.0, -2.0], device=device, requires_grad=True)

    class Logged(optim.Adam):
        def step(self, closure=None):
            self.calls = getattr(self, "calls", 0) + 1
            return super().step(closure)

    for opt in (optim.Adam([p], lr=0.1), optim.LBFGS([p], max_iter=2), Logged([p], lr=0.1)):
        seen = []
        opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
        opt.register_step_post_hook(lambda o, a, k: seen.append("post"))

        def closure(opt=opt):
            opt.zero_grad()
            loss = (p * p).sum()
            loss.backward()
            return loss

        opt.step(closure)
        assert seen == ["pre", "post"], type(opt).__name__
    with pytest.raises(fg.FlowError, match="must return None or a tuple"):
        opt.register_step_pre_hook(lambda o, a, k: "bad")
        opt.step(closure)


def test_subclass_without_step_says_what_to_define():
    class NoStep(optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=0.1))

    p = fg.tensor([1.0], requires_grad=True)
    opt = NoStep([p])
    (p * p).sum().backward()
    with pytest.raises(fg.FlowError, match=r"NoStep overrides neither step\(closure=None\) nor _update\(\)"):
        opt.step()
