"""GradScaler: skips steps on inf/NaN and moves its scale exactly as torch.amp.GradScaler does."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import optim

torch = pytest.importorskip("torch")

# Per iteration: None = clean gradients, "inf"/"nan" = poison one gradient element.
PATTERN = [None, None, "inf", None, None, None, "nan", None, None, None, None, None, "inf", "inf", None,
           None, None, None, None, None]


def _grads(step: int, poison):
    rng = np.random.default_rng(step)
    gs = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    if poison is not None:
        gs[step % 2].reshape(-1)[1] = np.float32(poison)
    return gs


@pytest.mark.parametrize("growth_interval", [1, 3])
def test_scale_sequence_and_skips_match_torch(device, growth_interval):
    init = np.random.default_rng(0)
    values = [init.standard_normal((3, 2)).astype(np.float32), init.standard_normal(4).astype(np.float32)]
    fp = [fg.tensor(v, device=device, requires_grad=True) for v in values]
    tp = [torch.tensor(v, requires_grad=True) for v in values]
    fopt, topt = optim.SGD(fp, lr=0.1, momentum=0.9), torch.optim.SGD(tp, lr=0.1, momentum=0.9)
    kwargs = dict(init_scale=2.0 ** 10, growth_factor=4.0, backoff_factor=0.25, growth_interval=growth_interval)
    fs = optim.GradScaler(**kwargs)
    ts = torch.amp.GradScaler("cpu", **kwargs)
    floss = fs.scale(fg.tensor(1.5, device=device))
    tloss = ts.scale(torch.tensor(1.5))
    assert floss.item() == tloss.item() == 1.5 * 2 ** 10
    skipped = 0
    for step, poison in enumerate(PATTERN):
        scale = fs.get_scale()
        assert scale == ts.get_scale()
        for p, t, g in zip(fp, tp, _grads(step, poison)):
            p.grad = fg.tensor(g * scale, device=device)   # what backward of a scaled loss would give
            t.grad = torch.tensor(g * scale)
        before = [p.detach().numpy().copy() for p in fp]
        fs.step(fopt)
        ts.step(topt)
        fs.update()
        ts.update()
        if poison is not None:
            skipped += 1
            assert all((b == p.detach().numpy()).all() for b, p in zip(before, fp)), f"step {step} not skipped"
        for p, t in zip(fp, tp):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-7)
        assert fs.state_dict() == ts.state_dict()
    assert skipped == 4


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_skips_on_the_device_inside_capture(device, opt_name):
    """Inside fg.capture step() must not read the flag: the step is undone on the device instead. Simulated
    here on every backend by turning capture mode on as fg.capture does; same results as PyTorch's skips."""
    from flowgraph.autograd.grad_mode import STATE

    init = np.random.default_rng(0)
    values = [init.standard_normal((3, 2)).astype(np.float32), init.standard_normal(4).astype(np.float32)]
    fp = [fg.tensor(v, device=device, requires_grad=True) for v in values]
    tp = [torch.tensor(v, requires_grad=True) for v in values]
    kw = dict(lr=0.1, momentum=0.9) if opt_name == "SGD" else dict(lr=0.01)
    fopt, topt = getattr(optim, opt_name)(fp, **kw), getattr(torch.optim, opt_name)(tp, **kw)
    fs = optim.GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    ts = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    fs.scale(fg.tensor(1.0, device=device))
    ts.scale(torch.tensor(1.0))
    for step, poison in enumerate(PATTERN):
        scale = fs.get_scale()
        for p, t, g in zip(fp, tp, _grads(step, poison)):
            p.grad = fg.tensor(g * scale, device=device)
            t.grad = torch.tensor(g * scale)
        prev, STATE.capture_hooks = STATE.capture_hooks, []
        try:
            fs.step(fopt)  # a host read here would be an error under a real capture
            fs.update()
        finally:
            STATE.capture_hooks = prev
        ts.step(topt)
        ts.update()
        for p, t in zip(fp, tp):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {step} ({poison})")
        assert fs.get_scale() == ts.get_scale()


def test_unscale_then_clip_then_step(device):
    p = fg.tensor([1.0, 2.0], device=device, requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    scaler = optim.GradScaler(init_scale=8.0)
    scaler.scale((p * p).sum()).backward()
    np.testing.assert_allclose(p.grad.numpy(), [16.0, 32.0])
    scaler.unscale_(opt)
    np.testing.assert_allclose(p.grad.numpy(), [2.0, 4.0])
    with pytest.raises(fg.FlowError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    np.testing.assert_allclose(p.detach().numpy(), [-1.0, -2.0])
    with pytest.raises(fg.FlowError, match="after step"):
        scaler.unscale_(opt)
    scaler.update()
    assert scaler.get_scale() == 8.0


def test_scale_nested_and_disabled(device):
    scaler = optim.GradScaler(init_scale=4.0)
    a, b = fg.tensor([1.0], device=device), fg.tensor([2.0], device=device)
    out = scaler.scale([a, (b,)])
    assert out[0].item() == 4.0 and out[1][0].item() == 8.0
    off = optim.GradScaler(enabled=False)
    assert off.scale(a) is a and off.get_scale() == 1.0 and off.state_dict() == {}
    p = fg.tensor([1.0], device=device, requires_grad=True)
    p.grad = fg.tensor([math.inf], device=device)
    opt = optim.SGD([p], lr=1.0)
    off.step(opt)  # disabled: a plain step, even with inf
    assert math.isinf(p.detach().numpy()[0])


def test_state_dict_round_trip_and_torch_format():
    ts = torch.amp.GradScaler("cpu", init_scale=2.0 ** 5, growth_interval=2)
    fs = optim.GradScaler(init_scale=1.0)
    fs.load_state_dict(ts.state_dict())
    assert fs.state_dict() == ts.state_dict()
    with pytest.raises(fg.FlowError, match="empty"):
        fs.load_state_dict({})


def test_errors():
    with pytest.raises(fg.FlowError, match="growth_factor"):
        optim.GradScaler(growth_factor=0.5)
    with pytest.raises(fg.FlowError, match="backoff_factor"):
        optim.GradScaler(backoff_factor=1.5)
    scaler = optim.GradScaler()
    opt = optim.SGD([fg.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(fg.FlowError, match="no scale yet"):
        scaler.step(opt)


def test_two_optimizers_one_overflow_backs_off_both(device):
    """An inf in one optimizer's gradients skips only that optimizer's step, and update() backs off once."""
    fa, fb = fg.tensor([1.0], device=device, requires_grad=True), fg.tensor([2.0], device=device, requires_grad=True)
    ta, tb = torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)
    fo = [optim.SGD([fa], lr=0.5), optim.SGD([fb], lr=0.5)]
    to = [torch.optim.SGD([ta], lr=0.5), torch.optim.SGD([tb], lr=0.5)]
    fs, ts = optim.GradScaler(init_scale=16.0, growth_interval=1), torch.amp.GradScaler("cpu", init_scale=16.0,
                                                                                       growth_interval=1)
    fs.scale(fg.tensor(1.0, device=device))
    ts.scale(torch.tensor(1.0))
    for grads in ([4.0, math.inf], [8.0, 16.0], [math.nan, 32.0]):
        fa.grad, fb.grad = fg.tensor([grads[0]], device=device), fg.tensor([grads[1]], device=device)
        ta.grad, tb.grad = torch.tensor([grads[0]]), torch.tensor([grads[1]])
        for f, t in zip(fo, to):
            fs.step(f)
            ts.step(t)
        fs.update()
        ts.update()
        assert fs.get_scale() == ts.get_scale()
        assert fa.item() == ta.item() and fb.item() == tb.item()
