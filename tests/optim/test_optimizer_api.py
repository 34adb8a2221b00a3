"""The Optimizer base: construction, param groups, zero_grad, closures, hyper-parameter errors."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim

ALL = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "RAdam", "NAdam", "Adadelta", "Adamax", "ASGD", "Rprop"]


def _p(device="cpu"):
    return fg.tensor([1.0, -2.0], device=device, requires_grad=True)


@pytest.mark.parametrize("name, kwargs, match", [
    ("SGD", dict(lr=-0.1), r"SGD: invalid lr -0.1; it must be >= 0"),
    ("SGD", dict(momentum=-1.0), "invalid momentum"),
    ("SGD", dict(lr=0.1, nesterov=True), "nesterov=True requires momentum > 0 and dampening = 0"),
    ("Adam", dict(lr=-1e-3), r"Adam: invalid lr"),
    ("Adam", dict(betas=(1.0, 0.999)), r"invalid betas\[0\] \(beta1\) 1.0; it must be in \[0.0, 1.0\)"),
    ("Adam", dict(betas=(0.9, -0.1)), r"betas\[1\]"),
    ("Adam", dict(betas=(0.9,)), "betas must be a pair"),
    ("Adam", dict(eps=-1.0), "invalid eps"),
    ("AdamW", dict(weight_decay=-0.1), r"AdamW: invalid weight_decay"),
    ("RMSprop", dict(alpha=-0.5), "invalid alpha"),
    ("Adagrad", dict(lr_decay=-1.0), "invalid lr_decay"),
    ("Adagrad", dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    ("RAdam", dict(betas=(0.9, 1.5)), r"RAdam: invalid betas\[1\]"),
    ("NAdam", dict(momentum_decay=-1.0), "momentum_decay"),
    ("NAdam", dict(lr=float("nan")), "invalid lr nan"),
])
def test_bad_hyper_parameters(name, kwargs, match):
    with pytest.raises(fg.FlowError, match=match):
        getattr(optim, name)([_p()], **kwargs)


def test_bad_group_option_is_checked_too():
    with pytest.raises(fg.FlowError, match="invalid lr -1"):
        optim.Adam([{"params": [_p()]}, {"params": [_p()], "lr": -1}])


def test_bad_params():
    with pytest.raises(fg.FlowError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(fg.FlowError, match="single Tensor"):
        optim.SGD(_p(), lr=0.1)
    with pytest.raises(fg.FlowError, match="not a leaf"):
        optim.SGD([_p() * 2], lr=0.1)
    with pytest.raises(fg.FlowError, match="expected a Tensor"):
        optim.SGD([1.0], lr=0.1)
    p = _p()
    with pytest.raises(fg.FlowError, match="more than one parameter group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(fg.FlowError, match="not a set"):
        optim.SGD({p}, lr=0.1)


def test_defaults_are_pytorchs():
    p = [_p()]
    assert optim.SGD(p).defaults["lr"] == 1e-3
    assert optim.Adam(p).defaults["betas"] == (0.9, 0.999) and optim.Adam(p).defaults["eps"] == 1e-8
    assert optim.AdamW(p).defaults["weight_decay"] == 1e-2
    assert optim.RMSprop(p).defaults["lr"] == 1e-2 and optim.RMSprop(p).defaults["alpha"] == 0.99
    assert optim.Adagrad(p).defaults["eps"] == 1e-10
    assert optim.NAdam(p).defaults["lr"] == 2e-3 and optim.NAdam(p).defaults["momentum_decay"] == 4e-3


def test_add_param_group_and_module_parameters(device):
    model = nn.Linear(3, 2).to(device)
    head = fg.zeros(2, device=device, requires_grad=True)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    opt.add_param_group({"params": head, "lr": 0.5})
    assert len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["betas"] == (0.9, 0.999)
    assert opt.param_groups[1]["params"] == [head]
    with pytest.raises(fg.FlowError, match="no 'params' entry"):
        opt.add_param_group({"lr": 0.1})
    with pytest.raises(fg.FlowError, match="more than one parameter group"):
        opt.add_param_group({"params": [head]})


def test_zero_grad(device):
    p = _p(device)
    opt = optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and (p.grad.numpy() == 0).all()
    (p * p).sum().backward()
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("name", ALL)
def test_step_with_closure(device, name):
    p = _p(device)
    opt = getattr(optim, name)([p], lr=0.01)
    calls = []

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        calls.append(1)
        return loss

    with fg.no_grad():  # the closure runs with grad enabled anyway, as in PyTorch
        loss = opt.step(closure)
    assert calls == [1] and loss.item() == 5.0
    assert not np.array_equal(p.detach().numpy(), [1.0, -2.0])


def test_state_dict_format_matches_torch():
    torch = pytest.importorskip("torch")
    fps = [_p(), _p(), _p()]
    tps = [torch.tensor([1.0, -2.0], requires_grad=True) for _ in range(3)]
    fopt = optim.Adam([{"params": fps[:2]}, {"params": fps[2:], "lr": 0.1}], amsgrad=True)
    topt = torch.optim.Adam([{"params": tps[:2]}, {"params": tps[2:], "lr": 0.1}], amsgrad=True)
    for ps, opt in ((fps, fopt), (tps, topt)):
        for p in ps[1:]:
            (p * p).sum().backward()
        opt.step()
    fsd, tsd = fopt.state_dict(), topt.state_dict()
    assert sorted(fsd["state"]) == sorted(tsd["state"]) == [1, 2]
    assert [g["params"] for g in fsd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    assert set(fsd["state"][1]) == set(tsd["state"][1])
    shared = set(tsd["param_groups"][0]) & set(fsd["param_groups"][0])
    assert {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "params"} <= shared
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        np.testing.assert_allclose(fsd["state"][2][key].numpy(), tsd["state"][2][key].numpy(), rtol=1e-6)


def test_load_state_dict_errors():
    opt = optim.SGD([_p()], lr=0.1)
    with pytest.raises(fg.FlowError, match="'state' and 'param_groups'"):
        opt.load_state_dict({})
    other = optim.SGD([{"params": [_p()]}, {"params": [_p()]}], lr=0.1)
    with pytest.raises(fg.FlowError, match="2 parameter groups"):
        opt.load_state_dict(other.state_dict())


def test_repr_lists_groups():
    opt = optim.SGD([{"params": [_p()]}, {"params": [_p()], "lr": 0.5}], lr=0.1, momentum=0.9)
    text = repr(opt)
    assert text.startswith("SGD (") and "Parameter Group 1" in text and "    lr: 0.5" in text
