"""Every optimizer, over a grid of its options, follows torch.optim step by step (float32)."""

from __future__ import annotations

import pytest

from flowgraph import optim

from .helpers import ATOL, RTOL, Pair, assert_close_params, float64_reference, run_pair, step_both

torch = pytest.importorskip("torch")

STEPS = 20

GRID = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.5, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.05, maximize=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, centered=True)),
    ("RMSprop", dict(lr=0.005, centered=True, momentum=0.5, weight_decay=0.01, maximize=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, initial_accumulator_value=0.5, eps=1e-6, maximize=True)),
    ("RAdam", dict(lr=0.01)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1)),  # rho_t > 5 from step 6 on
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1, decoupled_weight_decay=True)),
    ("NAdam", dict(lr=0.01)),
    ("NAdam", dict(lr=0.01, momentum_decay=0.01, weight_decay=0.1)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
]


def _ids(case):
    name, opts = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("case", GRID, ids=[_ids(c) for c in GRID])
def test_matches_torch(device, case):
    name, opts = case
    pair = Pair(device, sign=-1.0 if opts.get("maximize") else 1.0)
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    run_pair(pair, fopt, topt, STEPS, reference=float64_reference(pair, name, opts))


def test_a_wrong_update_is_caught(device):
    """The float64-derived tolerance still fails an optimizer that is slightly wrong (momentum 0.9 vs 0.89)."""
    pair = Pair(device)
    fopt = optim.SGD(pair.fp, lr=0.1, momentum=0.89)
    topt = torch.optim.SGD(pair.tp, lr=0.1, momentum=0.9)
    with pytest.raises(AssertionError, match="float64 trajectory"):
        run_pair(pair, fopt, topt, STEPS, reference=float64_reference(pair, "SGD", dict(lr=0.1, momentum=0.9)))


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "RAdam", "NAdam"])
def test_param_groups_with_different_lr(device, name):
    pair = Pair(device)
    extra = {"momentum": 0.9} if name == "SGD" else {}
    fopt = getattr(optim, name)([{"params": pair.fp[:2]}, {"params": pair.fp[2:], "lr": 0.003}],
                                lr=0.02, **extra)
    topt = getattr(torch.optim, name)([{"params": pair.tp[:2]}, {"params": pair.tp[2:], "lr": 0.003}],
                                      lr=0.02, **extra)
    assert fopt.param_groups[1]["lr"] == 0.003 and fopt.param_groups[0]["lr"] == 0.02
    run_pair(pair, fopt, topt, STEPS)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "RAdam", "NAdam"])
def test_frozen_parameter_untouched_and_stateless(device, name):
    pair = Pair(device)
    frozen = pair.fp[1]
    frozen.requires_grad_(False)
    before = frozen.numpy().copy()
    opt = getattr(optim, name)(pair.fp, lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        pair.fg_backward()
        opt.step()
    assert (frozen.numpy() == before).all()
    assert frozen not in opt.state
    assert all(p in opt.state for p in (pair.fp[0], pair.fp[2])) or name == "SGD"
    # a parameter that requires grad but has no .grad is skipped too
    loose = pair.fp[2]
    loose.grad = None
    value = loose.detach().numpy().copy()
    opt.step()
    assert (loose.detach().numpy() == value).all()


@pytest.mark.parametrize("case", [GRID[1], GRID[7], GRID[11], GRID[16], GRID[19], GRID[22], GRID[25]],
                         ids=_ids)
def test_state_dict_round_trip_continues_identically(device, case):
    name, opts = case
    sign = -1.0 if opts.get("maximize") else 1.0
    straight, resumed = Pair(device, sign=sign), Pair(device, sign=sign)
    opt_a = getattr(optim, name)(straight.fp, **opts)
    opt_b = getattr(optim, name)(resumed.fp, **opts)

    def one(pair, opt):
        opt.zero_grad()
        pair.fg_backward()
        opt.step()

    for _ in range(5):
        one(straight, opt_a)
        one(resumed, opt_b)
    saved = opt_b.state_dict()
    assert sorted(saved["state"]) == [0, 1, 2]
    assert saved["param_groups"][0]["params"] == [0, 1, 2]
    # a fresh optimizer over the same parameters continues where the old one stopped
    opt_c = getattr(optim, name)(resumed.fp, **{**opts, "lr": 123.0})
    opt_c.load_state_dict(saved)
    assert opt_c.param_groups[0]["lr"] == opts["lr"]
    for _ in range(5):
        one(straight, opt_a)
        one(resumed, opt_c)
        for a, b in zip(straight.fp, resumed.fp):
            assert (a.detach().numpy() == b.detach().numpy()).all()
    # loading copies buffers: stepping the new optimizer leaves the saved dict unchanged
    first = next(iter(opt_c.state.values()))
    key = next(k for k, v in first.items() if hasattr(v, "shape"))
    assert first[key] is not saved["state"][0][key]


@pytest.mark.parametrize("case", [GRID[2], GRID[8], GRID[16], GRID[19], GRID[22], GRID[25]], ids=_ids)
def test_load_torch_state_dict(device, case):
    name, opts = case
    pair = Pair(device, sign=-1.0 if opts.get("maximize") else 1.0)
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    for _ in range(4):
        topt.zero_grad()
        pair.torch_backward()
        topt.step()
    with torch.no_grad():
        for f, t in zip(pair.fp, pair.tp):
            f.detach().copy_(t.detach().numpy())
    fopt.load_state_dict(topt.state_dict())
    run_pair(pair, fopt, topt, 6)


def test_fg_autograd_training_matches_torch(device):
    """End to end: flowgraph's own gradients drive Adam (agreement bounded by autograd's float32 noise)."""
    pair = Pair(device)
    fopt = optim.Adam(pair.fp, lr=0.01)
    topt = torch.optim.Adam(pair.tp, lr=0.01)
    for _ in range(STEPS):
        step_both(pair, fopt, topt, autograd=True)
    assert_close_params(pair.fp, pair.tp, 1e-4, 1e-5)


@pytest.mark.parametrize("case", GRID, ids=[_ids(c) for c in GRID])
def test_matches_torch_float64(device, case):
    """In float64 the rearranged formulas agree with PyTorch's to ~1e-12: the updates are the same maths."""
    import flowgraph as fg

    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    name, opts = case
    pair = Pair(device, sign=-1.0 if opts.get("maximize") else 1.0)
    pair.fp = [fg.tensor(p.detach().numpy().astype("float64"), device=device, requires_grad=True) for p in pair.fp]
    pair.tp = [torch.tensor(p.detach().numpy().astype("float64"), requires_grad=True) for p in pair.tp]
    pair.tx, pair.ty = pair.tx.double(), pair.ty.double()
    fopt = getattr(optim, name)(pair.fp, **opts)
    topt = getattr(torch.optim, name)(pair.tp, **opts)
    run_pair(pair, fopt, topt, STEPS, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, sched, kwargs", [
    ("Adam", "OneCycleLR", dict(max_lr=0.05, total_steps=STEPS)),                 # cycles lr and beta1
    ("SGD", "CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=4)),           # cycles lr and momentum
    ("RMSprop", "CosineAnnealingLR", dict(T_max=7)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_training_with_scheduler_matches_torch(device, name, sched, kwargs):
    """Schedulers change lr/betas/momentum between steps; the optimizers pick them up as torch's do."""
    from flowgraph.optim import lr_scheduler

    pair = Pair(device)
    extra = {"momentum": 0.9} if name == "SGD" else {}
    fopt = getattr(optim, name)(pair.fp, lr=0.01, **extra)
    topt = getattr(torch.optim, name)(pair.tp, lr=0.01, **extra)
    fs = getattr(lr_scheduler, sched)(fopt, **kwargs)
    ts = getattr(torch.optim.lr_scheduler, sched)(topt, **kwargs)
    for step in range(STEPS):
        step_both(pair, fopt, topt, fs, ts)
        assert_close_params(pair.fp, pair.tp, RTOL, ATOL, f"after step {step + 1}")
