"""A catalogue of in-place, view and autograd patterns, each run in flowgraph and in PyTorch.

Every pattern is written once against a namespace ``T`` (``flowgraph`` or ``torch``: the names agree) and returns
the tensors whose ``.grad`` (or value) is compared. Both frameworks must give the same numbers, or both must
raise. PyTorch is the oracle: where the two disagree, flowgraph is wrong.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import flowgraph as fg

PATTERNS = {}


def pattern(fn):
    PATTERNS[fn.__name__] = fn
    return fn


def leaf(T, values, **kw):
    return T.tensor(values, requires_grad=True, **kw)


# ---------------------------------------------------------------------- in-place on non-leaves
@pattern
def consumer_recorded_before_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 1.0
    z = y * 3.0
    y.add_(1.0)
    z.sum().backward()
    return [x]


@pattern
def inplace_then_use(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    y = x * 2.0
    y.add_(1.0)
    (y * y).sum().backward()
    return [x]


@pattern
def chained_inplace(T, d):
    x = leaf(T, [1.0, -2.0, 3.0], **d)
    y = x * 1.0
    y.add_(1.0).mul_(2.0).sub_(x)
    (y * y).sum().backward()
    return [x]


@pattern
def scalar_div_twice(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 2.0
    y.div_(2)
    y.div_(4)
    y.sum().backward()
    return [x]


@pattern
def used_twice_then_modified(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    y = x * 1.0
    a = y * 2.0
    b = y * 3.0
    y.mul_(4.0)
    (a + b + y).sum().backward()
    return [x]


@pattern
def inplace_with_grad_other(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    a = T.zeros(3, **d)
    a.add_(x * x)
    (a * 2.0).sum().backward()
    return [x]


@pattern
def zero_then_add(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 5.0
    y.zero_()
    (y + x).sum().backward()
    return [x]


@pattern
def clamp_inplace(T, d):
    x = leaf(T, [-1.0, 0.5, 2.0], **d)
    y = x * 1.0
    y.clamp_(0.0, 1.0)
    (y * 3.0).sum().backward()
    return [x]


@pattern
def sigmoid_inplace(T, d):
    x = leaf(T, [-1.0, 0.5, 2.0], **d)
    y = x * 1.0
    y.sigmoid_()
    (y * y).sum().backward()
    return [x]


@pattern
def masked_fill_after_use(T, d):
    x = leaf(T, [1.0, -2.0, 3.0], **d)
    y = x * 1.0
    z = y.sum()
    y.masked_fill_(T.tensor([True, False, True], **d), 0.0)
    (z + (y * y).sum()).backward()
    return [x]


@pattern
def mul_self_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 1.0
    y.mul_(y)
    y.sum().backward()
    return [x]


@pattern
def add_self_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 1.0
    y.add_(y)
    y.sum().backward()
    return [x]


@pattern
def mul_by_grad_tensor_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    w = leaf(T, [3.0, -1.0], **d)
    y = x * 1.0
    y.mul_(w)
    (y * y).sum().backward()
    return [x, w]


@pattern
def exp_output_modified(T, d):
    x = leaf(T, [0.5, 1.0], **d)
    y = x.exp()
    y.add_(1.0)
    y.sum().backward()
    return [x]


@pattern
def tanh_output_modified(T, d):
    x = leaf(T, [0.5, 1.0], **d)
    y = x.tanh()
    y.mul_(2.0)
    y.sum().backward()
    return [x]


@pattern
def saved_input_modified(T, d):
    x = leaf(T, [0.5, 1.0], **d)
    y = x * 1.0
    z = y.sin()
    y.add_(1.0)
    z.sum().backward()
    return [x]


@pattern
def remainder_divisor_modified_no_grad(T, d):
    a = leaf(T, [3.0, 5.0], **d)
    b = leaf(T, [2.0, 2.0], **d)
    r = a % b
    with T.no_grad():
        b.mul_(10)
    r.sum().backward()
    return [a, b]


@pattern
def detach_shares_version(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    h = x * 1.0
    y = h * h
    h.detach().add_(1.0)
    y.sum().backward()
    return [x]


@pattern
def matmul_operand_modified(T, d):
    a = leaf(T, [[1.0, 2.0], [3.0, 4.0]], **d)
    b = leaf(T, [[0.5, -1.0], [2.0, 1.0]], **d)
    h = b * 1.0
    y = a @ h
    h.add_(1.0)
    y.sum().backward()
    return [a, b]


# ---------------------------------------------------------------------- leaves
@pattern
def inplace_on_leaf(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    x.add_(1.0)
    x.sum().backward()
    return [x]


@pattern
def inplace_on_view_of_leaf(T, d):
    w = leaf(T, [1.0, 2.0, 3.0], **d)
    w[0:2].mul_(2.0)
    w.sum().backward()
    return [w]


@pattern
def leaf_modified_under_no_grad(T, d):
    w = leaf(T, [1.0, 2.0], **d)
    x = T.tensor([3.0, 4.0], **d)
    with T.no_grad():
        w.mul_(2.0)
    (w * x).sum().backward()
    return [w]


@pattern
def leaf_saved_then_modified_no_grad(T, d):
    w = leaf(T, [1.0, 2.0], **d)
    y = w * w
    with T.no_grad():
        w.add_(1.0)
    y.sum().backward()
    return [w]


@pattern
def grad_accumulates_across_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 2.0
    y.sum().backward()
    y = x * 1.0
    y.mul_(3.0)
    y.sum().backward()
    return [x]


# ---------------------------------------------------------------------- views
@pattern
def slice_copy_from_grad_tensor(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    s = leaf(T, [5.0, 6.0], **d)
    y = x * 1.0
    y[:2].copy_(s * s)
    (y * y).sum().backward()
    return [x, s]


@pattern
def element_view_mul(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    y = x * 1.0
    y[0].mul_(3.0)
    (y * y).sum().backward()
    return [x]


@pattern
def view_of_view(T, d):
    x = leaf(T, [1.0, 2.0, 3.0, 4.0], **d)
    y = x * 1.0
    v = y[1:]
    w = v[:2]
    w.mul_(2.0)
    (y * y).sum().backward()
    return [x]


@pattern
def base_modified_view_used(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    y = x * 1.0
    v = y[:2]
    y.mul_(2.0)
    (v * v).sum().backward()
    return [x]


@pattern
def sibling_view_modified(T, d):
    x = leaf(T, [1.0, 2.0, 3.0, 4.0], **d)
    y = x * 1.0
    v1 = y[:2]
    v2 = y[2:]
    v2.mul_(3.0)
    ((v1 * v1).sum() + (y * y).sum()).backward()
    return [x]


@pattern
def reshape_view_inplace(T, d):
    x = leaf(T, [1.0, 2.0, 3.0, 4.0], **d)
    y = x * 1.0
    y.view(2, 2)[1].add_(10.0)
    (y * y).sum().backward()
    return [x]


@pattern
def reshape_of_a_slice_inplace(T, d):
    # a split of a sliced axis is a view (PyTorch's rule): the write through it reaches y
    x = leaf(T, [[float(i + 4 * j) for i in range(4)] for j in range(4)], **d)
    y = x * 1.0
    y[:, :2].reshape(2, 2, 2)[1].add_(10.0)
    (y * y).sum().backward()
    return [x, y]


def _split_piece_viewed(T, d, no_grad: bool):
    # a Transformer's q = qkv.split(...)[0].view(B, T, heads, dim): one view of qkv. Under autograd the write
    # through it is refused (PyTorch's multiple-view rule); outside it is allowed and reaches qkv.
    x = leaf(T, [[float(i - j) for i in range(6)] for j in range(2)], **d)
    qkv = x * 2.0
    q, k, v = qkv.split(2, 1)
    with T.no_grad() if no_grad else contextlib.nullcontext():
        k.view(2, 2, 1).mul_(3.0)
    (qkv * qkv).sum().backward()
    return [x, qkv]


@pattern
def split_piece_viewed_inplace(T, d):
    return _split_piece_viewed(T, d, no_grad=False)


@pattern
def split_piece_viewed_inplace_no_grad(T, d):
    return _split_piece_viewed(T, d, no_grad=True)


@pattern
def reshape_of_a_transpose_copies(T, d):
    # merging transposed axes needs a copy: the write does not reach y
    x = leaf(T, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], **d)
    y = x * 1.0
    flat = y.t().reshape(6)
    flat.add_(10.0)
    ((y * y).sum() + (flat * flat).sum()).backward()
    return [x, y]


@pattern
def transpose_view_inplace(T, d):
    x = leaf(T, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], **d)
    y = x * 1.0
    y.t()[0].mul_(2.0)
    (y * y).sum().backward()
    return [x]


@pattern
def unsqueeze_view_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 1.0
    y.unsqueeze(0).mul_(3.0)
    (y * y).sum().backward()
    return [x]


@pattern
def view_masked_fill(T, d):
    x = leaf(T, [[1.0, 2.0], [3.0, 4.0]], **d)
    y = x * 1.0
    y[1].masked_fill_(T.tensor([True, False], **d), 0.0)
    (y * y).sum().backward()
    return [x]


@pattern
def view_inplace_with_grad_value(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    w = leaf(T, [2.0], **d)
    y = x * 1.0
    y[1:2].mul_(w)
    (y * y).sum().backward()
    return [x, w]


@pattern
def expanded_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = (x * 1.0).expand(3, 2)
    y.add_(1.0)
    y.sum().backward()
    return [x]


@pattern
def view_of_no_grad_base_gets_grad(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    a = T.zeros(2, 2, **d)
    a[0].copy_(x)
    (a * a).sum().backward()
    return [x]


@pattern
def split_output_inplace(T, d):
    x = leaf(T, [1.0, 2.0, 3.0, 4.0], **d)
    a, _ = (x * 1.0).split(2)
    a.mul_(2.0)
    a.sum().backward()
    return [x]


@pattern
def unbind_output_inplace(T, d):
    x = leaf(T, [[1.0, 2.0], [3.0, 4.0]], **d)
    r0, _ = (x * 1.0).unbind(0)
    r0.add_(1.0)
    r0.sum().backward()
    return [x]


@pattern
def split_output_inplace_no_grad_base(T, d):
    z = T.zeros(4, **d)
    a, _ = z.split(2)
    a.add_(1.0)
    x = leaf(T, [1.0, 1.0, 1.0, 1.0], **d)
    (z * x).sum().backward()
    return [x]


# ---------------------------------------------------------------------- __setitem__
@pattern
def setitem_grad_value_into_plain(T, d):
    v = leaf(T, [1.0, 2.0], **d)
    a = T.zeros(4, **d)
    a[1:3] = v
    (a * T.tensor([1.0, 2.0, 3.0, 4.0], **d)).sum().backward()
    return [v]


@pattern
def setitem_into_graph_tensor(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    s = leaf(T, [7.0], **d)
    y = x * 2.0
    y[0] = s[0] * 3.0
    (y * y).sum().backward()
    return [x, s]


@pattern
def setitem_column(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    a = T.zeros(2, 3, **d)
    a[:, 1] = x
    (a * a).sum().backward()
    return [x]


@pattern
def setitem_advanced(T, d):
    x = leaf(T, [1.0, 2.0, 3.0, 4.0], **d)
    y = x * 1.0
    y[T.tensor([0, 2], **d)] = T.tensor([0.0, 0.0], **d)
    (y * y).sum().backward()
    return [x]


# ---------------------------------------------------------------------- hooks, retain_grad, autograd.grad
@pattern
def retain_grad_then_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 2.0
    y.retain_grad()
    y.add_(1.0)
    (y * 3.0).sum().backward()
    return [x, y]


@pattern
def hook_before_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * 2.0
    y.register_hook(lambda g: g * 10.0)
    y.mul_(3.0)
    y.sum().backward()
    return [x]


@pattern
def leaf_hook_with_inplace_downstream(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    x.register_hook(lambda g: g + 1.0)
    y = x * 1.0
    y.mul_(2.0)
    y.sum().backward()
    return [x]


@pattern
def autograd_grad_through_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * x
    y.add_(1.0)
    (g,) = T.autograd.grad(y.sum(), x)
    return [g]


@pattern
def double_backward_through_inplace(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    y = x * x
    y.mul_(2.0)
    (g,) = T.autograd.grad(y.sum(), x, create_graph=True)
    (g * g).sum().backward()
    return [x]


# ---------------------------------------------------------------------- scatter-style in-place
@pattern
def index_add_inplace(T, d):
    x = leaf(T, [1.0, 2.0, 3.0], **d)
    src = leaf(T, [5.0, 7.0], **d)
    y = x * 1.0
    y.index_add_(0, T.tensor([0, 2], **d), src)
    (y * y).sum().backward()
    return [x, src]


@pattern
def scatter_inplace(T, d):
    x = leaf(T, [[1.0, 2.0], [3.0, 4.0]], **d)
    src = leaf(T, [[9.0, 8.0], [7.0, 6.0]], **d)
    y = x * 1.0
    y.scatter_(1, T.tensor([[1, 0], [0, 1]], **d), src)
    (y * y).sum().backward()
    return [x, src]


# ---------------------------------------------------------------------- inplace=True layers in models
def _model(T, inplace_layer):
    nn = T.nn
    rng = np.random.default_rng(0)
    lin1, lin2 = nn.Linear(3, 4), nn.Linear(4, 2)
    with T.no_grad():
        for lin in (lin1, lin2):
            lin.weight.copy_(T.tensor(rng.standard_normal(tuple(lin.weight.shape)).tolist()))
            lin.bias.copy_(T.tensor(rng.standard_normal(tuple(lin.bias.shape)).tolist()))
    return nn.Sequential(lin1, inplace_layer(nn), lin2)


def _train_step(T, d, layer):
    model = _model(T, layer)
    model.to(d.get("device", "cpu"))
    x = T.tensor([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]], **d)
    model(x).pow(2).sum().backward()
    return [p for p in model.parameters()]


@pattern
def relu_inplace_model(T, d):
    return _train_step(T, d, lambda nn: nn.ReLU(inplace=True))


@pattern
def leaky_relu_inplace_model(T, d):
    return _train_step(T, d, lambda nn: nn.LeakyReLU(0.1, inplace=True))


@pattern
def relu_inplace_twice(T, d):
    x = leaf(T, [-1.0, 2.0, 3.0], **d)
    y = x * 2.0
    T.nn.functional.relu(y, inplace=True)
    T.nn.functional.relu(y, inplace=True)
    (y * y).sum().backward()
    return [x]


@pattern
def dropout_p0_inplace_model(T, d):
    return _train_step(T, d, lambda nn: nn.Dropout(0.0, inplace=True))


# ---------------------------------------------------------------------- custom Function
def _square_fn(T):
    class Square(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x

    return Square


@pattern
def function_square(T, d):
    x = leaf(T, [1.0, -3.0], **d)
    _square_fn(T).apply(x * 1.0).sum().backward()
    return [x]


@pattern
def function_saved_input_modified(T, d):
    x = leaf(T, [1.0, -3.0], **d)
    h = x * 1.0
    y = _square_fn(T).apply(h)
    h.add_(1.0)
    y.sum().backward()
    return [x]


@pattern
def function_mark_dirty(T, d):
    class AddOneInPlace(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 1.0

    x = leaf(T, [1.0, 2.0], **d)
    y = x * 3.0
    z = AddOneInPlace.apply(y)
    (z * z).sum().backward()
    return [x]


def _two_outputs(T):
    class SplitScale(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0, x * 3.0

        @staticmethod
        def backward(ctx, ga, gb):
            return ga * 2.0 + gb * 3.0

    return SplitScale


@pattern
def function_multi_output(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    a, b = _two_outputs(T).apply(x)
    (a * b).sum().backward()
    return [x]


@pattern
def function_one_output_unused(T, d):
    x = leaf(T, [1.0, 2.0], **d)
    a, _ = _two_outputs(T).apply(x)
    a.sum().backward()
    return [x]


# ---------------------------------------------------------------------- running the catalogue
def _torch_run(fn):
    try:
        out = fn(torch, {})
    except Exception as exc:  # noqa: BLE001
        return exc
    return [None if (t.grad if t.is_leaf else t.grad) is None and t.is_leaf else
            (t.grad if t.grad is not None else t).detach().numpy().astype(np.float64) for t in out]


def _fg_run(fn, device):
    try:
        out = fn(fg, {"device": device})
    except Exception as exc:  # noqa: BLE001
        return exc
    return [None if t.grad is None and t.is_leaf else
            (t.grad if t.grad is not None else t).detach().cpu().numpy().astype(np.float64) for t in out]


def test_the_catalogue_has_at_least_40_patterns():
    assert len(PATTERNS) >= 40


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_matches_torch(device, name):
    fn = PATTERNS[name]
    expected = _torch_run(fn)
    got = _fg_run(fn, device)
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), f"{name}: PyTorch raises ({expected}), flowgraph gave {got}"
        assert isinstance(got, fg.FlowError), f"{name}: flowgraph raised a {type(got).__name__}, not a FlowError"
        return
    if isinstance(got, Exception):
        raise AssertionError(f"{name}: flowgraph raised, PyTorch did not") from got
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None:
            assert g is None, f"{name}: result {i} is None in PyTorch, flowgraph gave {g}"
            continue
        assert g is not None, f"{name}: result {i} is None in flowgraph, PyTorch gave {e}"
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"{name}: result {i}")
