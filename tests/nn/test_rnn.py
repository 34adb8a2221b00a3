"""Recurrent layers and cells against PyTorch CPU, and float64 gradchecks.

Torch comparisons load torch's state_dict (converted with ``.detach().numpy()``) into the flowgraph module
and compare, in float32, the outputs, final states, input/initial-state gradients and every parameter
gradient. Tolerance: rtol=1e-5, atol=1e-5 for sequences up to 7 steps; rtol=1e-4, atol=1e-4 for the
3-layer bidirectional 30-step case (float32 rounding accumulates through the recurrence).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import rnn as rnn_module

IN, HID = 4, 5


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _load_from_torch(module, t_module):
    sd = {k: v.detach().numpy() for k, v in t_module.state_dict().items()}
    assert list(sd) == list(module.state_dict()), "parameter names or order differ from torch"
    module.load_state_dict(sd)


def _flatten_out(out):
    """(output, h_n) or (output, (h_n, c_n)) or a cell's h / (h, c) -> list of tensors."""
    if not isinstance(out, tuple):
        return [out]
    flat = []
    for o in out:
        flat.extend(o if isinstance(o, tuple) else [o])
    return flat


def _backward_both(fg_outs, t_outs, seed=5):
    r = np.random.default_rng(seed)
    t_total, fg_total = 0, 0
    for f, t in zip(fg_outs, t_outs):
        g = r.standard_normal(tuple(t.shape)).astype(np.float32)
        t_total = t_total + (t * torch.tensor(g)).sum()
        fg_total = fg_total + (f * fg.tensor(g, device=f.device)).sum()
    t_total.backward()
    fg_total.backward()


# (id, class name, constructor kwargs)
LAYERS = [
    ("rnn-tanh", "RNN", {}),
    ("rnn-relu", "RNN", {"nonlinearity": "relu"}),
    ("gru", "GRU", {}),
    ("lstm", "LSTM", {}),
    ("lstm-proj", "LSTM", {"proj_size": 3}),
]
# (id, kwargs, sequence length, batch (None: unbatched), give initial state, rtol/atol)
OPTIONS = [
    ("1layer", {}, 6, 3, False, 1e-5),
    ("2layer-bidir", {"num_layers": 2, "bidirectional": True}, 5, 2, False, 1e-5),
    ("batchfirst-hx", {"batch_first": True}, 7, 3, True, 1e-5),
    ("nobias-2layer-hx", {"bias": False, "num_layers": 2}, 4, 2, True, 1e-5),
    ("unbatched-bidir-hx", {"bidirectional": True}, 5, None, True, 1e-5),
    ("unbatched-batchfirst", {"batch_first": True}, 4, None, False, 1e-5),
    ("3layer-bidir-long", {"num_layers": 3, "bidirectional": True, "batch_first": True}, 30, 2, True, 1e-4),
]


def _initial_state(cls, kwargs, batch, rng):
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    proj = kwargs.get("proj_size", 0)
    lead = (layers,) if batch is None else (layers, batch)
    h = (rng.standard_normal(lead + (proj or HID,)) * 0.5).astype(np.float32)
    if cls == "LSTM":
        return [h, (rng.standard_normal(lead + (HID,)) * 0.5).astype(np.float32)]
    return [h]


@pytest.mark.parametrize("opt_id, opts, length, batch, with_hx, tol", OPTIONS, ids=[o[0] for o in OPTIONS])
@pytest.mark.parametrize("lid, cls, lkw", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_layer_matches_torch(device, lid, cls, lkw, opt_id, opts, length, batch, with_hx, tol):
    kwargs = dict(lkw, **opts)
    torch.manual_seed(0)
    t_module = getattr(torch.nn, cls)(IN, HID, **kwargs)
    module = getattr(nn, cls)(IN, HID, **kwargs).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(1)
    if batch is None:
        shape = (length, IN)
    else:
        shape = (batch, length, IN) if kwargs.get("batch_first") else (length, batch, IN)
    x = rng.standard_normal(shape).astype(np.float32)
    fx, tx = fg.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    f_args, t_args = [fx], [tx]
    f_states, t_states = [], []
    if with_hx:
        states = _initial_state(cls, kwargs, batch, rng)
        f_states = [fg.tensor(s, device=device, requires_grad=True) for s in states]
        t_states = [torch.tensor(s, requires_grad=True) for s in states]
        f_args.append(tuple(f_states) if cls == "LSTM" else f_states[0])
        t_args.append(tuple(t_states) if cls == "LSTM" else t_states[0])
    f_outs = _flatten_out(module(*f_args))
    t_outs = _flatten_out(t_module(*t_args))
    assert [tuple(f.shape) for f in f_outs] == [tuple(t.shape) for t in t_outs]
    for f, t in zip(f_outs, t_outs):
        np.testing.assert_allclose(_np(f), t.detach().numpy(), rtol=tol, atol=tol)
    _backward_both(f_outs, t_outs)
    np.testing.assert_allclose(_np(fx.grad), tx.grad.numpy(), rtol=tol, atol=tol, err_msg="input gradient")
    for f, t in zip(f_states, t_states):
        np.testing.assert_allclose(_np(f.grad), t.grad.numpy(), rtol=tol, atol=tol, err_msg="state gradient")
    for name, p in t_module.named_parameters():
        np.testing.assert_allclose(_np(module.get_parameter(name).grad), p.grad.numpy(), rtol=tol, atol=tol,
                                   err_msg=f"gradient of {name}")


@pytest.mark.parametrize("cls", ["RNN", "GRU", "LSTM"])
def test_dropout_between_layers_matches_torch_at_p1_and_is_off_in_eval(device, cls):
    # p=1 zeroes the whole input of layer 2 in training mode: deterministic, so torch can be compared exactly
    torch.manual_seed(0)
    x = np.random.default_rng(2).standard_normal((5, 2, IN)).astype(np.float32)
    for p, train in [(1.0, True), (0.5, False)]:
        t_module = getattr(torch.nn, cls)(IN, HID, num_layers=2, dropout=p).train(train)
        module = getattr(nn, cls)(IN, HID, num_layers=2, dropout=p).to(device).train(train)
        _load_from_torch(module, t_module)
        f_out = _flatten_out(module(fg.tensor(x, device=device)))
        t_out = _flatten_out(t_module(torch.tensor(x)))
        for f, t in zip(f_out, t_out):
            np.testing.assert_allclose(_np(f), t.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_dropout_between_layers_is_random_in_training(device):
    module = nn.GRU(IN, HID, num_layers=2, dropout=0.5).to(device)
    x = fg.randn(5, 2, IN, device=device)
    module.eval()
    ref = _np(module(x)[0])
    module.train()
    fg.manual_seed(3)
    a = _np(module(x)[0])
    fg.manual_seed(3)
    b = _np(module(x)[0])
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, ref)


CELLS = [
    ("rnncell-tanh", "RNNCell", {}),
    ("rnncell-relu", "RNNCell", {"nonlinearity": "relu"}),
    ("rnncell-nobias", "RNNCell", {"bias": False}),
    ("grucell", "GRUCell", {}),
    ("grucell-nobias", "GRUCell", {"bias": False}),
    ("lstmcell", "LSTMCell", {}),
    ("lstmcell-nobias", "LSTMCell", {"bias": False}),
]


@pytest.mark.parametrize("batch", [3, None], ids=["batched", "unbatched"])
@pytest.mark.parametrize("with_hx", [False, True], ids=["zeros", "hx"])
@pytest.mark.parametrize("cid, cls, kwargs", CELLS, ids=[c[0] for c in CELLS])
def test_cell_matches_torch(device, cid, cls, kwargs, with_hx, batch):
    torch.manual_seed(0)
    t_module = getattr(torch.nn, cls)(IN, HID, **kwargs)
    module = getattr(nn, cls)(IN, HID, **kwargs).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(4)
    lead = () if batch is None else (batch,)
    x = rng.standard_normal(lead + (IN,)).astype(np.float32)
    fx, tx = fg.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    f_args, t_args, f_states, t_states = [fx], [tx], [], []
    if with_hx:
        states = [rng.standard_normal(lead + (HID,)).astype(np.float32) for _ in range(2 if cls == "LSTMCell"
                                                                                         else 1)]
        f_states = [fg.tensor(s, device=device, requires_grad=True) for s in states]
        t_states = [torch.tensor(s, requires_grad=True) for s in states]
        f_args.append(tuple(f_states) if cls == "LSTMCell" else f_states[0])
        t_args.append(tuple(t_states) if cls == "LSTMCell" else t_states[0])
    f_outs = _flatten_out(module(*f_args))
    t_outs = _flatten_out(t_module(*t_args))
    for f, t in zip(f_outs, t_outs):
        assert tuple(f.shape) == tuple(t.shape)
        np.testing.assert_allclose(_np(f), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    _backward_both(f_outs, t_outs)
    np.testing.assert_allclose(_np(fx.grad), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    for f, t in zip(f_states, t_states):
        np.testing.assert_allclose(_np(f.grad), t.grad.numpy(), rtol=1e-5, atol=1e-6)
    for name, p in t_module.named_parameters():
        np.testing.assert_allclose(_np(module.get_parameter(name).grad), p.grad.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("accumulates", [False, True], ids=["sums-added", "sums-accumulated"])
def test_gru_cell_unrolled_bias_gradients_match_torch_and_accumulate_in_place(device, monkeypatch, accumulates):
    """A GRUCell applied at every step of a sequence: its biases' gradients are batch sums of the fused cell's
    gate gradients, one pair a step. Where the backend adds into a running sum in its kernel
    (``accumulates_in_place``) they go back deferred and the engine adds them in place
    (``Backend.bias_grad_accumulate``: no separate reduce and add per step); elsewhere they are summed and
    added. Both paths against torch, parameters and input gradients included."""
    bk = fg.get_backend(device)
    monkeypatch.setattr(bk, "accumulates_in_place", accumulates)
    calls = [0]
    original = bk.bias_grad_accumulate

    def counted(dst, g):
        calls[0] += 1
        return original(dst, g)

    monkeypatch.setattr(bk, "bias_grad_accumulate", counted)
    torch.manual_seed(0)
    t_cell = torch.nn.GRUCell(IN, HID)
    cell = nn.GRUCell(IN, HID).to(device)
    _load_from_torch(cell, t_cell)
    steps = 6
    xs = np.random.default_rng(5).standard_normal((steps, 3, IN)).astype(np.float32)
    fx, tx = fg.tensor(xs, device=device, requires_grad=True), torch.tensor(xs, requires_grad=True)
    fh, th = None, None
    for t in range(steps):
        fh, th = cell(fx[t], fh), t_cell(tx[t], th)
    (fh * fh).sum().backward()
    (th * th).sum().backward()
    for name, p in t_cell.named_parameters():
        np.testing.assert_allclose(_np(cell.get_parameter(name).grad), p.grad.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    np.testing.assert_allclose(_np(fx.grad), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    # the first two contributions of each bias start the engine's own sum; every later one is added into it
    assert calls[0] == (2 * (steps - 2) if accumulates else 0)


@pytest.mark.parametrize("cls, kwargs", [("RNN", {"num_layers": 2, "bidirectional": True}),
                                         ("LSTM", {"num_layers": 2, "proj_size": 2, "bidirectional": True}),
                                         ("GRU", {"bias": False}), ("RNNCell", {}), ("LSTMCell", {}),
                                         ("GRUCell", {})])
def test_parameter_names_shapes_and_init_match_torch(cls, kwargs):
    fg.manual_seed(0)
    module = getattr(nn, cls)(IN, HID, **kwargs)
    t_module = getattr(torch.nn, cls)(IN, HID, **kwargs)
    assert [(n, tuple(p.shape)) for n, p in module.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in t_module.named_parameters()]
    bound = 1 / math.sqrt(HID)
    drawn = []
    for _, p in module.named_parameters():
        values = _np(p)
        assert values.min() >= -bound and values.max() <= bound
        assert len(np.unique(values)) > values.size // 2  # drawn, not left at a constant
        drawn.append(values.ravel())
    # U(-b, b) has std b / sqrt(3); all parameters together (a 5-value bias alone falls below b / 4 about one
    # seed in fifty)
    assert np.concatenate(drawn).std() > bound / 2


def test_all_weights_groups_like_torch():
    module = nn.LSTM(IN, HID, num_layers=2, bidirectional=True, proj_size=2)
    t_module = torch.nn.LSTM(IN, HID, num_layers=2, bidirectional=True, proj_size=2)
    assert [[tuple(p.shape) for p in group] for group in module.all_weights] == \
        [[tuple(p.shape) for p in group] for group in t_module.all_weights]


def test_errors_say_what_is_wrong():
    with pytest.raises(fg.ShapeError, match="input_size=4"):
        nn.GRU(4, 5)(fg.zeros(3, 2, 6))
    with pytest.raises(fg.ShapeError, match="hx has shape"):
        nn.RNN(4, 5)(fg.zeros(3, 2, 4), fg.zeros(2, 2, 5))
    with pytest.raises(fg.FlowError, match="proj_size is supported by LSTM only"):
        nn.RNNBase("GRU", 4, 5, proj_size=2)
    with pytest.raises(fg.FlowError, match="smaller than hidden_size"):
        nn.LSTM(4, 5, proj_size=5)
    with pytest.raises(fg.FlowError, match="nonlinearity"):
        nn.RNN(4, 5, nonlinearity="sigmoid")
    with pytest.raises(fg.FlowError, match="tuple"):
        nn.LSTM(4, 5)(fg.zeros(3, 2, 4), fg.zeros(1, 2, 5))
    with pytest.warns(UserWarning, match="no effect"):
        nn.GRU(4, 5, dropout=0.3)


@pytest.mark.parametrize("cls", ["GRUCell", "LSTMCell"])
def test_fused_cells_support_double_backward(device, cls):
    # the fused pointwise nodes recompute their values under create_graph, so second derivatives match torch
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    cell = getattr(nn, cls)(3, 2).double().to(device)
    t_cell = getattr(torch.nn, cls)(3, 2).double()
    t_cell.load_state_dict({k: torch.tensor(_np(v)) for k, v in cell.state_dict().items()})
    x0 = np.random.default_rng(0).standard_normal((2, 3))
    x = fg.tensor(x0, dtype=fg.float64, device=device, requires_grad=True)
    tx = torch.tensor(x0, requires_grad=True)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    (gx,) = fg.autograd.grad((first(cell(x)) ** 2).sum(), [x], create_graph=True)
    ggx, ggw = fg.autograd.grad((gx * gx).sum(), [x, cell.weight_ih])
    (tgx,) = torch.autograd.grad((first(t_cell(tx)) ** 2).sum(), [tx], create_graph=True)
    tggx, tggw = torch.autograd.grad((tgx * tgx).sum(), [tx, t_cell.weight_ih])
    np.testing.assert_allclose(_np(gx), tgx.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(_np(ggx), tggx.numpy(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(_np(ggw), tggw.numpy(), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("head", ["square", "linear"])
@pytest.mark.parametrize("cls", ["GRU", "LSTM", "RNN"])
def test_layer_double_backward_and_retain_graph(device, cls, head):
    # the per-direction hidden projection files step gradients for one weight matmul; under create_graph it
    # returns differentiable gradients instead (also where the gradient reaching it is a constant: a linear
    # head), and a retained graph can run backward twice
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    layer = getattr(nn, cls)(3, 2, bidirectional=True).double().to(device)
    t_layer = getattr(torch.nn, cls)(3, 2, bidirectional=True).double()
    t_layer.load_state_dict({k: torch.tensor(_np(v)) for k, v in layer.state_dict().items()})
    x0 = np.random.default_rng(1).standard_normal((4, 2, 3))
    x = fg.tensor(x0, dtype=fg.float64, device=device, requires_grad=True)
    tx = torch.tensor(x0, requires_grad=True)
    c0 = np.random.default_rng(2).standard_normal((4, 2, 4))
    f = (lambda y: y ** 2) if head == "square" else (lambda y: y * fg.tensor(c0, device=device))
    tf = (lambda y: y ** 2) if head == "square" else (lambda y: y * torch.tensor(c0))
    (gx,) = fg.autograd.grad(f(layer(x)[0]).sum(), [x], create_graph=True)
    ggx, ggw = fg.autograd.grad((gx * gx).sum(), [x, layer.weight_hh_l0])
    (tgx,) = torch.autograd.grad(tf(t_layer(tx)[0]).sum(), [tx], create_graph=True)
    tggx, tggw = torch.autograd.grad((tgx * tgx).sum(), [tx, t_layer.weight_hh_l0])
    np.testing.assert_allclose(_np(ggx), tggx.numpy(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(_np(ggw), tggw.numpy(), rtol=1e-8, atol=1e-12)
    loss = layer(x)[0].sum()
    loss.backward(retain_graph=True)
    once = _np(layer.weight_hh_l0_reverse.grad).copy()
    loss.backward()
    np.testing.assert_allclose(_np(layer.weight_hh_l0_reverse.grad), 2 * once, rtol=1e-12)


# ---------------------------------------------------------------------- float64 gradchecks
def _with_params(module, call):
    """A function of (inputs..., parameters...) that runs ``call(module, *inputs)`` with those parameters."""
    names = [n for n, _ in module.named_parameters()]

    def fn(*args):
        inputs, params = args[: len(args) - len(names)], args[len(args) - len(names):]
        saved = dict(module._parameters)
        for n, p in zip(names, params):
            module._parameters[n] = p
        try:
            return call(module, *inputs)
        finally:
            module._parameters.update(saved)

    return fn, [p for _, p in module.named_parameters()]


# id -> (constructor, input shapes, call(module, *inputs) returning the outputs)
GRADCHECK = {
    "RNN": (lambda: nn.RNN(2, 3, num_layers=2, bidirectional=True), [(3, 2, 2), (4, 2, 3)],
            lambda m, x, h: m(x, h)),
    "RNN-relu": (lambda: nn.RNN(2, 3, nonlinearity="relu", batch_first=True), [(2, 3, 2)], lambda m, x: m(x)),
    "GRU": (lambda: nn.GRU(2, 3, bidirectional=True), [(3, 2, 2), (2, 2, 3)], lambda m, x, h: m(x, h)),
    "LSTM": (lambda: nn.LSTM(2, 3, bidirectional=True, proj_size=2), [(3, 2, 2), (2, 2, 2), (2, 2, 3)],
             lambda m, x, h, c: _flatten_out(m(x, (h, c)))),
    "RNNCell": (lambda: nn.RNNCell(2, 3), [(2, 2), (2, 3)], lambda m, x, h: m(x, h)),
    "GRUCell": (lambda: nn.GRUCell(2, 3), [(2, 2), (2, 3)], lambda m, x, h: m(x, h)),
    "LSTMCell": (lambda: nn.LSTMCell(2, 3), [(2, 2), (2, 3), (2, 3)], lambda m, x, h, c: m(x, (h, c))),
}


def test_every_recurrent_module_has_a_gradcheck_row():
    exported = set(rnn_module.__all__) - {"RNNBase", "RNNCellBase"}
    assert sorted(exported - {k.split("-")[0] for k in GRADCHECK}) == []


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck_float64(device, name):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    make, shapes, call = GRADCHECK[name]
    fg.manual_seed(0)
    module = make().double().to(device)
    fn, params = _with_params(module, call)
    rng = np.random.default_rng(0)
    inputs = [fg.tensor(rng.standard_normal(s) * 0.7, dtype=fg.float64, device=device, requires_grad=True)
              for s in shapes]
    assert fg.gradcheck(fn, inputs + params)
