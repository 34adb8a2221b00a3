"""fg.jit's replay on the CPU runs large row-wise calls on two threads (``Backend.row_parallel``): the same values
bit for bit, step for step, as the eager step and as the unsplit replay."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
import flowgraph.nn.functional as F
from flowgraph import nn, optim
from flowgraph.backends import get_backend
from flowgraph.backends.array_backend import NumpyBackend

F32 = np.float32


class _Block(nn.Module):
    """LayerNorm, a causal softmax attention and a GELU MLP: every kind of call the CPU replay splits."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, 5)

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / 4.0
        t = x.shape[1]
        mask = fg.tensor(np.tril(np.ones((t, t), dtype=bool)), device=x.device)
        att = F.softmax(att.masked_fill(mask.logical_not(), float("-inf")), dim=-1)
        x = x + att @ v
        x = x + self.proj(self.gelu(self.fc(x)))
        return self.head(x)


def _train(device, jitted, steps=6):
    fg.manual_seed(0)
    model = _Block().to(device)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    def step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 5), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = fg.jit(step) if jitted else step
    rng = np.random.default_rng(3)
    losses = []
    for _ in range(steps):
        x = fg.tensor(rng.standard_normal((8, 12, 16)).astype(F32), device=device)
        y = fg.tensor(rng.integers(0, 5, size=(8, 12)), device=device)
        losses.append(run(x, y).item())
    return np.array(losses), [p.detach().numpy() for p in model.parameters()], run


def test_split_replay_equals_eager_step_for_step(device, monkeypatch):
    # A low threshold makes this small model's calls split (the default is for 0.1-ms calls).
    monkeypatch.setattr(NumpyBackend, "_ROW_MIN", 64)
    eager, eager_params, _ = _train(device, False)
    jitted, jit_params, step = _train(device, True)
    program = next(iter(step._cache.values())).program
    if device == "cpu":
        assert program.split_calls >= 10  # GELU, LayerNorm, softmax's passes, the masked fill, ...
    else:
        assert program.split_calls == 0  # other backends keep the recorded calls
    assert eager[-2:].mean() < eager[:2].mean()  # it trains
    np.testing.assert_array_equal(jitted, eager)
    for p, q in zip(jit_params, eager_params):
        np.testing.assert_array_equal(p, q)


def test_row_parallel_computes_the_recorded_values():
    bk = get_backend("cpu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 7, 64)).astype(F32)  # 134400 elements: over the threshold
    w = rng.standard_normal(64).astype(F32)
    row = rng.standard_normal((1, 7, 64)).astype(F32)  # broadcast along the rows: passed whole
    cases = [
        ("add", bk.add, (x, w)),
        ("mul", bk.mul, (x, row)),
        ("where", bk.where, (x > 0, x, 0.0)),
        ("gelu_exact", bk.gelu_exact, (x,)),
        ("gelu_exact_backward", bk.gelu_exact_backward, (x, x, x)),
        ("max", bk.max, (x, (2,), True)),
        ("sum", bk.sum, (x, (1, 2), False)),
        ("layer_norm", bk.layer_norm, (x.reshape(-1, 64), w, w, 1e-5)),
    ]
    for name, fn, args in cases:
        expected = fn(*args)
        split = bk.row_parallel(name, fn, args, {}, expected)
        assert split is not None, name
        got = split(*args)
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            assert g.shape == e.shape and g.dtype == e.dtype, name
            np.testing.assert_array_equal(g, e, err_msg=name)


@pytest.mark.parametrize("name, args", [
    ("sum", "axis0"),  # reduces the rows themselves
    ("add", "small"),  # below the threshold
    ("add_into", "big"),  # writes into its first argument: not split
    ("matmul", "big"),  # not row-wise in its second argument
])
def test_row_parallel_refuses_what_it_cannot_split(name, args):
    bk = get_backend("cpu")
    x = np.ones((400, 400), dtype=F32)
    if args == "axis0":
        call, fn_args = bk.sum, (x, (0,), True)
    elif args == "small":
        call, fn_args = bk.add, (x[:4], x[:4])
    else:
        call, fn_args = getattr(bk, name), (x, x)
    assert bk.row_parallel(name, call, fn_args, {}, call(*fn_args)) is None


def test_a_failing_half_raises_in_the_caller():
    bk = get_backend("cpu")
    x = np.ones((512, 512), dtype=F32)
    split = bk.row_parallel("exp", bk.exp, (x,), {}, bk.exp(x))

    with pytest.raises(TypeError):
        split("not an array")
    np.testing.assert_array_equal(split(x), np.exp(x))  # the helper thread still serves
