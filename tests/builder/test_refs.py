"""Forward references across calls: previous value, first-call zeros or init, reset_state, detach_state."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder

from .modules import Scale, WithRef, close


def _accumulator():
    # h_t = x_t + h_{t-1}: StateAdd reads 'h' before it is tagged, so it gets the previous call's value.
    return FlowBuilder().through(nn.StateAdd()).using("h").tag("h").build()


def test_forward_ref_over_three_calls_and_reset(device):
    g = _accumulator()
    x = fg.ones(2, 3, device=device)
    close(g(x), x)          # first call: zeros
    close(g(x), 2 * x)
    close(g(x), 3 * x)
    g.reset_state()
    close(g(x), x)


def test_forward_ref_init_tensor_and_callable(device):
    init = fg.full((2, 3), 5.0, device=device)
    g = FlowBuilder().through(nn.StateAdd()).using("h").tag("h", init=init).build()
    x = fg.ones(2, 3, device=device)
    close(g(x), x + 5)
    close(g(x), 2 * x + 5)
    g2 = FlowBuilder().through(nn.StateAdd()).using("h").tag("h", init=lambda t: t * 10).build()
    close(g2(x), 11 * x)


def test_forward_ref_zeros_shaped_like_consumer_input(device):
    # the consumer (WithRef) sees x of shape (2, 3) even though the tagged stream is (2, 1) later.
    seen = {}

    class Spy(nn.Module):
        def forward(self, x, h):
            seen["h"] = h
            return x

    g = FlowBuilder().through(Spy()).using("h").through(Scale(2.0)).tag("h").build()
    g(fg.ones(2, 3, device=device))
    assert seen["h"].shape == (2, 3) and float(seen["h"].abs().sum().item()) == 0.0
    g(fg.ones(2, 3, device=device))
    close(seen["h"], 2 * fg.ones(2, 3))


def test_detach_state_cuts_gradient_across_calls(device):
    w = nn.Linear(3, 3, device=device)
    g = FlowBuilder.from_(w).through(nn.StateAdd()).using("h").tag("h").build()
    x = fg.ones(1, 3, device=device)
    g(x)
    y = g(x)
    y.sum().backward()                      # flows through both calls
    grad_two_calls = w.weight.grad.detach().clone()
    g.zero_grad()
    g.reset_state()
    g(x)
    g.detach_state()
    y = g(x)
    y.sum().backward()                      # only the second call
    grad_one_call = w.weight.grad
    close(grad_two_calls, 2 * grad_one_call)
    assert g._state["h"].requires_grad      # state of this call keeps its graph until detached
    g.detach_state()
    assert not g._state["h"].requires_grad


def test_backward_and_forward_ref_to_same_tag(device):
    # first consumer sees the previous call's 'h', the second this call's.
    g = (FlowBuilder().through(WithRef(1.0)).using("h")
         .through(Scale(2.0)).tag("h")
         .through(WithRef(10.0)).using("h").build())
    x = fg.ones(1, 2, device=device)
    # call 1: a = x + 0 = 1; h = 2; out = 2 + 20 = 22
    close(g(x), 22 * x)
    # call 2: a = x + 2 = 3; h = 6; out = 6 + 60 = 66
    close(g(x), 66 * x)


def test_reset_state_reaches_nested_graphs(device):
    inner = _accumulator()
    outer = FlowBuilder().through(inner).build()
    x = fg.ones(1, 2, device=device)
    outer(x)
    close(outer(x), 2 * x)
    outer.reset_state()
    close(outer(x), x)


def test_tag_values_hold_last_forward(device):
    g = FlowBuilder().through(Scale(2.0)).tag("a").through(Scale(3.0)).tag("b").build()
    g(fg.ones(1, 1, device=device))
    assert set(g.tag_values) == {"a", "b"}
    close(g.tag_values["b"], 6 * fg.ones(1, 1))
    g(fg.full((1, 1), 2.0, device=device))
    close(g.tag_values["a"], 4 * fg.ones(1, 1))


@pytest.mark.parametrize("where", ["gate", "switch", "loop", "split", "merge"])
def test_using_targets_each_verb(device, where):
    """using after gate/switch goes to the router/selector, after a loop to the body, after split to all."""
    got = []

    class Router(nn.Module):
        def forward(self, x, enc):
            got.append("router")
            return fg.ones(x.shape[0], 2, device=x.device) * 0.5

    class Selector(nn.Module):
        def forward(self, x, enc):
            got.append("selector")
            return fg.tensor(1, dtype=fg.int64, device=x.device)

    class Body(nn.Module):
        def forward(self, x, enc):
            got.append("body")
            return x + enc

    b = FlowBuilder().tag("enc")
    if where == "gate":
        b = b.gate(Router(), [Scale(1.0), Scale(3.0)]).using("enc")
        expect = 2.0
    elif where == "switch":
        b = b.switch(Selector(), [Scale(1.0), Scale(3.0)]).using("enc")
        expect = 3.0
    elif where == "loop":
        b = b.loop_body(Body()).for_n(2).using("enc")
        expect = 3.0
    elif where == "split":
        b = b.split(Body(), Body()).using("enc").merge(fg.builder.MergeOp.ADD)
        expect = 4.0
    else:
        b = b.split(Scale(1.0), Scale(2.0)).merge(lambda xs, enc: xs[0] + xs[1] + enc).using("enc")
        expect = 4.0
    g = b.build()
    close(g(fg.ones(2, 2, device=device)), expect * fg.ones(2, 2))
    if where in ("gate", "switch"):
        assert got == ["router" if where == "gate" else "selector"]


def test_forward_ref_batch_change_needs_reset(device):
    g = _accumulator()
    g(fg.ones(4, 2, device=device))
    with pytest.raises(fg.FlowError, match=r"call #3 \.using\('h'\).*reset_state\(\)"):
        g(fg.ones(3, 2, device=device))
    g.reset_state()
    close(g(fg.ones(3, 2, device=device)), fg.ones(3, 2))
