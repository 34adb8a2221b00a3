"""F.linear over inputs of any number of leading dimensions (one GEMM over their rows, the bias added into its
output): forward and every gradient against torch, first and second order in float64, a permuted input, empty
rows, and the fg.jit replay of a step."""

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn, optim

LEADS = [(5,), (2, 3), (2, 1, 3), (0, 4), (3, 0)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_linear_matches_torch(device, bias, lead):
    rng = np.random.default_rng(len(lead))
    x = rng.standard_normal(lead + (4,)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    g = rng.standard_normal(lead + (6,)).astype(np.float32)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    fx, fw, fb = (fg.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.linear(tx, tw, tb if bias else None)
    fy = nn.functional.linear(fx, fw, fb if bias else None)
    assert tuple(fy.shape) == tuple(ty.shape)
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    ty.backward(torch.tensor(g))
    fy.backward(fg.tensor(g, device=device))
    for f, t in ((fx, tx), (fw, tw)) + (((fb, tb),) if bias else ()):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
    if not bias:
        assert fb.grad is None


def test_linear_permuted_input_matches_torch(device):
    """A non-contiguous input (a transposed view) reshaped to rows."""
    x = np.random.default_rng(3).standard_normal((4, 3, 5)).astype(np.float32)
    m, tm = nn.Linear(4, 2), torch.nn.Linear(4, 2)
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    m.to(device)
    fx = fg.tensor(x, device=device, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    fy, ty = m(fx.permute(2, 1, 0)), tm(tx.permute(2, 1, 0))
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    fy.pow(2).sum().backward()
    ty.pow(2).sum().backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=str)
def test_linear_gradcheck_and_gradgradcheck(device, lead):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    x = fg.randn(*lead, 4, dtype=fg.float64, device=device, requires_grad=True)
    w = fg.randn(3, 4, dtype=fg.float64, device=device, requires_grad=True)
    b = fg.randn(3, dtype=fg.float64, device=device, requires_grad=True)
    assert fg.gradcheck(nn.functional.linear, (x, w, b))
    weight = fg.randn(*lead, 3, dtype=fg.float64, device=device)

    def first_derivative(*args):  # the backward under create_graph: tensor ops, differentiable again
        with fg.enable_grad():  # gradcheck evaluates under no_grad on fresh tensors
            args = [a if a.requires_grad else a.detach().requires_grad_() for a in args]
            out = (nn.functional.linear(*args) * weight).sum()
            return fg.autograd.grad(out, args, create_graph=True, allow_unused=True)[:2]

    assert fg.gradcheck(first_derivative, (x, w, b))


def test_jitted_linear_steps_equal_eager(device):
    """Ten SGD steps of a 3-d linear model, eager and through fg.jit, give the same losses and weights (the
    bias added in place into the GEMM's output is replayed into the replay's own output)."""
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((2, 5, 4)).astype(np.float32), rng.standard_normal((2, 5, 3)).astype(np.float32))
            for _ in range(10)]

    def run(jit: bool):
        fg.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
        opt = optim.SGD(m.parameters(), lr=0.1)

        def step(x, y):
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        step = fg.jit(step) if jit else step
        losses = [step(fg.tensor(x, device=device), fg.tensor(y, device=device)).item() for x, y in data]
        return losses, [p.detach().numpy() for p in m.parameters()]

    (le, pe), (lj, pj) = run(False), run(True)
    np.testing.assert_allclose(lj, le, rtol=1e-6, atol=1e-7)
    for a, b in zip(pj, pe):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
