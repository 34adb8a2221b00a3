"""gate and switch with batch > 1 (checked row by row), and the nn routing helpers."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder

from .modules import ColumnSelector, Dense, Scale, SignSelector, close, need_f64


class RowSpy(nn.Module):
    """Scale by k and record the batch sizes it was called with."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k
        self.calls: list[int] = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        return x * self.k


def test_gate_rows_weighted_by_their_own_router_output(device):
    fg.manual_seed(3)
    router = nn.SoftmaxRouter(4, 3).to(device)
    experts = [Dense(4, 2, device=device) for _ in range(3)]
    g = FlowBuilder().gate(router, experts).build()
    x = fg.randn(5, 4, device=device)
    y = g(x)
    for r in range(5):
        row = x[r:r + 1]
        w = router(row)
        expected = sum(w[:, i:i + 1] * experts[i](row) for i in range(3))
        close(y[r:r + 1], expected)


def test_gate_weights_broadcast_over_sequence_dims(device):
    class SeqRouter(nn.Module):
        def forward(self, x):
            return fg.tensor([[0.25, 0.75]], device=x.device).expand(x.shape[0], 2)

    g = FlowBuilder().gate(SeqRouter(), [Scale(1.0), Scale(2.0)]).build()
    x = fg.randn(3, 5, 4, device=device)
    close(g(x), x * 1.75)


def test_switch_per_row_routes_each_row_to_its_branch(device):
    branches = [RowSpy(10.0), RowSpy(100.0), RowSpy(-1.0)]
    g = FlowBuilder().switch(ColumnSelector(), branches).build()
    x = fg.tensor([[2.0, 1.0], [0.0, 2.0], [1.0, 3.0], [0.0, 4.0], [2.0, 5.0]], device=device)
    y = g(x)
    scale = {0: 10.0, 1: 100.0, 2: -1.0}
    for r in range(5):
        k = int(x[r, 0].item())
        close(y[r:r + 1], x[r:r + 1] * scale[k])
    # only the rows routed to a branch run through it, each branch once
    assert [b.calls for b in branches] == [[2], [1], [2]]


def test_switch_per_row_gradients(device):
    need_f64(device)
    fg.manual_seed(0)
    b0 = Dense(3, 2, device=device, dtype=fg.float64)
    b1 = Dense(3, 2, device=device, dtype=fg.float64)
    g = FlowBuilder().switch(SignSelector(), [b0, b1]).build()
    x = fg.tensor([[1.0, 0.1, 0.2], [-1.0, 0.3, 0.1], [0.5, -0.2, 0.4], [-0.3, 0.0, 1.0]],
                  dtype=fg.float64, device=device, requires_grad=True)
    y = g(x)
    for r in range(4):
        branch = b1 if float(x[r, 0].item()) > 0 else b0
        close(y[r:r + 1], branch(x[r:r + 1]), 1e-10)
    assert fg.gradcheck(lambda t: g(t), (x,))
    g.zero_grad()
    g(x).sum().backward()
    assert b0.lin.weight.grad is not None and b1.lin.weight.grad is not None


def test_switch_all_rows_one_branch_skips_the_others(device):
    branches = [RowSpy(2.0), RowSpy(3.0)]
    g = FlowBuilder().switch(SignSelector(), branches).build()
    x = fg.ones(4, 2, device=device)
    close(g(x), 3 * x)
    assert branches[0].calls == [] and branches[1].calls == [4]


def test_switch_whole_batch_index(device):
    branches = [RowSpy(2.0), RowSpy(3.0)]
    g = FlowBuilder().switch(nn.FixedSelector(0), branches).build()
    x = fg.ones(4, 2, device=device)
    close(g(x), 2 * x)
    assert branches[1].calls == []


def test_switch_index_out_of_range(device):
    g = FlowBuilder().switch(nn.FixedSelector(5), [Scale(1.0), Scale(2.0)]).build()
    with pytest.raises(fg.FlowError, match="branch 5"):
        g(fg.ones(2, 2, device=device))
    g = FlowBuilder().switch(ColumnSelector(), [Scale(1.0), Scale(2.0)]).build()
    with pytest.raises(fg.FlowError, match="outside 0..1"):
        g(fg.tensor([[0.0], [7.0]], device=device))


def test_argmax_selector_is_per_row(device):
    fg.manual_seed(0)
    sel = nn.ArgmaxSelector(3, 2).to(device)
    x = fg.randn(6, 3, device=device)
    idx = sel(x)
    assert idx.shape == (6,) and idx.dtype == fg.int64
    assert idx.tolist() == sel.proj(x).argmax(-1).tolist()
    g = FlowBuilder().switch(sel, [Scale(1.0), Scale(-1.0)]).build()
    y = g(x)
    for r, i in enumerate(idx.tolist()):
        close(y[r:r + 1], x[r:r + 1] * (1.0 if i == 0 else -1.0))


def test_routers_and_halts(device):
    fg.manual_seed(0)
    x = fg.randn(4, 3, device=device)
    w = nn.SoftmaxRouter(3, 5).to(device)(x)
    assert w.shape == (4, 5)
    close(w.sum(-1), fg.ones(4))
    s = nn.SigmoidRouter(3, 5).to(device)(x)
    assert s.shape == (4, 5) and float(s.min().item()) > 0 and float(s.max().item()) < 1
    # refs are added to the input before projection
    r = nn.SoftmaxRouter(3, 2).to(device)
    close(r(x, enc=x), r(2 * x))
    assert nn.FixedSelector(1)(x).shape == () and nn.FixedSelector(1)(x).item() == 1
    close(nn.ThresholdHalt(0.5)(fg.tensor([[0.0, 1.0], [0.2, 0.1]], device=device)), fg.tensor([0.5, -0.3]))
    assert nn.LearnedHalt(3).to(device)(x).shape == (4,)
    close(nn.StateAdd()(x, a=x, b=x), 3 * x)
