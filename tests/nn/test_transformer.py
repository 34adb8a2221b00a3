"""``nn.TransformerDecoderLayer``, ``nn.TransformerDecoder`` and ``nn.Transformer`` against PyTorch CPU.

Each comparison builds the torch module, loads its ``state_dict()`` (converted to NumPy) into the flowgraph
module (the key names and their order must be identical), runs both in eval mode on the same inputs and
masks, and compares the output, the input gradients and every parameter gradient in float32
(single layers: rtol=atol=1e-5; stacks of several layers: rtol=1e-4, atol=1e-5).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from tests.nn.test_attention import _check_grads, _load_from_torch, _np, _pair_tensors

E, H, FF = 8, 2, 16
T, S, N = 5, 6, 3  # target length, source length, batch


def _kwargs(kwargs, lib):
    """The constructor arguments for one library (a callable activation is each library's own tanh)."""
    if kwargs.get("activation") == "callable":
        return dict(kwargs, activation=(torch.tanh if lib == "torch" else fg.tanh))
    return kwargs


def _layout(shape, batch_first):
    """(L, N, E) -> (N, L, E) when batch_first."""
    return (shape[1], shape[0], shape[2]) if batch_first else shape


def _decoder_masks(kind, rng):
    """(tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask) as NumPy arrays or None."""
    tgt_kpm = np.zeros((N, T), bool)
    tgt_kpm[1, -1] = True
    mem_kpm = np.zeros((N, S), bool)
    mem_kpm[0, -2:] = True
    mem_kpm[2, 0] = True
    if kind == "none":
        return None, None, None, None
    if kind == "causal":
        return torch.nn.Transformer.generate_square_subsequent_mask(T).numpy(), None, None, None
    if kind == "causal+padding":
        return torch.nn.Transformer.generate_square_subsequent_mask(T).numpy(), None, tgt_kpm, mem_kpm
    if kind == "bool+memory-float":
        return (np.triu(np.ones((T, T), bool), 1), rng.standard_normal((T, S)).astype(np.float32),
                None, rng.standard_normal((N, S)).astype(np.float32))
    raise AssertionError(kind)


# ---------------------------------------------------------------------- decoder layer
DEC_OPTIONS = [
    ("post-norm-relu", {}),
    ("pre-norm-gelu", {"norm_first": True, "activation": "gelu"}),
    ("batch_first-nobias", {"batch_first": True, "bias": False}),
    ("callable-activation-eps", {"activation": "callable", "layer_norm_eps": 1e-3}),
]


@pytest.mark.parametrize("mask_kind", ["none", "causal+padding", "bool+memory-float"])
@pytest.mark.parametrize("opt_id, kwargs", DEC_OPTIONS, ids=[o[0] for o in DEC_OPTIONS])
def test_transformer_decoder_layer_matches_torch(device, opt_id, kwargs, mask_kind):
    torch.manual_seed(0)
    t_module = torch.nn.TransformerDecoderLayer(E, H, FF, **_kwargs(kwargs, "torch")).eval()
    module = nn.TransformerDecoderLayer(E, H, FF, **_kwargs(kwargs, "fg")).to(device).eval()
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(3)
    bf = kwargs.get("batch_first", False)
    arrays = [rng.standard_normal(_layout(s, bf)).astype(np.float32) for s in [(T, N, E), (S, N, E)]]
    masks = _decoder_masks(mask_kind, rng)
    f_in, t_in = _pair_tensors(arrays, device)
    f_m, t_m = _pair_tensors(list(masks), device, grad=False)
    names = ["tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask"]
    f_out = module(*f_in, **dict(zip(names, f_m)))
    t_out = t_module(*t_in, **dict(zip(names, t_m)))
    _check_grads([f_out], [t_out], f_in, t_in, module, t_module)


def test_transformer_decoder_layer_unbatched_matches_torch(device):
    torch.manual_seed(0)
    t_module = torch.nn.TransformerDecoderLayer(E, H, FF, dropout=0.0)
    module = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(T, E), (S, E)]]
    mem_kpm = np.zeros(S, bool)
    mem_kpm[-1] = True
    f_in, t_in = _pair_tensors(arrays, device)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    f_out = module(*f_in, tgt_mask=fg.tensor(causal.numpy(), device=device),
                   memory_key_padding_mask=fg.tensor(mem_kpm, device=device), tgt_is_causal=True)
    t_out = t_module(*t_in, tgt_mask=causal, memory_key_padding_mask=torch.tensor(mem_kpm), tgt_is_causal=True)
    _check_grads([f_out], [t_out], f_in, t_in, module, t_module)


def test_transformer_decoder_layer_dropout_in_training(device):
    module = nn.TransformerDecoderLayer(E, H, FF, dropout=0.5).to(device)
    tgt, memory = fg.randn(T, N, E, device=device), fg.randn(S, N, E, device=device)
    module.eval()
    ref = _np(module(tgt, memory))
    module.train()
    fg.manual_seed(1)
    a = _np(module(tgt, memory))
    fg.manual_seed(1)
    np.testing.assert_array_equal(a, _np(module(tgt, memory)))
    assert not np.allclose(a, ref)


# ---------------------------------------------------------------------- decoder stack
@pytest.mark.parametrize("with_norm", [False, True])
def test_transformer_decoder_matches_torch(device, with_norm):
    torch.manual_seed(0)
    t_layer = torch.nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, norm_first=True)
    t_module = torch.nn.TransformerDecoder(t_layer, 2, norm=torch.nn.LayerNorm(E) if with_norm else None)
    layer = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, norm_first=True)
    module = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(E) if with_norm else None).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(T, N, E), (S, N, E)]]
    masks = _decoder_masks("causal+padding", rng)
    f_in, t_in = _pair_tensors(arrays, device)
    f_m, t_m = _pair_tensors(list(masks), device, grad=False)
    names = ["tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask"]
    f_out = module(*f_in, **dict(zip(names, f_m)))
    t_out = t_module(*t_in, **dict(zip(names, t_m)))
    _check_grads([f_out], [t_out], f_in, t_in, module, t_module, rtol=1e-4)


def test_transformer_decoder_copies_are_independent_like_torch_deepcopy():
    layer = nn.TransformerDecoderLayer(E, H, FF)
    dec = nn.TransformerDecoder(layer, 3)
    w0, w1 = dec.layers[0].multihead_attn.in_proj_weight, dec.layers[1].multihead_attn.in_proj_weight
    np.testing.assert_array_equal(_np(w0), _np(layer.multihead_attn.in_proj_weight))
    np.testing.assert_array_equal(_np(w0), _np(w1))
    with fg.no_grad():
        w0.add_(1.0)
    assert not np.allclose(_np(w0), _np(w1))
    assert len(list(dec.parameters())) == 3 * len(list(layer.parameters()))


def test_stacks_copy_a_subclassed_layer():
    class Scaled(nn.TransformerEncoderLayer):
        def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
            return 2.0 * super().forward(src, src_mask, src_key_padding_mask, is_causal)

    enc = nn.TransformerEncoder(Scaled(E, H, FF, dropout=0.0), 2)
    assert all(type(m) is Scaled for m in enc.layers)
    x = fg.randn(S, N, E)
    expected = enc.layers[1](enc.layers[0](x))
    np.testing.assert_allclose(_np(enc(x)), _np(expected), rtol=1e-6)


# ---------------------------------------------------------------------- the whole transformer
TRANSFORMER_OPTIONS = [
    ("post-norm", {}),
    ("batch_first-pre-norm-gelu", {"batch_first": True, "norm_first": True, "activation": "gelu"}),
]


@pytest.mark.parametrize("opt_id, kwargs", TRANSFORMER_OPTIONS, ids=[o[0] for o in TRANSFORMER_OPTIONS])
def test_transformer_matches_torch(device, opt_id, kwargs):
    torch.manual_seed(0)
    sizes = dict(d_model=E, nhead=H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=FF, dropout=0.0)
    t_module = torch.nn.Transformer(**sizes, **kwargs).eval()
    module = nn.Transformer(**sizes, **kwargs).to(device).eval()
    _load_from_torch(module, t_module)  # asserts identical key names in the same order
    rng = np.random.default_rng(8)
    bf = kwargs.get("batch_first", False)
    arrays = [rng.standard_normal(_layout(s, bf)).astype(np.float32) for s in [(S, N, E), (T, N, E)]]
    tgt_mask, _, tgt_kpm, mem_kpm = _decoder_masks("causal+padding", rng)
    src_kpm = mem_kpm
    f_in, t_in = _pair_tensors(arrays, device)
    f_m, t_m = _pair_tensors([tgt_mask, src_kpm, tgt_kpm, mem_kpm], device, grad=False)
    names = ["tgt_mask", "src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"]
    f_out = module(*f_in, **dict(zip(names, f_m)), tgt_is_causal=True)
    t_out = t_module(*t_in, **dict(zip(names, t_m)), tgt_is_causal=True)
    assert tuple(f_out.shape) == tuple(t_out.shape) == _layout((T, N, E), bf)
    _check_grads([f_out], [t_out], f_in, t_in, module, t_module, rtol=1e-4)


def test_transformer_unbatched_with_src_mask_matches_torch(device):
    torch.manual_seed(0)
    sizes = dict(d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=FF, dropout=0.0)
    t_module = torch.nn.Transformer(**sizes)
    module = nn.Transformer(**sizes).to(device)
    _load_from_torch(module, t_module)
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(S, E), (T, E)]]
    masks = [rng.standard_normal((S, S)).astype(np.float32), rng.standard_normal((T, S)).astype(np.float32)]
    f_in, t_in = _pair_tensors(arrays, device)
    (f_src_mask, f_mem_mask), (t_src_mask, t_mem_mask) = _pair_tensors(masks, device, grad=False)
    f_out = module(*f_in, src_mask=f_src_mask, memory_mask=f_mem_mask)
    t_out = t_module(*t_in, src_mask=t_src_mask, memory_mask=t_mem_mask)
    _check_grads([f_out], [t_out], f_in, t_in, module, t_module, rtol=1e-4)


def test_transformer_custom_encoder_and_decoder():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, dropout=0.0), 1)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, FF, dropout=0.0), 1)
    model = nn.Transformer(d_model=E, nhead=H, custom_encoder=enc, custom_decoder=dec)
    assert model.encoder is enc and model.decoder is dec
    assert sorted({k.split(".")[0] for k in model.state_dict()}) == ["decoder", "encoder"]
    src, tgt = fg.randn(S, N, E), fg.randn(T, N, E)
    np.testing.assert_allclose(_np(model(src, tgt)), _np(dec(tgt, enc(src))), rtol=1e-6)


def test_transformer_constructor_matches_torch_signature_and_defaults():
    ours = inspect.signature(nn.Transformer.__init__).parameters
    theirs = inspect.signature(torch.nn.Transformer.__init__).parameters
    assert list(ours) == list(theirs)
    for name in theirs:
        a, b = ours[name].default, theirs[name].default
        if name == "activation":  # torch's F.relu and flowgraph's relu: the same function by name
            assert a.__name__ == b.__name__ == "relu"
        else:
            assert a == b, name
    for cls in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
        assert list(inspect.signature(getattr(nn, cls).__init__).parameters) == list(
            inspect.signature(getattr(torch.nn, cls).__init__).parameters), cls
    for cls in ("Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
                "TransformerDecoderLayer"):
        ours_f = inspect.signature(getattr(nn, cls).forward).parameters
        theirs_f = inspect.signature(getattr(torch.nn, cls).forward).parameters
        assert list(ours_f) == list(theirs_f), cls
        assert [p.default for p in ours_f.values()] == [p.default for p in theirs_f.values()], cls


def test_transformer_init_is_xavier_uniform_like_torch():
    fg.manual_seed(0)
    model = nn.Transformer(d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=FF)
    t_model = torch.nn.Transformer(d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=1,
                                   dim_feedforward=FF)
    t_params = dict(t_model.named_parameters())
    for name, p in model.named_parameters():
        assert tuple(p.shape) == tuple(t_params[name].shape), name
        if p.ndim > 1:
            fan_out, fan_in = p.shape
            bound = (6.0 / (fan_in + fan_out)) ** 0.5
            values = _np(p)
            assert np.abs(values).max() <= bound and values.std() > bound / 3, name
        else:  # attention biases (zeros) and LayerNorm parameters (ones, zeros) keep their layer's init
            expected = t_params[name].detach().numpy()
            if np.all(expected == expected[0]):
                np.testing.assert_array_equal(_np(p), expected, err_msg=name)


def test_generate_square_subsequent_mask_matches_torch(device):
    for sz in (0, 1, 4):
        got = nn.Transformer.generate_square_subsequent_mask(sz, device=device)
        assert got.dtype == fg.float32 and got.device == fg.device(device)
        np.testing.assert_array_equal(_np(got), torch.nn.Transformer.generate_square_subsequent_mask(sz).numpy())
    if fg.get_backend(device).supports_float64:
        assert nn.Transformer.generate_square_subsequent_mask(3, device=device, dtype=fg.float64).dtype == fg.float64
    with pytest.raises(fg.FlowError, match="sz must be a non-negative int"):
        nn.Transformer.generate_square_subsequent_mask(-1)


def test_transformer_errors():
    model = nn.Transformer(d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=FF)
    with pytest.raises(fg.ShapeError, match="same batch size"):
        model(fg.randn(S, N, E), fg.randn(T, N + 1, E))
    with pytest.raises(fg.ShapeError, match="d_model=8"):
        model(fg.randn(S, N, E), fg.randn(T, N, E + 1))
    with pytest.raises(fg.FlowError, match="is_causal=True is a hint"):
        model(fg.randn(S, N, E), fg.randn(T, N, E), tgt_is_causal=True)
    with pytest.raises(fg.FlowError, match="TransformerDecoderLayer: activation must be 'relu', 'gelu'"):
        nn.TransformerDecoderLayer(E, H, activation="swish")
    with pytest.raises(fg.FlowError, match="TransformerDecoder: num_layers must be positive"):
        nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H), 0)
    with pytest.raises(fg.FlowError, match="must be an nn.Module"):
        nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(E, H), 2)
