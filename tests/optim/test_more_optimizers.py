"""Adadelta, Adamax, ASGD, Rprop and SparseAdam against torch.optim: steps, state dicts, schedulers, errors."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import optim

from .helpers import ATOL, RTOL, Pair, assert_close_params, float64_reference, run_pair, step_both

torch = pytest.importorskip("torch")

STEPS = 20
NAMES = ["Adadelta", "Adamax", "ASGD", "Rprop"]

GRID = [
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1)),
    ("Adadelta", dict(lr=0.5, weight_decay=0.05, maximize=True)),
    ("Adamax", dict()),
    ("Adamax", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("Adamax", dict(lr=0.01, weight_decay=0.05, maximize=True)),
    ("ASGD", dict()),
    ("ASGD", dict(lr=0.05, lambd=0.01, alpha=0.6, t0=5, weight_decay=0.1)),     # averaging from step 6 on
    ("ASGD", dict(lr=0.05, lambd=1e-3, t0=3, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.05, etas=(0.4, 1.5), step_sizes=(1e-3, 0.08))),         # both clamps reached
    ("Rprop", dict(lr=0.02, maximize=True)),
]
# one grid entry per optimizer with options, used by the slower round-trip tests
SAMPLES = [GRID[1], GRID[5], GRID[7], GRID[10]]


def _ids(case):
    name, opts = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in opts.items())


def _sign(opts):
    return -1.0 if opts.get("maximize") else 1.0


@pytest.mark.parametrize("case", GRID, ids=[_ids(c) for c in GRID])
def test_matches_torch(device, case):
    """float32, 20 steps, tolerance derived from torch's own float32 distance to its float64 run."""
    name, opts = case
    pair = Pair(device, sign=_sign(opts))
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    run_pair(pair, fopt, topt, STEPS, reference=float64_reference(pair, name, opts))


@pytest.mark.parametrize("case", GRID, ids=[_ids(c) for c in GRID])
def test_matches_torch_float64(device, case):
    """In float64 every step agrees to ~1e-12 and the state dict holds torch's keys and values."""
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    name, opts = case
    pair = Pair(device, sign=_sign(opts))
    pair.fp = [fg.tensor(p.detach().numpy().astype("float64"), device=device, requires_grad=True) for p in pair.fp]
    pair.tp = [torch.tensor(p.detach().numpy().astype("float64"), requires_grad=True) for p in pair.tp]
    pair.tx, pair.ty = pair.tx.double(), pair.ty.double()
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    run_pair(pair, fopt, topt, STEPS, rtol=1e-10, atol=1e-12)
    assert_same_state(fopt.state_dict(), topt.state_dict(), rtol=1e-10, atol=1e-12)


def assert_same_state(fsd, tsd, rtol, atol):
    """Same param groups (PyTorch's keys, less those flowgraph does not have) and the same state entries."""
    assert sorted(fsd["state"]) == sorted(tsd["state"])
    for fg_group, t_group in zip(fsd["param_groups"], tsd["param_groups"]):
        missing = set(t_group) - set(fg_group) - {"capturable", "differentiable"}
        assert not missing, f"param group keys torch has and flowgraph lacks: {missing}"
        for key in set(fg_group) & set(t_group):
            value = t_group[key]
            assert fg_group[key] == (tuple(value) if isinstance(value, list) and key != "params" else value), key
    for idx, t_state in tsd["state"].items():
        f_state = fsd["state"][idx]
        assert set(f_state) == set(t_state)
        for key, value in t_state.items():
            mine = f_state[key]
            mine = mine.numpy() if isinstance(mine, fg.Tensor) else np.float64(mine)
            np.testing.assert_allclose(mine, value.detach().numpy(), rtol=rtol, atol=atol, err_msg=key)


def test_a_wrong_update_is_caught(device):
    """The float64-derived tolerance fails an Adadelta whose rho is slightly off (0.89 vs 0.9)."""
    pair = Pair(device)
    fopt = optim.Adadelta(pair.fp, rho=0.89)
    topt = torch.optim.Adadelta(pair.tp, rho=0.9)
    with pytest.raises(AssertionError, match="float64 trajectory"):
        run_pair(pair, fopt, topt, STEPS, reference=float64_reference(pair, "Adadelta", dict(rho=0.9)))


@pytest.mark.parametrize("name", NAMES)
def test_defaults_are_pytorchs(name):
    p = [fg.tensor([1.0, -2.0], requires_grad=True)]
    mine = getattr(optim, name)(p).defaults
    theirs = getattr(torch.optim, name)([torch.tensor([1.0, -2.0], requires_grad=True)]).defaults
    theirs = {k: tuple(v) if isinstance(v, list) else v for k, v in theirs.items()
              if k not in ("capturable", "differentiable")}
    assert mine == theirs


@pytest.mark.parametrize("name", NAMES)
def test_param_groups_and_frozen_parameters(device, name):
    """Two groups with different lr follow torch; a frozen parameter is neither updated nor given state."""
    pair = Pair(device)
    fopt = getattr(optim, name)([{"params": pair.fp[:2]}, {"params": pair.fp[2:], "lr": 0.003}], lr=0.02)
    topt = getattr(torch.optim, name)([{"params": pair.tp[:2]}, {"params": pair.tp[2:], "lr": 0.003}], lr=0.02)
    run_pair(pair, fopt, topt, 5)
    frozen = Pair(device)
    frozen.fp[1].requires_grad_(False)
    before = frozen.fp[1].numpy().copy()
    opt = getattr(optim, name)(frozen.fp, lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        frozen.fg_backward()
        opt.step()
    assert (frozen.fp[1].numpy() == before).all() and frozen.fp[1] not in opt.state
    assert frozen.fp[0] in opt.state and frozen.fp[2] in opt.state


@pytest.mark.parametrize("case", SAMPLES, ids=_ids)
def test_state_dict_round_trip_continues_identically(device, case):
    name, opts = case
    straight, resumed = Pair(device, sign=_sign(opts)), Pair(device, sign=_sign(opts))
    opt_a = getattr(optim, name)(straight.fp, **opts)
    opt_b = getattr(optim, name)(resumed.fp, **opts)

    def one(pair, opt):
        opt.zero_grad()
        pair.fg_backward()
        opt.step()

    for _ in range(8):
        one(straight, opt_a)
        one(resumed, opt_b)
    saved = opt_b.state_dict()
    opt_c = getattr(optim, name)(resumed.fp, **{**opts, "lr": 123.0})
    opt_c.load_state_dict(saved)
    assert opt_c.param_groups[0]["lr"] == opts["lr"]
    for _ in range(5):
        one(straight, opt_a)
        one(resumed, opt_c)
        for a, b in zip(straight.fp, resumed.fp):
            assert (a.detach().numpy() == b.detach().numpy()).all()


@pytest.mark.parametrize("case", SAMPLES, ids=_ids)
def test_load_torch_state_dict(device, case):
    """A torch.optim state dict taken mid-run (0-d tensor step, eta and mu included) continues in step."""
    name, opts = case
    pair = Pair(device, sign=_sign(opts))
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    for _ in range(7):
        topt.zero_grad()
        pair.torch_backward()
        topt.step()
    with torch.no_grad():
        for f, t in zip(pair.fp, pair.tp):
            f.detach().copy_(t.detach().numpy())
    fopt.load_state_dict(topt.state_dict())
    first = fopt.state[pair.fp[0]]
    assert isinstance(first["step"], float) and first["step"] == 7.0
    run_pair(pair, fopt, topt, 6)


@pytest.mark.parametrize("name, sched, kwargs", [
    ("Adadelta", "StepLR", dict(step_size=3, gamma=0.5)),
    ("Adamax", "OneCycleLR", dict(max_lr=0.05, total_steps=STEPS)),        # cycles lr and betas[0]
    ("ASGD", "ExponentialLR", dict(gamma=0.9)),                          # lr enters eta at every step
    ("Rprop", "CosineAnnealingLR", dict(T_max=7)),                       # lr only sets the first step size
], ids=lambda v: v if isinstance(v, str) else "")
def test_training_with_scheduler_matches_torch(device, name, sched, kwargs):
    from flowgraph.optim import lr_scheduler

    pair = Pair(device)
    opts = dict(lr=0.01, t0=4) if name == "ASGD" else dict(lr=0.01)
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    fs = getattr(lr_scheduler, sched)(fopt, **kwargs)
    ts = getattr(torch.optim.lr_scheduler, sched)(topt, **kwargs)
    for step in range(STEPS):
        step_both(pair, fopt, topt, fs, ts)
        assert fopt.param_groups[0]["lr"] == topt.param_groups[0]["lr"]
        assert_close_params(pair.fp, pair.tp, RTOL, ATOL, f"after step {step + 1}")


@pytest.mark.parametrize("name, kwargs, match", [
    ("Adadelta", dict(lr=-1.0), r"Adadelta: invalid lr -1.0; it must be >= 0"),
    ("Adadelta", dict(rho=1.5), r"invalid rho 1.5; it must be in \[0.0, 1.0\]"),
    ("Adadelta", dict(eps=-1e-6), "invalid eps"),
    ("Adamax", dict(betas=(0.9, 1.0)), r"Adamax: invalid betas\[1\]"),
    ("Adamax", dict(weight_decay=-0.1), "invalid weight_decay"),
    ("ASGD", dict(lr=-0.1), "ASGD: invalid lr"),
    ("ASGD", dict(weight_decay=-1.0), "invalid weight_decay"),
    ("Rprop", dict(etas=(1.2, 0.5)), r"Rprop: invalid etas \(1.2, 0.5\); .*0 < etaminus < 1 < etaplus"),
    ("Rprop", dict(step_sizes=(1.0, 0.1)), r"invalid step_sizes .*0 <= min <= max"),
    ("SparseAdam", dict(lr=0.0), r"SparseAdam: invalid lr 0.0; it must be > 0"),
    ("SparseAdam", dict(eps=0.0), "invalid eps"),
    ("SparseAdam", dict(betas=(1.0, 0.9)), r"invalid betas\[0\]"),
])
def test_bad_hyper_parameters(name, kwargs, match):
    with pytest.raises(fg.FlowError, match=match):
        getattr(optim, name)([fg.tensor([1.0], requires_grad=True)], **kwargs)


def test_sparse_adam_refuses_dense_gradients_at_step_as_torch_does(device):
    """torch.optim.SparseAdam builds fine and raises at step() on a dense gradient; so does flowgraph's,
    with a FlowError naming the parameter and the optimizer to use instead."""
    tp = torch.tensor([1.0, 2.0], requires_grad=True)
    topt = torch.optim.SparseAdam([tp])
    (tp * tp).sum().backward()
    with pytest.raises(RuntimeError, match="does not support dense gradients"):
        topt.step()

    weight = fg.tensor([[1.0, 2.0], [3.0, 4.0]], device=device, requires_grad=True)
    bias = fg.tensor([0.5, 0.5], device=device, requires_grad=True)
    opt = optim.SparseAdam([weight, bias], lr=1e-3)
    assert opt.defaults == {k: v for k, v in topt.defaults.items()}
    assert opt.step() is None  # no gradient yet: nothing to refuse
    fg.nn.functional.embedding(fg.tensor([1, 0, 1], device=device), weight, sparse=True).sum().backward()
    with pytest.raises(fg.FlowError, match=r"parameter 0 of group 0 has a dense gradient.*use optim.Adam"):
        opt.step()
    assert not opt.state and (weight.detach().numpy() == [[1.0, 2.0], [3.0, 4.0]]).all()
