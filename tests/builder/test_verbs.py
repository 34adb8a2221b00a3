"""Each builder verb: forward values against a hand-written equivalent, gradients by float64 gradcheck."""

from __future__ import annotations

import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder, Graph, MergeOp

from .modules import AddConst, Dense, Mix, Scale, close, need_f64

D = 4


def _x(device, batch=3, d=D, dtype=fg.float64):
    fg.manual_seed(1)
    return fg.randn(batch, d, device=device, dtype=dtype, requires_grad=True)


def _dense(device, d_in=D, d_out=D):
    return Dense(d_in, d_out, device=device, dtype=fg.float64)


def _check(graph, reference, x):
    """Same forward as ``reference``; same input and parameter gradients; float64 gradcheck on the input."""
    close(graph(x), reference(x), 1e-10)
    graph.zero_grad()
    graph(x).sum().backward()
    g_graph = {n: None if p.grad is None else p.grad.numpy().copy() for n, p in graph.named_parameters()}
    gx_graph = x.grad.numpy().copy()
    x.grad = None
    graph.zero_grad()
    reference(x).sum().backward()
    for n, p in graph.named_parameters():
        assert (p.grad is None) == (g_graph[n] is None), n
        if p.grad is not None:
            close(p.grad, g_graph[n], 1e-10)
    close(x.grad, gx_graph, 1e-10)
    x.grad = None
    assert fg.gradcheck(lambda t: graph(t), (x,))


def test_from_through(device):
    need_f64(device)
    a, b = _dense(device), _dense(device, D, 2)
    g = FlowBuilder.from_(a).through(b).build()
    assert isinstance(g, Graph) and isinstance(g, nn.Module)
    _check(g, lambda x: b(a(x)), _x(device))


def test_identity_entry(device):
    need_f64(device)
    a = _dense(device)
    g = FlowBuilder().through(a).build()
    _check(g, a, _x(device))
    assert list(dict(g.named_children())) == ["through_0"]


def test_also_is_residual(device):
    need_f64(device)
    a, r = _dense(device), _dense(device)
    g = FlowBuilder.from_(a).also(r).build()
    _check(g, lambda x: a(x) + r(a(x)), _x(device))


@pytest.mark.parametrize("affine", [True, False])
def test_also_with_a_layer_norm_tail_is_the_residual(device, affine, monkeypatch):
    """A block ending in a LayerNorm runs the norm and the residual sum as one op (one kernel on CUDA and
    OpenCL): the values and gradients of ``x + block(x)`` (float64 gradcheck). A hook on the LayerNorm, or
    checkpointing the block, sends it back through its modules' calls, with the same results."""
    import flowgraph.builder.nodes as nodes

    need_f64(device)
    fused = []

    def counted(*args):
        fused.append(1)
        return layer_norm_residual(*args)

    layer_norm_residual = nodes.layer_norm_residual
    monkeypatch.setattr(nodes, "layer_norm_residual", counted)
    a = _dense(device)
    block = nn.Sequential(nn.Linear(D, D, device=device, dtype=fg.float64), nn.GELU(),
                          nn.LayerNorm(D, elementwise_affine=affine, device=device, dtype=fg.float64))
    g = FlowBuilder.from_(a).also(block).tag("blk").build()
    _check(g, lambda x: a(x) + block(a(x)), _x(device))
    assert fused
    fused.clear()
    handle = block[2].register_forward_hook(lambda m, args, out: None)
    _check(g, lambda x: a(x) + block(a(x)), _x(device))
    assert not fused
    handle.remove()
    g.checkpoint_activations("blk")  # the block's own forward recomputes it in backward: not fused either
    close(g(_x(device)), a(_x(device)) + block(a(_x(device))), 1e-10)
    assert not fused


def test_fork_keeps_main_stream(device):
    need_f64(device)
    a, side, b = _dense(device), _dense(device, D, 2), _dense(device)
    g = FlowBuilder.from_(a).fork(side).tag("side").through(b).build()
    x = _x(device)
    _check(g, lambda t: b(a(t)), x)
    g(x)
    close(g.tag_values["side"], side(a(x)))
    assert g.tags == {"side": "side"}


@pytest.mark.parametrize("op", list(MergeOp))
def test_split_merge_ops(device, op):
    need_f64(device)
    a, b1, b2, b3 = _dense(device), _dense(device), _dense(device), _dense(device)
    g = FlowBuilder.from_(a).split(b1, b2, b3).merge(op).build()

    def reference(x):
        h = a(x)
        ys = [b1(h), b2(h), b3(h)]
        if op is MergeOp.ADD:
            return ys[0] + ys[1] + ys[2]
        if op is MergeOp.MEAN:
            return (ys[0] + ys[1] + ys[2]) / 3
        if op is MergeOp.MUL:
            return ys[0] * ys[1] * ys[2]
        if op is MergeOp.MAX:
            return fg.maximum(fg.maximum(ys[0], ys[1]), ys[2])
        return fg.cat(ys, -1)

    _check(g, reference, _x(device))
    assert g(_x(device)).shape == ((3, 3 * D) if op is MergeOp.CAT else (3, D))


def test_merge_callable_and_list_form(device):
    need_f64(device)
    b1, b2 = _dense(device), _dense(device)
    g = FlowBuilder().split([b1, b2]).merge(lambda ys: ys[0] - 2 * ys[1]).build()
    _check(g, lambda x: b1(x) - 2 * b2(x), _x(device))


def test_tag_using_backward_ref(device):
    need_f64(device)
    a, b, m = _dense(device), _dense(device), Mix(D, device=device, dtype=fg.float64)
    g = FlowBuilder.from_(a).tag("ctx").through(b).through(m).using("ctx").build()
    _check(g, lambda x: m(b(a(x)), ctx=a(x)), _x(device))


def test_loop_for_n(device):
    need_f64(device)
    body = _dense(device)
    g = FlowBuilder().loop_body(body).for_n(3).build()
    _check(g, lambda x: body(body(body(x))), _x(device))


def test_gate(device):
    need_f64(device)
    router = nn.SoftmaxRouter(D, 2).to(device).double()
    e1, e2 = _dense(device), _dense(device)
    g = FlowBuilder().gate(router, [e1, e2]).build()

    def reference(x):
        w = router(x)
        return w[:, 0:1] * e1(x) + w[:, 1:2] * e2(x)

    _check(g, reference, _x(device))


def test_switch_whole_batch(device):
    need_f64(device)
    b0, b1 = _dense(device), _dense(device)
    g = FlowBuilder().switch(nn.FixedSelector(1), [b0, b1]).build()
    _check(g, b1, _x(device))


def test_map_each(device):
    need_f64(device)
    body = _dense(device)
    g = FlowBuilder().map(body).each().build()
    _check(g, body, _x(device, batch=5))


def test_input_positional_and_keyword(device):
    need_f64(device)
    a, m = _dense(device), Mix(D, device=device, dtype=fg.float64)
    g = FlowBuilder.from_(a).input("ctx").through(m).using("ctx").build()
    x, c = _x(device), fg.randn(3, D, device=device, dtype=fg.float64, requires_grad=True)
    ref = m(a(x), ctx=c)
    close(g(x, c), ref)
    close(g(x, ctx=c), ref)
    assert g.input_names == ["ctx"]
    assert fg.gradcheck(lambda t, u: g(t, u), (x, c))


def test_two_inputs_reach_a_nested_graph(device):
    inner = FlowBuilder.from_(Scale(2.0)).input("ctx").through(Mix(D, device=device)).using("ctx") \
        .label("inner").build()
    outer = FlowBuilder.from_(AddConst(1.0)).input("ctx").through(inner).using("ctx").build()
    x, c = fg.randn(2, D, device=device), fg.randn(2, D, device=device)
    close(outer(x, ctx=c), inner((x + 1.0), ctx=c))
