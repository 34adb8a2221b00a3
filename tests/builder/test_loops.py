"""Loops: for_n / while_cond / until_cond iteration counts at the edges, per-row halting, max_iter reporting."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder

from .modules import AddConst, Scale, close, need_f64


class Const(nn.Module):
    """A condition returning a fixed value for the whole batch (shape ())."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x):
        return fg.tensor(self.value, device=x.device)


def _count(graph):
    (info,) = graph.loop_info().values()
    return info


@pytest.mark.parametrize("n", [1, 2, 5])
def test_for_n_runs_exactly_n(device, n):
    g = FlowBuilder().loop_body(AddConst(1.0)).for_n(n).build()
    close(g(fg.zeros(2, 1, device=device)), fg.full((2, 1), float(n)))
    info = _count(g)
    assert info.iterations == n and not info.max_iter_hit and not g.max_iter_hit()


def test_while_halting_at_once_runs_zero_times(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).while_cond(Const(1.0), 5).build()
    x = fg.zeros(3, 2, device=device)
    close(g(x), x)
    assert _count(g).iterations == 0 and not g.max_iter_hit()


def test_while_never_halting_runs_max_and_reports_it(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).while_cond(Const(-1.0), 4).build()
    close(g(fg.zeros(3, 2, device=device)), fg.full((3, 2), 4.0))
    assert _count(g).iterations == 4 and g.max_iter_hit() and g.max_iter_hit("loop_0")


def test_while_halting_exactly_at_max_is_not_a_hit(device):
    # rows reach 3 after 3 passes; the test before a 4th pass halts them.
    g = FlowBuilder().loop_body(AddConst(1.0)).while_cond(nn.ThresholdHalt(2.5), 3).build()
    close(g(fg.zeros(2, 1, device=device)), fg.full((2, 1), 3.0))
    assert _count(g).iterations == 3 and not g.max_iter_hit()


def test_until_runs_at_least_once(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).until_cond(Const(1.0), 5).build()
    close(g(fg.zeros(2, 2, device=device)), fg.ones(2, 2))
    assert _count(g).iterations == 1 and not g.max_iter_hit()


def test_until_never_halting_runs_max(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).until_cond(Const(-1.0), 3).build()
    close(g(fg.zeros(2, 2, device=device)), fg.full((2, 2), 3.0))
    assert _count(g).iterations == 3 and g.max_iter_hit()


def test_until_halting_on_the_last_pass_is_not_a_hit(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).until_cond(nn.ThresholdHalt(2.5), 3).build()
    close(g(fg.zeros(1, 1, device=device)), fg.full((1, 1), 3.0))
    assert _count(g).iterations == 3 and not g.max_iter_hit()


@pytest.mark.parametrize("mode", ["while", "until"])
def test_per_row_halting_keeps_stopped_rows(device, mode):
    x = fg.tensor([[0.0], [2.0], [5.0], [1.0]], device=device)
    b = FlowBuilder().loop_body(AddConst(1.0))
    if mode == "while":
        g = b.while_cond(nn.ThresholdHalt(2.5), 10).build()
        expected, rows = [[3.0], [3.0], [5.0], [3.0]], [3, 1, 0, 2]
    else:
        g = b.until_cond(nn.ThresholdHalt(2.5), 10).build()
        expected, rows = [[3.0], [3.0], [6.0], [3.0]], [3, 1, 1, 2]
    close(g(x), fg.tensor(expected))
    info = _count(g)
    assert info.row_iterations.tolist() == rows
    assert info.iterations == max(rows) and not info.max_iter_hit


def test_per_row_hit_reports_rows_still_running(device):
    g = FlowBuilder().loop_body(AddConst(1.0)).until_cond(nn.ThresholdHalt(2.5), 2).build()
    close(g(fg.tensor([[0.0], [2.0]], device=device)), fg.tensor([[2.0], [3.0]]))
    assert g.max_iter_hit() and _count(g).row_iterations.tolist() == [2, 1]


def test_condition_shape_b1_accepted(device):
    class Col(nn.Module):
        def forward(self, x):
            return x[:, :1] - 1.5   # (B, 1)

    g = FlowBuilder().loop_body(AddConst(1.0)).until_cond(Col(), 10).build()
    close(g(fg.tensor([[0.0, 9.0], [1.0, 9.0]], device=device)), fg.tensor([[2.0, 11.0], [2.0, 10.0]]))


def test_learned_halt_runs(device):
    fg.manual_seed(0)
    halt = nn.LearnedHalt(3).to(device)
    g = FlowBuilder().loop_body(nn.Linear(3, 3, device=device)).until_cond(halt, 4).build()
    y = g(fg.randn(5, 3, device=device))
    assert y.shape == (5, 3) and 1 <= _count(g).iterations <= 4


def test_gradient_through_masked_loop(device):
    need_f64(device)
    fg.manual_seed(0)
    body = Scale(1.5)
    g = FlowBuilder().loop_body(body).while_cond(nn.ThresholdHalt(2.0), 5).build()
    x = fg.tensor([[0.5, 0.2], [3.0, 1.0], [1.1, 0.1]], dtype=fg.float64, device=device, requires_grad=True)
    # row 0: 0.5 -> .75 -> 1.125 -> 1.6875 -> 2.53 (4 passes); row 1: 0; row 2: 1.1 -> 1.65 -> 2.475 (2 passes)
    close(g(x), x * fg.tensor([[1.5 ** 4], [1.0], [1.5 ** 2]], dtype=fg.float64, device=device))
    assert fg.gradcheck(lambda t: g(t), (x,))


def test_for_n_with_refs_on_body(device):
    class Body(nn.Module):
        def forward(self, x, base):
            return x + base

    g = FlowBuilder().tag("base").loop_body(Body()).for_n(3).using("base").build()
    close(g(fg.ones(1, 2, device=device)), 4 * fg.ones(1, 2))
