"""Attention and transformer encoder against PyTorch CPU, and float64 gradchecks.

Torch comparisons load torch's state_dict (``.detach().numpy()``) and compare outputs, attention weights,
input gradients and every parameter gradient in float32 with rtol=1e-5, atol=1e-5 (encoder stacks:
rtol=1e-4, atol=1e-5, LayerNorm and softmax over several layers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import attention as attention_module
from flowgraph.nn import functional as F

E, H = 8, 2
TOL = 1e-5


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _load_from_torch(module, t_module):
    sd = {k: v.detach().numpy() for k, v in t_module.state_dict().items()}
    assert list(sd) == list(module.state_dict()), "parameter names or order differ from torch"
    module.load_state_dict(sd)


def _pair_tensors(arrays, device, grad=True):
    f = [None if a is None else fg.tensor(a, device=device, requires_grad=grad and a.dtype == np.float32)
         for a in arrays]
    t = [None if a is None else torch.tensor(a, requires_grad=grad and a.dtype == np.float32) for a in arrays]
    return f, t


def _check_grads(f_outs, t_outs, f_ins, t_ins, module=None, t_module=None, rtol=TOL, atol=TOL):
    rng = np.random.default_rng(9)
    t_total, f_total = 0, 0
    for f, t in zip(f_outs, t_outs):
        if t is None:
            continue
        np.testing.assert_allclose(_np(f), t.detach().numpy(), rtol=rtol, atol=atol)
        g = rng.standard_normal(tuple(t.shape)).astype(np.float32)
        t_total = t_total + (t * torch.tensor(g)).sum()
        f_total = f_total + (f * fg.tensor(g, device=f.device)).sum()
    t_total.backward()
    f_total.backward()
    for f, t in zip(f_ins, t_ins):
        if t is not None and t.requires_grad:
            np.testing.assert_allclose(_np(f.grad), t.grad.numpy(), rtol=rtol, atol=atol, err_msg="input gradient")
    if module is not None:
        for name, p in t_module.named_parameters():
            np.testing.assert_allclose(_np(module.get_parameter(name).grad), p.grad.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"gradient of {name}")


# ---------------------------------------------------------------------- MultiheadAttention
MHA_OPTIONS = [
    ("default", {}),
    ("batch_first", {"batch_first": True}),
    ("bias_kv-zero_attn", {"add_bias_kv": True, "add_zero_attn": True}),
    ("kdim-vdim", {"kdim": 3, "vdim": 5}),
    ("nobias", {"bias": False}),
]
L, S, N = 4, 6, 3


def _masks(kind, rng, batched=True):
    """(attn_mask, key_padding_mask) as numpy arrays for a mask kind."""
    kpm_bool = np.zeros((N, S), bool)
    kpm_bool[0, -2:] = True
    kpm_bool[2, 0] = True
    causal_bool = np.triu(np.ones((L, S), bool), 1)
    if kind == "none":
        return None, None
    if kind == "kpm-bool":
        return None, kpm_bool if batched else kpm_bool[0]
    if kind == "kpm-float":
        return None, (rng.standard_normal((N, S)) if batched else rng.standard_normal(S)).astype(np.float32)
    if kind == "attn2d-bool":
        return causal_bool, None
    if kind == "attn2d-float":
        return rng.standard_normal((L, S)).astype(np.float32), None
    if kind == "attn3d-float+kpm-float":
        return rng.standard_normal((N * H, L, S)).astype(np.float32), rng.standard_normal((N, S)).astype(np.float32)
    if kind == "attn3d-bool+kpm-bool":
        m = np.zeros((N * H, L, S), bool)
        m[1, :, 1] = True
        return m, kpm_bool
    raise AssertionError(kind)


MASKS = ["none", "kpm-bool", "kpm-float", "attn2d-bool", "attn2d-float", "attn3d-float+kpm-float",
         "attn3d-bool+kpm-bool"]


@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)],
                         ids=["weights-avg", "weights-per-head", "no-weights"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("opt_id, kwargs", MHA_OPTIONS, ids=[o[0] for o in MHA_OPTIONS])
def test_multihead_attention_matches_torch(device, opt_id, kwargs, mask_kind, need_weights, average):
    torch.manual_seed(0)
    t_module = torch.nn.MultiheadAttention(E, H, **kwargs)
    module = nn.MultiheadAttention(E, H, **kwargs).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(1)
    shapes = [(L, N, E), (S, N, kwargs.get("kdim", E)), (S, N, kwargs.get("vdim", E))]
    if kwargs.get("batch_first"):
        shapes = [(s[1], s[0], s[2]) for s in shapes]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    attn_mask, kpm = _masks(mask_kind, rng)
    f_in, t_in = _pair_tensors(arrays, device)
    (f_am, f_kpm), (t_am, t_kpm) = _pair_tensors([attn_mask, kpm], device, grad=False)
    f_out = module(*f_in, key_padding_mask=f_kpm, attn_mask=f_am, need_weights=need_weights,
                   average_attn_weights=average)
    t_out = t_module(*t_in, key_padding_mask=t_kpm, attn_mask=t_am, need_weights=need_weights,
                     average_attn_weights=average)
    assert (f_out[1] is None) == (t_out[1] is None)
    _check_grads(list(f_out), list(t_out), f_in, t_in, module, t_module)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_self_attention_packed_path_matches_torch(device, batch_first):
    torch.manual_seed(0)
    t_module = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    module = nn.MultiheadAttention(E, H, batch_first=batch_first).to(device)
    _load_from_torch(module, t_module)
    x = np.random.default_rng(2).standard_normal((N, L, E) if batch_first else (L, N, E)).astype(np.float32)
    (fx,), (tx,) = _pair_tensors([x], device)
    causal = np.triu(np.full((L, L), -np.inf, np.float32), 1)
    f_out = module(fx, fx, fx, attn_mask=fg.tensor(causal, device=device), is_causal=True)
    t_out = t_module(tx, tx, tx, attn_mask=torch.tensor(causal), is_causal=True)
    _check_grads(list(f_out), list(t_out), [fx], [tx], module, t_module)


@pytest.mark.parametrize("mask_kind", ["none", "kpm-bool", "attn2d-float"])
def test_multihead_attention_unbatched_matches_torch(device, mask_kind):
    torch.manual_seed(0)
    t_module = torch.nn.MultiheadAttention(E, H)
    module = nn.MultiheadAttention(E, H).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(L, E), (S, E), (S, E)]]
    attn_mask, kpm = _masks(mask_kind, rng, batched=False)
    f_in, t_in = _pair_tensors(arrays, device)
    (f_am, f_kpm), (t_am, t_kpm) = _pair_tensors([attn_mask, kpm], device, grad=False)
    f_out = module(*f_in, key_padding_mask=f_kpm, attn_mask=f_am)
    t_out = t_module(*t_in, key_padding_mask=t_kpm, attn_mask=t_am)
    assert tuple(f_out[1].shape) == tuple(t_out[1].shape) == (L, S)
    _check_grads(list(f_out), list(t_out), f_in, t_in, module, t_module)


def test_multihead_attention_dropout(device):
    # p=1 drops every attention weight (deterministic, comparable with torch); eval mode turns dropout off
    torch.manual_seed(0)
    x = np.random.default_rng(4).standard_normal((L, N, E)).astype(np.float32)
    for p, train in [(1.0, True), (0.5, False)]:
        t_module = torch.nn.MultiheadAttention(E, H, dropout=p).train(train)
        module = nn.MultiheadAttention(E, H, dropout=p).to(device).train(train)
        _load_from_torch(module, t_module)
        f_out = module(*[fg.tensor(x, device=device)] * 3)
        t_out = t_module(*[torch.tensor(x)] * 3)
        for f, t in zip(f_out, t_out):
            np.testing.assert_allclose(_np(f), t.detach().numpy(), rtol=TOL, atol=TOL)


def test_multihead_attention_parameters_and_init_like_torch():
    for kwargs in [{}, {"kdim": 3, "vdim": 5, "add_bias_kv": True}, {"bias": False}]:
        module = nn.MultiheadAttention(E, H, **kwargs)
        t_module = torch.nn.MultiheadAttention(E, H, **kwargs)
        assert [(n, tuple(p.shape)) for n, p in module.named_parameters()] == \
            [(n, tuple(p.shape)) for n, p in t_module.named_parameters()]
    module = nn.MultiheadAttention(E, H)
    assert not _np(module.in_proj_bias).any() and not _np(module.out_proj.bias).any()
    bound = np.sqrt(6 / (E + 3 * E))  # xavier_uniform_ on (3E, E)
    w = _np(module.in_proj_weight)
    assert np.abs(w).max() <= bound and w.std() > bound / 4


def test_multihead_attention_errors():
    with pytest.raises(fg.FlowError, match="divisible"):
        nn.MultiheadAttention(10, 3)
    mha = nn.MultiheadAttention(E, H)
    x = fg.zeros(L, N, E)
    with pytest.raises(fg.FlowError, match="causal"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(fg.ShapeError, match="key_padding_mask"):
        mha(x, x, x, key_padding_mask=fg.zeros(N, L + 1, dtype=fg.bool))
    with pytest.raises(fg.ShapeError, match="2-d attn_mask"):
        mha(x, x, x, attn_mask=fg.zeros(L, L + 1))
    with pytest.raises(fg.ShapeError, match="embed_dim"):
        mha(fg.zeros(L, N, E + 1), x, x)


# ---------------------------------------------------------------------- scaled_dot_product_attention
SDPA_CASES = [
    ("plain", {}, None),
    ("bool-mask-broadcast", {}, "bool"),
    ("float-mask", {}, "float"),
    ("causal", {"is_causal": True}, None),
    ("scale", {"scale": 0.3}, "float"),
    ("gqa", {"enable_gqa": True}, None),
]


@pytest.mark.parametrize("cid, kwargs, mask", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_scaled_dot_product_attention_matches_torch(device, cid, kwargs, mask):
    rng = np.random.default_rng(5)
    heads_kv = 2 if kwargs.get("enable_gqa") else 4
    q = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    k = rng.standard_normal((2, heads_kv, 6, 3)).astype(np.float32)
    v = rng.standard_normal((2, heads_kv, 6, 7)).astype(np.float32)
    m = None
    if mask == "bool":
        m = rng.uniform(size=(5, 6)) > 0.3
        m[:, 0] = True  # every query keeps one key
    elif mask == "float":
        m = rng.standard_normal((2, 1, 5, 6)).astype(np.float32)
    f_in, t_in = _pair_tensors([q, k, v], device)
    (f_m,), (t_m,) = _pair_tensors([m], device, grad=False)
    out = F.scaled_dot_product_attention(*f_in, attn_mask=f_m, **kwargs)
    ref = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kwargs)
    _check_grads([out], [ref], f_in, t_in)


def test_fully_masked_rows_like_torch(device):
    # sdpa (and MHA without weights, which runs on it) gives a fully masked query zeros and a zero gradient;
    # MHA with need_weights=True gives NaN there, as PyTorch does
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    mask = np.ones((3, 3), bool)
    mask[1] = False
    f_in, t_in = _pair_tensors([q, q.copy(), q.copy()], device)
    out = F.scaled_dot_product_attention(*f_in, attn_mask=fg.tensor(mask, device=device))
    ref = TF.scaled_dot_product_attention(*t_in, attn_mask=torch.tensor(mask))
    _check_grads([out], [ref], f_in, t_in)
    assert not _np(out)[:, 1].any()
    torch.manual_seed(0)
    t_module = torch.nn.MultiheadAttention(E, H)
    module = nn.MultiheadAttention(E, H).to(device)
    _load_from_torch(module, t_module)
    x = rng.standard_normal((L, N, E)).astype(np.float32)
    kpm = np.zeros((N, L), bool)
    kpm[0] = True
    for need_weights in (False, True):
        f_out = module(*[fg.tensor(x, device=device)] * 3, key_padding_mask=fg.tensor(kpm, device=device),
                       need_weights=need_weights)[0]
        t_out = t_module(*[torch.tensor(x)] * 3, key_padding_mask=torch.tensor(kpm), need_weights=need_weights)[0]
        np.testing.assert_allclose(_np(f_out), t_out.detach().numpy(), rtol=TOL, atol=TOL, equal_nan=True)
        assert np.isnan(_np(f_out)[:, 0]).all() == need_weights


def test_scaled_dot_product_attention_dropout_one_gives_zeros(device):
    q = fg.randn(2, 3, 4, device=device)
    assert not _np(F.scaled_dot_product_attention(q, q, q, dropout_p=1.0)).any()


def test_scaled_dot_product_attention_errors():
    q = fg.zeros(2, 3, 4)
    with pytest.raises(fg.FlowError, match="not both"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=fg.zeros(3, 3), is_causal=True)
    with pytest.raises(fg.ShapeError, match="same last dim"):
        F.scaled_dot_product_attention(q, fg.zeros(2, 3, 5), q)


# ---------------------------------------------------------------------- transformer encoder
ENC_OPTIONS = [
    ("post-norm-relu", {}),
    ("pre-norm-gelu", {"norm_first": True, "activation": "gelu"}),
    ("batch_first-nobias", {"batch_first": True, "bias": False}),
    ("callable-activation", {"activation": "callable"}),
]


def _encoder_kwargs(kwargs, lib):
    if kwargs.get("activation") == "callable":
        return dict(kwargs, activation=(torch.tanh if lib == "torch" else fg.tanh))
    return kwargs


@pytest.mark.parametrize("mask_kind", ["none", "kpm-bool", "attn2d-float"])
@pytest.mark.parametrize("opt_id, kwargs", ENC_OPTIONS, ids=[o[0] for o in ENC_OPTIONS])
def test_transformer_encoder_layer_matches_torch(device, opt_id, kwargs, mask_kind):
    torch.manual_seed(0)
    t_module = torch.nn.TransformerEncoderLayer(E, H, 16, **_encoder_kwargs(kwargs, "torch")).eval()
    module = nn.TransformerEncoderLayer(E, H, 16, **_encoder_kwargs(kwargs, "fg")).to(device).eval()
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((N, S, E) if kwargs.get("batch_first") else (S, N, E)).astype(np.float32)
    attn_mask, kpm = _masks(mask_kind, rng)
    if attn_mask is not None:
        attn_mask = rng.standard_normal((S, S)).astype(np.float32)
    (fx,), (tx,) = _pair_tensors([x], device)
    (f_am, f_kpm), (t_am, t_kpm) = _pair_tensors([attn_mask, kpm], device, grad=False)
    f_out = module(fx, src_mask=f_am, src_key_padding_mask=f_kpm)
    t_out = t_module(tx, src_mask=t_am, src_key_padding_mask=t_kpm)  # tx requires grad: torch's slow path
    _check_grads([f_out], [t_out], [fx], [tx], module, t_module)


def test_transformer_encoder_layer_dropout_in_training(device):
    module = nn.TransformerEncoderLayer(E, H, 16, dropout=0.5).to(device)
    x = fg.randn(S, N, E, device=device)
    module.eval()
    ref = _np(module(x))
    module.train()
    fg.manual_seed(1)
    a = _np(module(x))
    fg.manual_seed(1)
    np.testing.assert_array_equal(a, _np(module(x)))
    assert not np.allclose(a, ref)


@pytest.mark.parametrize("with_norm", [False, True])
def test_transformer_encoder_matches_torch(device, with_norm):
    torch.manual_seed(0)
    t_layer = torch.nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, norm_first=True)
    t_module = torch.nn.TransformerEncoder(t_layer, 2, norm=torch.nn.LayerNorm(E) if with_norm else None,
                                           enable_nested_tensor=False)
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, norm_first=True)
    module = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E) if with_norm else None).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((S, N, E)).astype(np.float32)
    kpm = _masks("kpm-bool", rng)[1]
    (fx,), (tx,) = _pair_tensors([x], device)
    f_out = module(fx, src_key_padding_mask=fg.tensor(kpm, device=device))
    t_out = t_module(tx, src_key_padding_mask=torch.tensor(kpm))
    _check_grads([f_out], [t_out], [fx], [tx], module, t_module, rtol=1e-4)


def test_transformer_encoder_copies_are_independent_like_torch_deepcopy():
    layer = nn.TransformerEncoderLayer(E, H, 16)
    enc = nn.TransformerEncoder(layer, 3)
    w0, w1 = enc.layers[0].linear1.weight, enc.layers[1].linear1.weight
    np.testing.assert_array_equal(_np(w0), _np(layer.linear1.weight))
    np.testing.assert_array_equal(_np(w0), _np(w1))
    with fg.no_grad():
        w0.add_(1.0)
    assert not np.allclose(_np(w0), _np(w1))
    assert len(list(enc.parameters())) == 3 * len(list(layer.parameters()))


# ---------------------------------------------------------------------- float64 gradchecks
def _with_params(module, call):
    names = [n for n, _ in module.named_parameters()]

    def fn(*args):
        inputs, params = args[: len(args) - len(names)], args[len(args) - len(names):]
        owners = [module.get_submodule(n.rpartition(".")[0]) for n in names]
        saved = [(o, n.rpartition(".")[2], o._parameters[n.rpartition(".")[2]]) for o, n in zip(owners, names)]
        for (o, short, _), p in zip(saved, params):
            o._parameters[short] = p
        try:
            return call(module, *inputs)
        finally:
            for o, short, old in saved:
                o._parameters[short] = old

    return fn, [p for _, p in module.named_parameters()]


_KPM = np.array([[False, False, True], [False, False, False]])
# name -> (constructor or None for a function, input shapes, call(module, *inputs)[, check parameters too])
GRADCHECK = {
    "MultiheadAttention": (
        lambda: nn.MultiheadAttention(4, 2, add_bias_kv=True, kdim=3, vdim=2), [(2, 2, 4), (3, 2, 3), (3, 2, 2)],
        lambda m, q, k, v: m(q, k, v, key_padding_mask=fg.tensor(_KPM, device=q.device),
                             average_attn_weights=False)),
    "TransformerEncoderLayer": (
        lambda: nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, activation="gelu"), [(3, 2, 4)],
        lambda m, x: m(x, src_key_padding_mask=fg.tensor(_KPM, device=x.device))),
    # the stack's parameters are those of its layers, gradchecked in the row above: check the input only
    "TransformerEncoder": (
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, norm_first=True), 2),
        [(3, 2, 4)], lambda m, x: m(x), False),
    # decoder rows check the inputs only: their parameters are those of the rows above (MultiheadAttention,
    # and the encoder layer's Linear/LayerNorm), and tests/nn/test_transformer.py compares every parameter
    # gradient with torch's on each backend
    "TransformerDecoderLayer": (
        lambda: nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0, norm_first=True), [(2, 2, 4), (3, 2, 4)],
        lambda m, t, mem: m(t, mem, tgt_mask=nn.Transformer.generate_square_subsequent_mask(2, t.device, t.dtype),
                            memory_key_padding_mask=fg.tensor(_KPM, device=t.device)), False),
    "TransformerDecoder": (
        lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0), 2), [(2, 1, 4), (3, 1, 4)],
        lambda m, t, mem: m(t, mem), False),
    "Transformer": (
        lambda: nn.Transformer(4, 2, 1, 1, 6, dropout=0.0), [(3, 1, 4), (2, 1, 4)],
        lambda m, src, tgt: m(src, tgt, src_key_padding_mask=fg.tensor(_KPM[:1], device=src.device)), False),
    "scaled_dot_product_attention": (
        None, [(2, 3, 4), (2, 5, 4), (2, 5, 3), (3, 5)],
        lambda m, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
    "multi_head_attention_forward": (
        None, [(2, 1, 4), (12, 4), (12,), (4, 4)],
        lambda m, x, w, b, wo: F.multi_head_attention_forward(x, x, x, 4, 2, w, b, None, None, False, 0.0, wo,
                                                              None)),
}


def test_every_attention_export_has_a_gradcheck_row():
    names = set(attention_module.__all__) | set(attention_module.__functional__)
    assert sorted(names - set(GRADCHECK)) == []


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck_float64(device, name):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    make, shapes, call, *flags = GRADCHECK[name]
    with_params = flags[0] if flags else True
    rng = np.random.default_rng(0)
    inputs = [fg.tensor(rng.standard_normal(s) * 0.7, dtype=fg.float64, device=device, requires_grad=True)
              for s in shapes]
    if make is None:
        assert fg.gradcheck(lambda *a: call(None, *a), inputs)
        return
    fg.manual_seed(0)
    module = make().double().to(device)
    if not with_params:
        assert fg.gradcheck(lambda *a: call(module, *a), inputs)
        return
    fn, params = _with_params(module, call)
    assert fg.gradcheck(fn, inputs + params)
