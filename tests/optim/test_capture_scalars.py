"""The device-scalar path optimizers take inside fg.capture (step counts and lr as device tensors).

CUDA graphs need a GPU; the scalar path itself is plain tensor math, so it is checked here on every
backend by turning it on the way fg.capture does, and compared with the eager Python-float path.
"""

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import optim
from flowgraph.autograd.grad_mode import STATE
from flowgraph.errors import FlowError


def _run(cls, device, steps, capture_mode, lr_change_at=None, **kw):
    fg.manual_seed(0)
    w = fg.randn(5, 3, device=device).requires_grad_()
    x = fg.randn(8, 5, device=device)
    opt = cls([w], **kw)
    hooks = [] if capture_mode else None
    prev = STATE.capture_hooks
    try:
        for i in range(steps):
            if lr_change_at is not None and i == lr_change_at:
                opt.param_groups[0]["lr"] *= 0.1
            for h in hooks or ():
                h()
            STATE.capture_hooks = hooks
            loss = (x @ w).tanh().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            STATE.capture_hooks = prev
    finally:
        STATE.capture_hooks = prev
    return w.detach().numpy(), opt, hooks


@pytest.mark.parametrize("cls,kw", [
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    (optim.Adam, dict(lr=1e-2, weight_decay=1e-2)),
    (optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    (optim.RMSprop, dict(lr=1e-2, momentum=0.5, centered=True)),
])
def test_device_scalars_match_python_scalars(device, cls, kw):
    eager, _, _ = _run(cls, device, 12, False, lr_change_at=6, **kw)
    captured, opt, hooks = _run(cls, device, 12, True, lr_change_at=6, **kw)
    np.testing.assert_allclose(captured, eager, rtol=2e-5, atol=1e-6)
    assert len(hooks) == 1  # one lr refresh per group
    state = next(iter(opt.state.values()))
    if "step" in state:
        assert isinstance(state["step"], fg.Tensor) and state["step"].item() == 12


@pytest.mark.parametrize("cls", [optim.RAdam, optim.NAdam, optim.Adagrad])
def test_non_capturable_optimizers_say_so(cls):
    with pytest.raises(FlowError, match="cannot run inside fg.capture"):
        _run(cls, "cpu", 1, True, lr=1e-2)


def _run_many(device, steps, capture_mode, skip_b_at=()):
    """Adam over two groups of several parameters; parameter ``b`` has no gradient at the steps in ``skip_b_at``."""
    fg.manual_seed(1)
    a, b, c = (fg.randn(*s, device=device).requires_grad_() for s in [(4, 3), (3,), (3, 2)])
    x = fg.randn(6, 4, device=device)
    opt = optim.Adam([{"params": [a, b]}, {"params": [c], "lr": 3e-2}], lr=1e-2)
    hooks = [] if capture_mode else None
    prev = STATE.capture_hooks
    try:
        for i in range(steps):
            for h in hooks or ():
                h()
            STATE.capture_hooks = hooks
            h1 = x @ a
            if i not in skip_b_at:
                h1 = h1 + b
            loss = (h1.tanh() @ c).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            STATE.capture_hooks = prev
    finally:
        STATE.capture_hooks = prev
    return [t.detach().numpy() for t in (a, b, c)], opt


def test_batched_device_step_counts_match_per_parameter_counts(device):
    """Captured Adam batches parameters whose (host-shadowed) device step counts are equal, computing the step
    scalars once per batch; the result equals the eager path's, and a parameter left without a gradient keeps
    its own count."""
    eager, _ = _run_many(device, 6, False, skip_b_at=(3, 4))
    captured, opt = _run_many(device, 6, True, skip_b_at=(3, 4))
    for got, want in zip(captured, eager):  # float32 bias corrections on the device: a few ulps apart
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=5e-6)
    params = [q for grp in opt.param_groups for q in grp["params"]]
    assert [opt.state[q]["step"].item() for q in params] == [6.0, 4.0, 6.0]
    assert [opt._shadow_steps[id(opt.state[q])][1] for q in params] == [6.0, 4.0, 6.0]


def _run_model(device, steps, capture_mode, frozen=range(0)):
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.LayerNorm(8), fg.nn.Linear(8, 2)).to(device)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x = fg.randn(5, 4, device=device)
    prev = STATE.capture_hooks
    try:
        for i in range(steps):
            model[0].weight.requires_grad_(i not in frozen)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            STATE.capture_hooks = [] if capture_mode else prev
            opt.step()
            STATE.capture_hooks = prev
    finally:
        STATE.capture_hooks = prev
    return [p.detach().numpy() for p in model.parameters()], opt


@pytest.mark.parametrize("frozen", [range(0), range(2, 5)], ids=["all-step", "one-frozen-for-3-steps"])
def test_adam_device_step_counts_share_one_array_and_keep_their_own_values(device, frozen):
    """Adam's device step counts live in one array per group (one in-place add when all of them step) and
    each keeps its own value: a parameter frozen for some steps ends with fewer, as in eager Adam."""
    eager, _ = _run_model(device, 8, False, frozen)
    captured, opt = _run_model(device, 8, True, frozen)
    for got, ref in zip(captured, eager):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)
    params = opt.param_groups[0]["params"]
    counts = [opt.state[p]["step"].item() for p in params]
    assert counts == [8 - len(frozen)] + [8] * (len(params) - 1)
    arrays = opt.__dict__["_step_arrays"]
    assert len({id(arrays[id(opt.state[p]["step"])][0]) for p in params}) == 1  # one array of counts
