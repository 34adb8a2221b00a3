"""fg.jit and fg.capture on every backend: jitted training equals eager training step for step.

The first call of a signature is eager, the second is recorded (and trains), later calls replay: on cpu and
opencl as recorded backend calls, on cuda as a CUDA graph. Every guard that forces a new recording is
exercised here, and so are the errors of the rules a jitted step follows.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
import flowgraph.nn.functional as F
from flowgraph import nn, optim
from flowgraph.errors import FlowError

F32 = np.float32


def _batches(n_steps, seed=1, short_at=None, inf_at=None):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_steps):
        n = 5 if i == short_at else 12
        x = rng.standard_normal((n, 8)).astype(F32)
        y = (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2]).astype(F32)  # learnable
        if i == inf_at:
            x[0, 0] = np.inf
        out.append((x, y))
    return out


def _train(device, jitted, opt_name, steps=20, events=None, scaler=False, seed=0):
    """20 steps of a small model with dropout and BatchNorm; ``events`` maps a step index to a change."""
    fg.manual_seed(seed)
    # no bias before BatchNorm: its gradient is rounding noise, which Adam would amplify into the comparison
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.GELU(), nn.Dropout(0.2),
                          nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    kw = {"SGD": dict(lr=0.05, momentum=0.9), "Adam": dict(lr=1e-2), "AdamW": dict(lr=1e-2, amsgrad=True),
          "RMSprop": dict(lr=1e-2, momentum=0.5)}[opt_name]
    opt = getattr(optim, opt_name)(model.parameters(), **kw)
    sched = optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    gs = optim.GradScaler(init_scale=2.0 ** 8, growth_interval=3) if scaler else None

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if gs is None:
            loss.backward()
            opt.step()
        else:
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
        return loss

    run = fg.jit(step) if jitted else step
    losses = []
    for i, (x, y) in enumerate(_batches(steps, short_at=(events or {}).get("short"),
                                        inf_at=(events or {}).get("inf"))):
        if events and events.get("freeze") == i:
            model[0].weight.requires_grad_(False)
        if events and events.get("eval") == i:
            model.eval()
        if events and events.get("momentum") == i:
            for g in opt.param_groups:
                g["momentum" if opt_name in ("SGD", "RMSprop") else "weight_decay"] = 0.1
        losses.append(run(fg.tensor(x, device=device), fg.tensor(y, device=device)).item())
        sched.step()
    params = [p.detach().numpy() for p in model.parameters()] + [b.numpy() for b in model.buffers()]
    return np.array(losses), params, run


# On cpu and opencl optimizer steps are host units (their Python replayed), so a jitted run equals the eager
# one bit for bit; on cuda Adam's bias corrections use the device step count of the graph form (float32 on
# the device instead of float64 on the host): a few ulps per step, hence the tolerance there.
def _tol(device):
    return dict(rtol=0, atol=0) if not device.startswith("cuda") else dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW", "RMSprop"])
def test_jit_equals_eager_step_for_step(device, opt_name):
    events = {"short": 9, "freeze": 13, "momentum": 16}
    eager, eager_params, _ = _train(device, False, opt_name, events=events)
    jitted, jit_params, step = _train(device, True, opt_name, events=events)
    assert eager[-4:].mean() < eager[:4].mean()  # it trains
    np.testing.assert_allclose(jitted, eager, **_tol(device))
    for p, q in zip(jit_params, eager_params):
        np.testing.assert_allclose(p, q, **_tol(device))
    # full batches: recorded at step 1, again after the freeze (13) and the momentum change (16); the short
    # batch (step 9) ran once, eagerly; the lr halvings of the scheduler needed no recording.
    assert step.recordings == 3
    assert "momentum" in step.last_miss or "hyper-parameters" in step.last_miss


def test_jit_eval_mode_records_again(device):
    eager, eager_params, _ = _train(device, False, "SGD", events={"eval": 10})
    jitted, jit_params, step = _train(device, True, "SGD", events={"eval": 10})
    np.testing.assert_allclose(jitted, eager, **_tol(device))
    for p, q in zip(jit_params, eager_params):
        np.testing.assert_allclose(p, q, **_tol(device))
    assert step.recordings == 2 and "training" in step.last_miss


def test_jit_with_grad_scaler_skips_like_eager(device):
    events = {"inf": 7}
    eager, eager_params, _ = _train(device, False, "Adam", events=events, scaler=True)
    jitted, jit_params, _ = _train(device, True, "Adam", events=events, scaler=True)
    assert not np.isfinite(eager[7]) and np.isfinite(eager[8:]).all()
    np.testing.assert_allclose(jitted, eager, **_tol(device))  # inf/NaN at the same step
    assert np.isfinite(jit_params[0]).all()  # the weights skipped the overflowing step
    for p, q in zip(jit_params, eager_params):  # BatchNorm's running stats saw the inf batch in both
        np.testing.assert_allclose(p, q, **_tol(device))


def _sgd_by_hand(w, lr, runs):
    """A step that counts how often its Python runs: ``loss = sum(w * x)``, then ``w -= lr * grad``."""
    def step(x):
        runs.append(1)
        w.grad = None
        loss = (w * x).sum()
        loss.backward()
        with fg.no_grad():
            w.sub_(w.grad * lr)
        return loss

    return step


def test_each_call_is_one_step_and_the_body_runs_twice(device):
    w = fg.tensor([1.0, 2.0], device=device, requires_grad=True)
    runs = []
    step = fg.jit(_sgd_by_hand(w, 0.5, runs))
    losses = [step(fg.tensor([1.0, 1.0], device=device)) for _ in range(4)]
    assert len(runs) == 2  # eager, then recorded; calls 3 and 4 replayed without running Python
    # w: [1, 2] -> [0.5, 1.5] -> [0, 1] -> [-0.5, 0.5] -> [-1, 0]; each call returned its own loss
    assert [t.item() for t in losses] == [3.0, 2.0, 1.0, 0.0]
    np.testing.assert_allclose(w.detach().numpy(), [-1.0, 0.0])
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 1.0])


def test_replays_read_each_call_s_inputs_whatever_their_layout(device):
    """A replay copies each call's inputs into the recording's own (a CUDA graph reads fixed addresses): dense
    inputs, a transposed view, a lazy result and the same tensor twice all give the eager answer, and a
    returned output is the caller's (the next replay does not overwrite it)."""
    w = fg.tensor(np.arange(6, dtype=F32).reshape(3, 2), device=device)

    @fg.jit
    def f(x, b):
        return x.t() @ w + b

    rng = np.random.default_rng(3)
    outs, expected = [], []
    for i in range(6):
        xs = rng.standard_normal((3, 4)).astype(F32)
        bs = rng.standard_normal((4, 2)).astype(F32)
        x = fg.tensor(np.ascontiguousarray(xs.T), device=device).t() if i % 2 else fg.tensor(xs, device=device)
        b = fg.tensor(bs, device=device) * 1.0 if i == 4 else fg.tensor(bs, device=device)  # i == 4: lazy
        outs.append(f(x, b))
        expected.append(xs.T @ np.arange(6, dtype=F32).reshape(3, 2) + bs)
    same = fg.tensor(rng.standard_normal((3, 4)).astype(F32), device=device)
    outs.append(f(same, same.t()[:, :2] * 0 + 1))
    expected.append(same.numpy().T @ np.arange(6, dtype=F32).reshape(3, 2) + 1)
    for out, exp in zip(outs, expected):
        np.testing.assert_allclose(out.numpy(), exp, rtol=1e-5, atol=1e-5)


def test_mixed_layout_products_replay_the_eager_values_and_layout(device):
    """Two-operand elementwise ops on operands laid out in two axis orders (a batch-last activation against an
    NCHW mask and target, 73,728 elements: past the NumPy backend's relaying threshold), forward and backward:
    every replay gives eager's values, loss and gradient, bit for bit, and the result keeps the layout the
    recording saw (the ops after it were recorded against that layout)."""
    rng = np.random.default_rng(5)
    shape = (8, 16, 24, 24)
    w = fg.tensor(rng.standard_normal((16, 24, 24, 8)).astype(F32), device=device, requires_grad=True)

    def step(mask, target):
        w.grad = None
        act = w.permute(3, 0, 1, 2)  # (N, C, H, W) read from a batch-last buffer
        y = act * mask
        loss = ((y - target) * (y - target)).sum()
        loss.backward()
        return y, loss

    jitted = fg.jit(step)
    for i in range(4):
        mask = fg.tensor((rng.random(shape) < 0.7).astype(F32), device=device)
        target = fg.tensor(rng.standard_normal(shape).astype(F32), device=device)
        y_e, loss_e = step(mask, target)
        grad_e = w.grad.numpy()
        y_j, loss_j = jitted(mask, target)
        np.testing.assert_array_equal(y_j.numpy(), y_e.detach().numpy())
        np.testing.assert_array_equal(loss_j.numpy(), loss_e.detach().numpy())
        np.testing.assert_array_equal(w.grad.numpy(), grad_e)
        assert y_j.is_contiguous() == y_e.is_contiguous(), i
        if device == "cpu":  # numpy() shares the array there, strides included
            assert y_j.numpy().strides == y_e.detach().numpy().strides, i
    if device == "cpu":  # the replayed calls include relaid ones (the recorded program's own list)
        (entry,) = jitted._cache.values()
        relaid = [fn.__qualname__ for fn, *_ in entry.program.calls if "relaid" in getattr(fn, "__qualname__", "")]
        assert relaid, "no mixed-layout call was relaid"


def test_numpy_replays_relay_one_operand_of_a_mixed_layout_op():
    """``NumpyBackend.replay_call``: a ufunc on two same-shape operands in two layouts, one of them the
    result's, replays as a copy of the other into that layout and the ufunc, with the same values and result
    layout; small, broadcast, keyword and non-ufunc calls replay as recorded."""
    from flowgraph.backends.array_backend import NumpyBackend

    bk = NumpyBackend()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 24, 24, 8)).astype(F32).transpose(3, 0, 1, 2)  # batch-last
    b = rng.standard_normal((8, 16, 24, 24)).astype(F32)  # NCHW
    for fn, args in ((np.multiply, (a, b)), (np.subtract, (b, a)), (np.greater, (a, b))):
        out = fn(*args)
        replay = bk.replay_call(fn, args, {}, out)
        assert replay is not fn
        again = replay(*args)
        np.testing.assert_array_equal(again, out)
        assert again.strides == out.strides
    small = a[:2], b[:2]  # 18,432 elements: mixed, but below the threshold
    assert bk.replay_call(np.multiply, small, {}, np.multiply(*small)) is np.multiply
    assert bk.replay_call(np.multiply, (a, b[:1]), {}, np.multiply(a, b[:1])) is np.multiply  # broadcast
    assert bk.replay_call(np.multiply, (a, a), {}, np.multiply(a, a)) is np.multiply  # one layout
    assert bk.replay_call(np.add, (a, b), {"dtype": np.float64}, np.add(a, b, dtype=np.float64)) is np.add
    assert bk.replay_call(bk.sum, (a, None, False), {}, bk.sum(a, None, False)) == bk.sum


def test_host_read_inside_a_jitted_step_names_the_line(device):
    w = fg.ones(3, device=device, requires_grad=True)

    @fg.jit
    def step(x):
        loss = (w * x).sum()
        if loss.item() > 0:  # decides control flow: a replay could not follow it
            loss = loss * 2
        return loss

    x = fg.ones(3, device=device)
    assert step(x).item() == 6.0  # the first call is eager
    with pytest.raises(FlowError, match=r"at .*test_jit.py:\d+: if loss.item"):
        step(x)


def test_cache_is_bounded_and_signatures_record_separately(device):
    w = fg.ones(4, device=device, requires_grad=True)

    @fg.jit(cache_size=2)
    def fwd(x):
        return (x @ w).tanh()

    for n in (1, 2, 3, 1):
        for _ in range(3):
            out = fwd(fg.ones(n, 4, device=device))
            np.testing.assert_allclose(out.numpy(), np.full(n, np.tanh(4.0), F32), rtol=1e-6)
    assert len(fwd._cache) == 2
    assert fwd.recordings == 4  # n=1 was dropped when n=3 came, so it was recorded again


def test_random_numbers_change_per_replay(device):
    @fg.jit
    def draw(x):
        return x + fg.rand(64, device=device)

    z = fg.zeros(64, device=device)
    draws = [draw(z).numpy() for _ in range(4)]
    assert all(not np.array_equal(a, b) for a, b in zip(draws, draws[1:]))
    assert all(0 <= d.min() and d.max() < 1 for d in draws)


def test_replaced_parameter_records_again(device):
    lin = nn.Linear(3, 1).to(device)

    @fg.jit
    def fwd(x):
        return lin(x)

    x = fg.ones(2, 3, device=device)
    fwd(x), fwd(x), fwd(x)
    lin.weight = nn.Parameter(fg.zeros(1, 3, device=device))
    with fg.no_grad():
        lin.bias.fill_(0.25)
    np.testing.assert_allclose(fwd(x).detach().numpy(), [[0.25], [0.25]])
    assert fwd.recordings == 2 and "replaced" in fwd.last_miss


def test_jit_errors_name_what_is_wrong(device):
    with pytest.raises(FlowError, match="callable"):
        fg.jit(3)
    with pytest.raises(FlowError, match="cache_size"):
        fg.jit(lambda x: x, cache_size=0)
    with pytest.raises(FlowError, match="no tensor argument"):
        fg.jit(lambda n: n)(3)


@pytest.mark.parametrize("opt_name", ["Adagrad", "Adadelta", "NAdam", "Rprop"])
def test_every_optimizer_jits_on_cpu_and_opencl(device, opt_name):
    """Host units replay the optimizer's Python: optimizers without a graph form work (not on cuda)."""
    def run(jitted):
        fg.manual_seed(0)
        w = fg.randn(5, 3, device=device).requires_grad_()
        opt = getattr(optim, opt_name)([w], lr=0.05)

        def step(x):
            opt.zero_grad()
            loss = (x @ w).tanh().pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        f = fg.jit(step) if jitted else step
        x = fg.randn(8, 5, device=device)
        if device.startswith("cuda") and jitted:
            with pytest.raises(FlowError, match="cannot run inside fg.capture"):
                f(x)
            return None
        return [f(x).item() for _ in range(6)], w.detach().numpy()

    jitted = run(True)
    if jitted is not None:
        eager = run(False)
        assert jitted[0] == eager[0]
        np.testing.assert_array_equal(jitted[1], eager[1])


def test_capture_is_the_fixed_signature_form(device):
    w = fg.tensor([1.0, 2.0], device=device, requires_grad=True)
    runs = []
    step = _sgd_by_hand(w, 0.1, runs)
    graphed = fg.capture(step, fg.tensor([1.0, 1.0], device=device))
    assert runs == []  # nothing runs at construction: no warm-up steps on the example
    assert graphed(fg.tensor([2.0, 0.0], device=device)).item() == pytest.approx(2.0)
    assert graphed(fg.tensor([2.0, 0.0], device=device)).item() == pytest.approx(1.6)
    assert graphed(fg.tensor([2.0, 0.0], device=device)).item() == pytest.approx(1.2)
    np.testing.assert_allclose(w.detach().numpy(), [0.4, 2.0], rtol=1e-6)
    with pytest.raises(FlowError, match="another signature"):
        graphed(fg.tensor([1.0, 2.0, 3.0], device=device))
    with pytest.raises(FlowError, match="example input tensor"):
        fg.capture(step, 3)


def test_graph_record_inside_a_jitted_step_records_every_replay(device):
    from flowgraph import FlowBuilder

    model = FlowBuilder.from_(nn.Linear(4, 4)).through(nn.Linear(4, 1)).build().to(device)
    opt = optim.SGD(model.parameters(), lr=0.01)

    @fg.jit
    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        model.record("loss", loss)  # a metric read: one host_call, run again on every replay
        loss.backward()
        opt.step()
        return loss

    x = fg.ones(3, 4, device=device)
    losses = [step(x).item() for _ in range(5)]
    model.flush()
    assert model.trend("loss").values == pytest.approx([float(np.mean(losses))], rel=1e-6)


def test_autocast_inside_and_around_a_jitted_step(device):
    low = fg.float16 if device.startswith("opencl") else fg.bfloat16  # OpenCL has no bfloat16
    try:
        fg.ones(2, device=device).to(low)
    except fg.BackendError as exc:
        pytest.skip(f"{low} not on {device}: {exc}")

    def run(jitted):
        fg.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1)).to(device)
        opt = optim.SGD(model.parameters(), lr=0.05)

        def step(x, y):
            opt.zero_grad()
            with fg.autocast(low):
                out = model(x)
            loss = F.mse_loss(out.float(), y)
            loss.backward()
            opt.step()
            return loss

        f = fg.jit(step) if jitted else step
        return [f(fg.tensor(x, device=device), fg.tensor(y, device=device)).item() for x, y in _batches(6)]

    np.testing.assert_allclose(run(True), run(False), rtol=1e-6)


def test_activation_checkpointing_inside_a_jitted_step(device):
    """The recompute in backward restores the RNG state of its forward on every replay (same dropout masks)."""
    from flowgraph.utils.checkpoint import checkpoint

    def run(jitted):
        fg.manual_seed(0)
        block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, 8)).to(device)
        head = nn.Linear(8, 1).to(device)
        opt = optim.SGD([*block.parameters(), *head.parameters()], lr=0.05)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(head(checkpoint(block, x)), y)
            loss.backward()
            opt.step()
            return loss

        f = fg.jit(step) if jitted else step
        losses = [f(fg.tensor(x, device=device), fg.tensor(y, device=device)).item() for x, y in _batches(6)]
        return losses, [p.detach().numpy() for p in block.parameters()]

    (jl, jp), (el, ep) = run(True), run(False)
    np.testing.assert_allclose(jl, el, **_tol(device))
    for a, b in zip(jp, ep):
        np.testing.assert_allclose(a, b, **_tol(device))


def test_compiled_replay_runs_calls_as_recorded():
    """The generated replay function (``runtime._compile_calls``): list, tuple and other sequence arguments,
    keyword arguments, nested outputs with unused slots, arrays dropped after their last reader and only the
    kept ones written back."""
    from flowgraph.runtime import _compile_calls, _Ref, _Seq

    class Pair(tuple):
        pass

    log = []

    def split(a, scale=1.0):
        log.append("split")
        return (a * scale, (a + 1, None), a - 1)

    def total(parts, extra):
        log.append(("total", type(parts).__name__, type(extra).__name__))
        return sum(parts) + sum(extra)

    calls = [
        (split, (_Ref(0),), {"scale": 2.0}, (1, (2, None), 3), (3,)),  # slot 3 is never read: dropped at once
        (total, (_Seq(list, (_Ref(1), _Ref(2))), _Seq(Pair, (_Ref(0), _Ref(4)))), {}, 5, (1, 2)),
    ]
    run = _compile_calls(calls, keep={5})
    env = [np.array([1.0]), None, None, None, np.array([10.0]), None]
    run(env)
    # split(1) -> 2, (2, None), 0; total([2, 2], Pair(1, 10)) = 15
    assert env[5].tolist() == [15.0]
    assert env[1] is None and env[2] is None and env[3] is None  # intermediates stay local to the replay
    assert log == ["split", ("total", "list", "Pair")]
