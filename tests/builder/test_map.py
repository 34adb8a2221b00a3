"""map(...).each / batched / over(tag) / slices(n), and that each is linear in the batch size."""

from __future__ import annotations

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder
from flowgraph.builder.rows import unbind_rows

from .modules import Dense, Scale, close, need_f64


class RowSum(nn.Module):
    """Per call: the sum of the whole input (so per-row and batched calls differ)."""

    def forward(self, x):
        return x.sum().reshape(1, 1).expand(x.shape[0], 1)


def test_each_calls_body_per_row(device):
    g = FlowBuilder().map(RowSum()).each().build()
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=device)
    close(g(x), fg.tensor([[3.0], [7.0], [11.0]]))


def test_batched_calls_body_once(device):
    g = FlowBuilder().map(RowSum()).batched().build()
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    close(g(x), fg.tensor([[10.0], [10.0]]))
    g2 = FlowBuilder().map(RowSum()).batched().through(Scale(2.0)).build()
    close(g2(x), fg.tensor([[20.0], [20.0]]))


def test_over_maps_a_tagged_tensor(device):
    g = (FlowBuilder().tag("raw").through(Scale(100.0))
         .map(RowSum()).over("raw").build())
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    close(g(x), fg.tensor([[3.0], [7.0]]))
    g2 = FlowBuilder().tag("raw").through(Scale(100.0)).map(RowSum()).batched().over("raw").build()
    close(g2(x), fg.tensor([[10.0], [10.0]]))


def test_slices_each_and_batched_agree(device):
    fg.manual_seed(0)
    body = nn.Linear(2, 3, device=device)
    x = fg.randn(4, 6, device=device)
    expected = fg.cat([body(x[:, 0:2]), body(x[:, 2:4]), body(x[:, 4:6])], -1)
    close(FlowBuilder().map(body).slices(3).build()(x), expected)
    close(FlowBuilder().map(body).batched().slices(3).build()(x), expected)


def test_each_gradients(device):
    need_f64(device)
    fg.manual_seed(0)
    body = Dense(3, 2, device=device, dtype=fg.float64)
    g = FlowBuilder().map(body).each().build()
    x = fg.randn(4, 3, dtype=fg.float64, device=device, requires_grad=True)
    close(g(x), body(x), 1e-10)
    assert fg.gradcheck(lambda t: g(t), (x,))
    g.zero_grad()
    g(x).sum().backward()
    gw = body.lin.weight.grad.detach().clone()
    g.zero_grad()
    body(x).sum().backward()
    close(gw, body.lin.weight.grad, 1e-10)


def test_each_backward_is_linear_in_batch():
    """Row gradients meet in one node with an output per row: its backward runs once, on B row gradients."""
    x = fg.randn(64, 3, requires_grad=True)
    rows = unbind_rows(x)
    y = fg.cat([r * 2.0 for r in rows], 0)
    calls = []
    node = rows[0]._grad_fn
    assert all(r._grad_fn is node for r in rows) and node.n_out == 64
    original = node.backward

    def spy(grads):
        calls.append(len(grads))
        return original(grads)

    node.backward = spy
    y.sum().backward()
    close(x.grad, 2 * fg.ones(64, 3))
    assert calls == [64]


def test_each_on_empty_batch(device):
    g = FlowBuilder().map(Scale(2.0)).each().build()
    assert g(fg.zeros(0, 3, device=device)).shape == (0, 3)
