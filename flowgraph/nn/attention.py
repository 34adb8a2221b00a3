"""Attention with PyTorch's names, arguments, parameter names and semantics: ``F.scaled_dot_product_attention``,
``F.multi_head_attention_forward``, ``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``,
``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer``, ``nn.TransformerDecoder`` and ``nn.Transformer``.
A torch state dict loads directly (``in_proj_weight``, ``out_proj.weight``, ``self_attn.in_proj_bias``,
``multihead_attn.in_proj_weight``, ``linear1.weight``, ``norm1.weight``, ``layers.0....``,
``encoder.layers.0....``, ``decoder.norm.weight``).

Masks follow PyTorch: for ``MultiheadAttention`` a boolean ``attn_mask``/``key_padding_mask`` marks
positions that may *not* be attended (True = masked); for ``scaled_dot_product_attention`` a boolean
mask marks positions that *may* be attended (True = keep). Float masks are added to the scores. A query
whose every key is masked gets zeros from ``scaled_dot_product_attention`` (and from ``MultiheadAttention``
with ``need_weights=False``, which runs on it) but NaN from ``MultiheadAttention`` with ``need_weights=True``:
both as PyTorch does.

    mha = nn.MultiheadAttention(embed_dim=16, num_heads=4, batch_first=True)
    out, weights = mha(x, x, x, key_padding_mask=pad)     # x (N, L, 16), pad (N, L) bool
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from ..autograd.functional import grad as autograd_grad
from ..autograd.grad_mode import STATE, enable_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, arange, cat, empty, float32, gelu, pad, relu, where, zeros
from ..tensor.tensor import _record, _wrap
from . import init
from .containers import ModuleList
from .dropout import Dropout
from .dropout import dropout as _dropout
from .linear import Linear, linear
from .module import Module, Parameter
from .normalization import LayerNorm

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
           "TransformerDecoder", "Transformer"]
__functional__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]


# ---------------------------------------------------------------------- masks and the attention core
def _additive_mask(mask: Tensor | None, dtype, true_means_masked: bool, name: str) -> Tensor | None:
    """A float mask to add to the scores: bool masks become 0 / -inf, float masks are used as given."""
    if mask is None:
        return None
    if mask.dtype.name == "bool":
        blocked = mask if true_means_masked else ~mask
        return where(blocked, float("-inf"), 0.0).to(dtype)
    if not mask.dtype.is_floating_point:
        raise FlowError(f"{name} must be a bool or floating tensor, got {mask.dtype}")
    return mask if mask.dtype is dtype else mask.to(dtype)


def _causal_mask(L: int, S: int, device, dtype) -> Tensor:
    """0 on and below the diagonal (aligned top-left, as PyTorch), -inf above, shape (L, S)."""
    rows = arange(L, device=device).unsqueeze(1)
    cols = arange(S, device=device).unsqueeze(0)
    return where(cols <= rows, 0.0, float("-inf")).to(dtype)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout_p: float, scale: float,
            safe: bool = False) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T * scale + bias)``, dropout, times ``v``; returns (output, attention weights).

    With ``safe`` a query whose every key is masked (-inf) gets all-zero weights (PyTorch's
    ``scaled_dot_product_attention``), with a zero gradient; otherwise its row is NaN (PyTorch's
    ``MultiheadAttention`` with ``need_weights=True``).
    """
    scores = (q * scale).matmul(k.transpose(-2, -1))
    if bias is not None:
        scores = scores + bias
    if safe and bias is not None:
        blocked = (bias == float("-inf")).all(-1, keepdim=True)
        weights = where(blocked, 0.0, where(blocked, 0.0, scores).softmax(-1))
    else:
        weights = scores.softmax(-1)
    if dropout_p > 0.0:
        weights = _dropout(weights, dropout_p, True)
    return weights.matmul(v), weights


def _native_sdpa_ok(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                    is_causal: bool) -> bool:
    """Whether the backend's fused attention (``Backend.native_sdpa``) can run this call: no mask other than the
    square causal one, no dropout, no autocast, one dtype and backend, matching leading dims and head sizes."""
    bk = q._backend
    return (attn_mask is None and dropout_p == 0.0 and STATE.autocast is None and q.ndim >= 3
            and k._backend is bk and v._backend is bk and q.dtype is k.dtype and k.dtype is v.dtype
            and tuple(q.shape[:-2]) == tuple(k.shape[:-2]) == tuple(v.shape[:-2])
            and v.shape[-1] == q.shape[-1] and (not is_causal or q.shape[-2] == k.shape[-2])
            and bk.native_sdpa(q.dtype.np, q.shape[-1]))


def _native_sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> Tensor:
    """Attention through ``Backend.sdpa_forward`` / ``sdpa_backward``: one fused kernel each way, keeping the
    inputs, the output and the per-row log-sum-exp (O(L)), never the ``L x S`` weights. Under ``create_graph``
    the backward is the composed formula on tensors, so higher-order gradients still work."""
    bk = q._backend
    lead, length = tuple(q.shape[:-2]), q.shape[-2]

    def four(t: Tensor):
        d = t._data
        d = d if t.ndim == 4 else bk.reshape(d, (1, -1) + tuple(t.shape[-2:]))
        return d if bk.sdpa_strided_inputs else bk.contiguous(d)

    o4, stats = bk.sdpa_forward(four(q), four(k), four(v), scale, causal)
    out = _wrap(bk.reshape(o4, lead + (length, v.shape[-1])), bk)
    if STATE.enabled and (q.requires_grad or k.requires_grad or v.requires_grad):
        lse = _wrap(stats, bk)

        def backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor):
            if STATE.enabled:  # create_graph: the composed formula, differentiable again
                with enable_grad():
                    qs, ks, vs = (t if t.requires_grad else t.detach().requires_grad_(True) for t in (q, k, v))
                    bias = _causal_mask(length, k.shape[-2], q.device, q.dtype) if causal else None
                    y = _attend(qs, ks, vs, bias, 0.0, scale, safe=True)[0]
                return autograd_grad(y, (qs, ks, vs), g, create_graph=True)
            shape = lambda t: tuple(t.shape)  # noqa: E731
            dq, dk, dv = bk.sdpa_backward(four(q), four(k), four(v), four(out), four(g), lse._data, scale, causal)
            return tuple(_wrap(bk.reshape(d, shape(t)), bk) for d, t in ((dq, q), (dk, k), (dv, v)))

        _record(out, "ScaledDotProductAttention", (q, k, v), (q, k, v, out, lse), backward)
    return out


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(Q K^T * scale + mask) V`` over the last two dims (PyTorch's reference semantics).

    ``query`` (..., L, E), ``key`` (..., S, E), ``value`` (..., S, Ev). ``attn_mask`` broadcasts to
    (..., L, S): bool True = may attend, or a float bias. ``is_causal`` masks above the diagonal (and
    excludes ``attn_mask``); ``scale`` defaults to ``1/sqrt(E)``; ``dropout_p`` is always applied (pass
    0.0 in evaluation). ``enable_gqa`` repeats key/value heads (dim -3) to match the query heads.
    """
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ShapeError("scaled_dot_product_attention: query, key and value need at least 2 dims (..., L, E)")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(
            f"scaled_dot_product_attention: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}: query and key need the same last dim, key and value the same length (dim -2)"
        )
    if is_causal and attn_mask is not None:
        raise FlowError("scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both")
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        heads_q, heads_kv = query.shape[-3], key.shape[-3]
        if heads_q % heads_kv:
            raise ShapeError(f"scaled_dot_product_attention: {heads_q} query heads are not a multiple of "
                             f"{heads_kv} key/value heads")
        key = key.repeat_interleave(heads_q // heads_kv, -3)
        value = value.repeat_interleave(heads_q // heads_kv, -3)
    L, S = query.shape[-2], key.shape[-2]
    if _native_sdpa_ok(query, key, value, attn_mask, dropout_p, is_causal):
        return _native_sdpa(query, key, value, 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale,
                            is_causal)
    if is_causal:
        bias = _causal_mask(L, S, query.device, query.dtype)
    else:
        bias = _additive_mask(attn_mask, query.dtype, False, "attn_mask")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _attend(query, key, value, bias, dropout_p, scale, safe=True)[0]


def multi_head_attention_forward(
    query: Tensor, key: Tensor, value: Tensor, embed_dim_to_check: int, num_heads: int,
    in_proj_weight: Tensor | None, in_proj_bias: Tensor | None, bias_k: Tensor | None, bias_v: Tensor | None,
    add_zero_attn: bool, dropout_p: float, out_proj_weight: Tensor, out_proj_bias: Tensor | None,
    training: bool = True, key_padding_mask: Tensor | None = None, need_weights: bool = True,
    attn_mask: Tensor | None = None, use_separate_proj_weight: bool = False, q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None, v_proj_weight: Tensor | None = None, static_k: Tensor | None = None,
    static_v: Tensor | None = None, average_attn_weights: bool = True, is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """PyTorch's ``F.multi_head_attention_forward`` on sequence-first inputs (L, N, E) or unbatched (L, E).

    Returns ``(output, weights)``: weights (N, L, S) averaged over heads, (N, H, L, S) with
    ``average_attn_weights=False``, or None when ``need_weights`` is False.
    """
    batched = query.ndim == 3
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ShapeError(f"multi_head_attention_forward: query, key and value must all be 3-d (L, N, E) or 2-d "
                         f"(L, E); got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    if embed_dim != embed_dim_to_check:
        raise ShapeError(f"MultiheadAttention: query has {embed_dim} features, expected embed_dim="
                         f"{embed_dim_to_check}")
    if key.shape[:2] != value.shape[:2]:
        raise ShapeError(f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} must share "
                         "(S, N)")
    if is_causal and attn_mask is None:
        raise FlowError("MultiheadAttention: is_causal=True is a hint that attn_mask is causal; pass the causal "
                        "attn_mask too (as PyTorch requires)")
    head_dim = embed_dim // num_heads
    if static_k is not None or static_v is not None:
        raise FlowError("multi_head_attention_forward: static_k/static_v are not supported")

    # input projections
    if not use_separate_proj_weight:
        if in_proj_weight is None:
            raise FlowError("multi_head_attention_forward: in_proj_weight is None; pass it or set "
                            "use_separate_proj_weight=True with q/k/v_proj_weight")
        if query is key and key is value:
            q, k, v = linear(query, in_proj_weight, in_proj_bias).chunk(3, -1)
        else:
            w_q, w_k, w_v = in_proj_weight.chunk(3, 0)
            b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3, 0)
            q, k, v = linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)
    else:
        b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3, 0)
        q, k, v = linear(query, q_proj_weight, b_q), linear(key, k_proj_weight, b_k), linear(value, v_proj_weight, b_v)

    dtype = q.dtype
    mask = _additive_mask(attn_mask, dtype, True, "attn_mask")
    if mask is not None:
        if mask.ndim == 2:
            if tuple(mask.shape) != (tgt_len, key.shape[0]):
                raise ShapeError(f"MultiheadAttention: a 2-d attn_mask must have shape {(tgt_len, key.shape[0])}, "
                                 f"got {tuple(mask.shape)}")
            mask = mask.unsqueeze(0)
        elif mask.ndim == 3:
            if tuple(mask.shape) != (bsz * num_heads, tgt_len, key.shape[0]):
                raise ShapeError(f"MultiheadAttention: a 3-d attn_mask must have shape "
                                 f"{(bsz * num_heads, tgt_len, key.shape[0])}, got {tuple(mask.shape)}")
        else:
            raise ShapeError(f"MultiheadAttention: attn_mask must be 2-d or 3-d, got {mask.ndim}-d")
    kpm = _additive_mask(key_padding_mask, dtype, True, "key_padding_mask")
    if kpm is not None and tuple(kpm.shape) != (bsz, key.shape[0]):
        raise ShapeError(f"MultiheadAttention: key_padding_mask must have shape {(bsz, key.shape[0])}, got "
                         f"{tuple(kpm.shape)}")

    if bias_k is not None and bias_v is not None:
        k = cat([k, bias_k.expand(1, bsz, embed_dim)], 0)
        v = cat([v, bias_v.expand(1, bsz, embed_dim)], 0)
        mask = None if mask is None else pad(mask, (0, 1))
        kpm = None if kpm is None else pad(kpm, (0, 1))

    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    v = v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    if add_zero_attn:
        k = cat([k, zeros(bsz * num_heads, 1, head_dim, dtype=dtype, device=k.device)], 1)
        v = cat([v, zeros(bsz * num_heads, 1, head_dim, dtype=dtype, device=v.device)], 1)
        mask = None if mask is None else pad(mask, (0, 1))
        kpm = None if kpm is None else pad(kpm, (0, 1))
    src_len = k.shape[1]
    if kpm is not None:
        kpm = kpm.reshape(bsz, 1, 1, src_len).expand(bsz, num_heads, 1, src_len).reshape(bsz * num_heads, 1, src_len)
        mask = kpm if mask is None else mask + kpm

    out, weights = _attend(q, k, v, mask, dropout_p if training else 0.0, 1.0 / math.sqrt(head_dim),
                           safe=not need_weights)
    out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
    if not need_weights:
        return (out if batched else out.squeeze(1)), None
    weights = weights.reshape(bsz, num_heads, tgt_len, src_len)
    if average_attn_weights:
        weights = weights.mean(1)
    if not batched:
        return out.squeeze(1), weights.squeeze(0)
    return out, weights


# ---------------------------------------------------------------------- modules
class MultiheadAttention(Module):
    """Multi-head attention (PyTorch's ``nn.MultiheadAttention``: same arguments, parameters, masks).

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights or None)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise FlowError(f"MultiheadAttention: embed_dim and num_heads must be positive, got {embed_dim} and "
                            f"{num_heads}")
        if embed_dim % num_heads:
            raise FlowError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                            f"({num_heads})")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, device=device, dtype=dtype))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, device=device, dtype=dtype))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, device=device, dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, device=device, dtype=dtype))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, device=device, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        if add_bias_kv:
            self.bias_k = Parameter(empty(1, 1, embed_dim, device=device, dtype=dtype))
            self.bias_v = Parameter(empty(1, 1, embed_dim, device=device, dtype=dtype))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """PyTorch's initialisation: Xavier-uniform projections, zero biases, Xavier-normal bias_k/bias_v."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        batched = query.ndim == 3
        if self.batch_first and batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(0, 1)
                else:
                    query, key = query.transpose(0, 1), key.transpose(0, 1)
                    value = key
            else:
                query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        out, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        return out, weights

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _activation_fn(activation: str | Callable, owner: str) -> Callable:
    if activation == "relu":
        return relu
    if activation == "gelu":
        return gelu
    if callable(activation):
        return activation
    raise FlowError(f"{owner}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class TransformerEncoderLayer(Module):
    """Self-attention + feed-forward block (PyTorch's ``nn.TransformerEncoderLayer``, post-norm by default,
    pre-norm with ``norm_first=True``); submodules ``self_attn``, ``linear1``, ``linear2``, ``norm1``,
    ``norm2``, ``dropout``, ``dropout1``, ``dropout2``.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation_fn(activation, "TransformerEncoderLayer")

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """Self-attention, cross-attention over the encoder's output (``memory``), then feed-forward (PyTorch's
    ``nn.TransformerDecoderLayer``, post-norm by default, pre-norm with ``norm_first=True``); submodules
    ``self_attn``, ``multihead_attn``, ``linear1``, ``linear2``, ``norm1``-``norm3``, ``dropout``,
    ``dropout1``-``dropout3``. The self-attention and feed-forward blocks are the encoder layer's.

        layer = nn.TransformerDecoderLayer(d_model=16, nhead=4, batch_first=True)
        out = layer(tgt, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]))
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation_fn(activation, "TransformerDecoderLayer")

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    # the self-attention block is the encoder layer's (same submodule names)
    _sa_block = TransformerEncoderLayer._sa_block

    def _mha_block(self, x: Tensor, memory: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


def _clones(layer: Module, num_layers: int, owner: str) -> ModuleList:
    """``num_layers`` independent deep copies of ``layer`` (same initial weights), as PyTorch's ``_get_clones``."""
    if num_layers <= 0:
        raise FlowError(f"{owner}: num_layers must be positive, got {num_layers}")
    if not isinstance(layer, Module):
        raise FlowError(f"{owner}: the layer to stack must be an nn.Module, got {type(layer).__name__}")
    return ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])


class TransformerEncoder(Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` (same initial weights, as PyTorch's deep copy),
    then an optional ``norm``."""

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers, "TransformerEncoder")
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(out) if self.norm is not None else out


class TransformerDecoder(Module):
    """A stack of ``num_layers`` copies of ``decoder_layer`` (same initial weights, as PyTorch's deep copy),
    then an optional ``norm``; every layer attends to the same ``memory``."""

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers, "TransformerDecoder")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out


class Transformer(Module):
    """The encoder-decoder transformer of "Attention Is All You Need" (PyTorch's ``nn.Transformer``: same
    arguments, defaults, submodules ``encoder``/``decoder`` with final ``norm``s, and state-dict keys).

    ``forward(src, tgt, ...)`` encodes ``src`` into a memory and decodes ``tgt`` against it; the output has
    ``tgt``'s shape. Boolean masks mark positions that may *not* be attended (True = masked), float masks are
    added to the scores. The ``*_is_causal`` flags are hints, as in PyTorch: the masks are always applied, and a
    hint without its mask raises. ``custom_encoder``/``custom_decoder`` replace the default stacks.

        model = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2, batch_first=True)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        out = model(src, tgt, tgt_mask=mask)            # src (N, S, 32), tgt (N, T, 32) -> (N, T, 32)
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation: str | Callable = relu,
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                      bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(*layer_args, device=device, dtype=dtype)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(*layer_args, device=device, dtype=dtype)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and (tgt.ndim != 3 or src.shape[batch_dim] != tgt.shape[batch_dim]):
            raise ShapeError(f"Transformer: src {tuple(src.shape)} and tgt {tuple(tgt.shape)} must have the same "
                             f"batch size (dim {batch_dim}, batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: src {tuple(src.shape)} and tgt {tuple(tgt.shape)} must both have "
                             f"d_model={self.d_model} features (last dim)")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """A square causal mask (``sz``, ``sz``): 0.0 on and below the diagonal, ``-inf`` above (PyTorch's)."""
        if not isinstance(sz, int) or isinstance(sz, bool) or sz < 0:
            raise FlowError(f"generate_square_subsequent_mask: sz must be a non-negative int, got {sz!r}")
        return _causal_mask(sz, sz, device, float32 if dtype is None else dtype)

    def _reset_parameters(self) -> None:
        """PyTorch's initialisation: Xavier-uniform on every parameter with more than one dimension."""
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
