"""Learning-rate schedulers: the lr (and momentum) sequences equal torch's exactly, step for step."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import optim
from flowgraph.optim import lr_scheduler as fls

torch = pytest.importorskip("torch")
tls = torch.optim.lr_scheduler

STEPS = 100


def _optimizers(kind: str = "SGD", groups: int = 2):
    """The same optimizer in both frameworks with ``groups`` param groups of different lr."""
    fps = [fg.zeros(2, requires_grad=True) for _ in range(groups)]
    tps = [torch.zeros(2, requires_grad=True) for _ in range(groups)]
    extra = {"momentum": 0.9} if kind == "SGD" else {}
    fopt = getattr(optim, kind)([{"params": [p], "lr": 0.1 * (i + 1)} for i, p in enumerate(fps)], **extra)
    topt = getattr(torch.optim, kind)([{"params": [p], "lr": 0.1 * (i + 1)} for i, p in enumerate(tps)], **extra)
    return fopt, topt


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups]


def _assert_same(fopt, topt, fs, ts, step):
    assert [g["lr"] for g in fopt.param_groups] == [g["lr"] for g in topt.param_groups], f"lr at step {step}"
    assert fs.get_last_lr() == ts.get_last_lr(), f"get_last_lr at step {step}"
    assert _momenta(fopt) == _momenta(topt), f"momentum at step {step}"


# (name, kwargs, optimizer kind, steps)
CASES = [
    ("StepLR", dict(step_size=7, gamma=0.5), "SGD", STEPS),
    ("MultiStepLR", dict(milestones=[10, 30, 30, 75], gamma=0.3), "SGD", STEPS),
    ("ExponentialLR", dict(gamma=0.97), "SGD", STEPS),
    ("CosineAnnealingLR", dict(T_max=30), "SGD", STEPS),
    ("CosineAnnealingLR", dict(T_max=17, eta_min=0.01), "SGD", STEPS),
    ("LinearLR", dict(start_factor=0.1, total_iters=10), "SGD", STEPS),
    ("LinearLR", dict(start_factor=0.5, end_factor=0.2, total_iters=40), "SGD", STEPS),
    ("ConstantLR", dict(factor=0.25, total_iters=6), "SGD", STEPS),
    ("PolynomialLR", dict(total_iters=50, power=2.0), "SGD", STEPS),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=STEPS), "SGD", STEPS),
    ("OneCycleLR", dict(max_lr=[1.0, 0.5], total_steps=STEPS, anneal_strategy="linear"), "SGD", STEPS),
    ("OneCycleLR", dict(max_lr=1.0, epochs=10, steps_per_epoch=10, three_phase=True), "Adam", STEPS),
    ("OneCycleLR", dict(max_lr=0.3, total_steps=STEPS, cycle_momentum=False, pct_start=0.2,
                        div_factor=10.0, final_div_factor=100.0), "RMSprop", STEPS),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=7), "SGD", STEPS),
    ("CyclicLR", dict(base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=5, step_size_down=11, mode="triangular2"),
     "SGD", STEPS),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=6, mode="exp_range", gamma=0.98), "Adam", STEPS),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=6, cycle_momentum=False), "Adagrad", STEPS),
    ("CosineAnnealingWarmRestarts", dict(T_0=10), "SGD", STEPS),
    ("CosineAnnealingWarmRestarts", dict(T_0=3, T_mult=2, eta_min=0.001), "SGD", STEPS),
    ("LambdaLR", dict(lr_lambda=lambda e: 0.95 ** e + (e % 3) * 0.01), "SGD", STEPS),
    ("MultiplicativeLR", dict(lr_lambda=lambda e: 0.99 if e % 2 else 0.97), "SGD", STEPS),
]


def _case_id(case) -> str:
    name, kwargs = case[0], case[1]
    return name + "-" + "-".join(f"{k}={v}" for k, v in kwargs.items() if not callable(v))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sequence_matches_torch(case):
    name, kwargs, kind, steps = case
    fopt, topt = _optimizers(kind)
    fs = getattr(fls, name)(fopt, **kwargs)
    ts = getattr(tls, name)(topt, **kwargs)
    _assert_same(fopt, topt, fs, ts, 0)
    for step in range(1, steps + 1):
        fopt.step()
        topt.step()
        fs.step()
        ts.step()
        _assert_same(fopt, topt, fs, ts, step)


def _linear_then_cosine(lib, opt):
    warm = lib.LinearLR(opt, start_factor=0.1, total_iters=5)
    cos = lib.CosineAnnealingLR(opt, T_max=45)
    return lib.SequentialLR(opt, [warm, cos], milestones=[5])


def _three_phases(lib, opt):
    a = lib.ConstantLR(opt, factor=0.5, total_iters=3)
    b = lib.ExponentialLR(opt, gamma=0.9)
    c = lib.StepLR(opt, step_size=4, gamma=0.5)
    return lib.SequentialLR(opt, [a, b, c], milestones=[10, 40])


def _chained(lib, opt):
    return lib.ChainedScheduler([lib.ConstantLR(opt, factor=0.5, total_iters=8),
                                 lib.ExponentialLR(opt, gamma=0.95),
                                 lib.MultiStepLR(opt, milestones=[20, 60])])


def _sequential_inside_chained(lib, opt):
    warm = lib.LinearLR(opt, start_factor=0.2, total_iters=10)
    seq = lib.SequentialLR(opt, [warm, lib.CosineAnnealingLR(opt, T_max=30)], milestones=[10])
    return lib.ChainedScheduler([seq, lib.StepLR(opt, step_size=25, gamma=0.5)])


@pytest.mark.parametrize("build", [_linear_then_cosine, _three_phases, _chained, _sequential_inside_chained],
                         ids=lambda f: f.__name__.strip("_"))
def test_compositions_match_torch(build):
    fopt, topt = _optimizers()
    fs, ts = build(fls, fopt), build(tls, topt)
    _assert_same(fopt, topt, fs, ts, 0)
    for step in range(1, STEPS + 1):
        fopt.step()
        topt.step()
        fs.step()
        ts.step()
        _assert_same(fopt, topt, fs, ts, step)


METRICS = ([1.0 - 0.05 * i for i in range(10)] + [0.55] * 12 + [0.549999, 0.5, 0.5, 0.6] * 5
           + [0.3 + 0.01 * (i % 7) for i in range(40)] + [0.1] * 20)


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(mode="min", factor=0.5, patience=2, threshold=1e-3, cooldown=3),
    dict(mode="min", factor=0.5, patience=1, threshold=0.01, threshold_mode="abs", min_lr=0.01),
    dict(mode="max", factor=0.3, patience=3, cooldown=1, min_lr=[0.001, 0.05], eps=1e-3),
    dict(mode="max", factor=0.7, patience=0, threshold=0.02, threshold_mode="abs"),
], ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "defaults")
def test_reduce_on_plateau_matches_torch(kwargs):
    fopt, topt = _optimizers()
    fs = fls.ReduceLROnPlateau(fopt, **kwargs)
    ts = tls.ReduceLROnPlateau(topt, **kwargs)
    metrics = METRICS if kwargs.get("mode", "min") == "min" else [-m for m in METRICS]
    reductions = 0
    for step, m in enumerate(metrics):
        fopt.step()
        topt.step()
        before = fs.get_last_lr()
        fs.step(fg.tensor(m) if step % 2 else m)
        ts.step(m)
        reductions += fs.get_last_lr() != before
        _assert_same(fopt, topt, fs, ts, step)
    assert reductions > 0


@pytest.mark.parametrize("case", [CASES[3], CASES[9], CASES[14], CASES[17], CASES[19]], ids=_case_id)
def test_state_dict_round_trip(case):
    name, kwargs, kind, _ = case
    straight, _ = _optimizers(kind)
    resumed, _ = _optimizers(kind)
    s1 = getattr(fls, name)(straight, **kwargs)
    s2 = getattr(fls, name)(resumed, **kwargs)
    for _ in range(23):
        s1.step()
        s2.step()
    saved_opt, saved_sched = resumed.state_dict(), s2.state_dict()
    assert "optimizer" not in saved_sched
    fresh, _ = _optimizers(kind)
    fresh.load_state_dict(saved_opt)
    s3 = getattr(fls, name)(fresh, **kwargs)
    s3.load_state_dict(saved_sched)
    for _ in range(30):
        s1.step()
        s3.step()
        assert s1.get_last_lr() == s3.get_last_lr()
        assert _momenta(straight) == _momenta(fresh)


def test_step_with_epoch_uses_closed_form():
    fopt, topt = _optimizers()
    fs, ts = fls.StepLR(fopt, step_size=3, gamma=0.5), tls.StepLR(topt, step_size=3, gamma=0.5)
    with pytest.warns(UserWarning):
        ts.step(10)
    fs.step(10)
    assert fs.get_last_lr() == ts.get_last_lr()


def test_scheduler_errors():
    fopt, _ = _optimizers()
    with pytest.raises(fg.FlowError, match="SequentialLR: expected 1 milestones"):
        fls.SequentialLR(fopt, [fls.ConstantLR(fopt), fls.ExponentialLR(fopt, 0.9)], milestones=[])
    with pytest.raises(fg.FlowError, match="ReduceLROnPlateau"):
        fls.ChainedScheduler([fls.ReduceLROnPlateau(fopt)])
    with pytest.raises(fg.FlowError, match="factor must be < 1.0"):
        fls.ReduceLROnPlateau(fopt, factor=1.5)
    with pytest.raises(fg.FlowError, match="cycle_momentum"):
        fls.OneCycleLR(optim.Adagrad([fg.zeros(1, requires_grad=True)]), max_lr=0.1, total_steps=5)
    sched = fls.OneCycleLR(fopt, max_lr=0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(fg.FlowError, match="total_steps is 3"):
        sched.step()
    with pytest.raises(fg.FlowError, match="initial_lr"):
        fls.StepLR(optim.SGD([fg.zeros(1, requires_grad=True)]), step_size=2, last_epoch=4)
    with pytest.raises(fg.FlowError, match="expected a flowgraph optimizer"):
        fls.StepLR(object(), step_size=2)


def test_warm_restarts_fractional_epochs():
    fopt, topt = _optimizers()
    fs = fls.CosineAnnealingWarmRestarts(fopt, T_0=4, T_mult=2)
    ts = tls.CosineAnnealingWarmRestarts(topt, T_0=4, T_mult=2)
    for i in range(60):
        epoch = i / 5
        fs.step(epoch)
        ts.step(epoch)
        assert fs.get_last_lr() == ts.get_last_lr()
