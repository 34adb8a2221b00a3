"""Adam and AdamW batch a group's parameters into one ``Backend.adam_step_multi`` call; the result must be the
per-parameter ``adam_step`` path's, bit for bit, on every device (and the batches follow dtype, group and step
count)."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import optim
from flowgraph.optim.optimizer import Optimizer

SHAPES = [(4, 3), (3,), (2, 5), (7,), (1,), (3, 3), (6,), (2, 2), (5,), (4,)]  # 10 tensors: two OpenCL launches


def _per_tensor(cls):
    """The optimizer with the base class's one-``_update``-per-parameter step (no batching)."""
    return type(f"PerTensor{cls.__name__}", (cls,), {"_update_all": Optimizer._update_all})


def _run(device, cls, kw, steps=4, skip_at=None):
    rng = np.random.default_rng(0)
    params = [fg.tensor(rng.standard_normal(s).astype(np.float32), device=device, requires_grad=True)
              for s in SHAPES]
    groups = [{"params": params[:7]}, {"params": params[7:], "lr": 3e-3}]
    opt = cls(groups, lr=1e-2, **kw)
    for i in range(steps):
        for j, p in enumerate(params):
            p.grad = None if (skip_at == i and j % 3 == 0) else fg.tensor(
                rng.standard_normal(p.shape).astype(np.float32), device=device)
        opt.step()
    state = [opt.state[p] for p in params]
    return [p.detach().numpy() for p in params], [
        {k: (v if isinstance(v, float) else v.numpy()) for k, v in s.items()} for s in state]


@pytest.mark.parametrize("name,kw", [
    ("Adam", dict()),
    ("Adam", dict(weight_decay=0.1, maximize=True)),
    ("Adam", dict(amsgrad=True)),
    ("AdamW", dict(weight_decay=0.05)),
    ("AdamW", dict(weight_decay=0.05, amsgrad=True, maximize=True)),
], ids=["adam", "adam-l2-maximize", "adam-amsgrad", "adamw", "adamw-amsgrad-maximize"])
def test_multi_tensor_step_equals_per_tensor_bit_for_bit(device, name, kw):
    cls = getattr(optim, name)
    # step 1 skips a third of the gradients: those parameters' step counts lag, so a group splits into batches
    batched = _run(device, cls, kw, skip_at=1)
    single = _run(device, _per_tensor(cls), kw, skip_at=1)
    # CUDA: NVRTC may contract a multiply-add into an FMA in one kernel and not the other (last bit)
    same = (lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)) if device.startswith("cuda") \
        else np.testing.assert_array_equal
    for a, b in zip(batched[0], single[0]):
        same(a, b)
    for sa, sb in zip(batched[1], single[1]):
        assert sa.keys() == sb.keys()
        for k in sa:
            same(sa[k], sb[k])


def test_batches_follow_group_dtype_and_step(device, monkeypatch):
    """Parameters of two dtypes in one group (where the device has float64) and lagging step counts: every
    parameter still gets its own per-tensor result."""
    calls = []
    be = fg.get_backend(device)
    original = type(be).adam_step_multi

    def spy(self, params, *args, **kwargs):
        calls.append((len(params), params[0].dtype))
        return original(self, params, *args, **kwargs)

    dtypes = [fg.float32, fg.float64] if be.supports_float64 else [fg.float32, fg.float32]
    params = [fg.ones(3, dtype=dtypes[i % 2], device=device, requires_grad=True) for i in range(4)]
    opt = optim.Adam(params, lr=0.1)
    for p in params:
        p.grad = fg.ones(3, dtype=p.dtype, device=device)
    monkeypatch.setattr(type(be), "adam_step_multi", spy)
    opt.step()
    assert sorted(n for n, _ in calls) == ([2, 2] if be.supports_float64 else [4])
    for p in params:  # first Adam step: p - lr * sign(g)
        np.testing.assert_allclose(p.detach().numpy(), np.full(3, 0.9), rtol=1e-6)


def test_a_subclass_overriding_update_keeps_its_update(device):
    seen = []

    class Logged(optim.Adam):
        def _update(self, p, grad, state, group):
            seen.append(p.shape)
            super()._update(p, grad, state, group)

    params = [fg.ones(s, device=device, requires_grad=True) for s in ((2,), (3, 2))]
    opt = Logged(params, lr=0.1)
    for p in params:
        p.grad = fg.ones(p.shape, device=device)
    opt.step()
    assert seen == [(2,), (3, 2)]
    np.testing.assert_allclose(params[1].detach().numpy(), np.full((3, 2), 0.9), rtol=1e-6)
