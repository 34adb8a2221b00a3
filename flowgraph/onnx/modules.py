"""Direct ONNX forms of nn modules (``Linear`` -> ``Gemm``, ``Conv2d`` -> ``Conv``, ``GRU`` -> ``GRU`` ...).

A converter takes the recorder, the module, the value names of its tensor inputs and the real input tensors,
and returns the value names of its outputs (one per tensor of the module's output, in flattening order), or
``None`` when this configuration has no direct form; the module's forward is then traced primitive by
primitive instead, which is always correct but bigger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import nn
from .trace import Recorder

Converter = Callable[[Recorder, Any, list, tuple], "list[str] | None"]
CONVERTERS: dict[type, Converter] = {}


def converts(*types: type) -> Callable[[Converter], Converter]:
    """Register a converter for module classes (subclasses use the nearest registered base)."""
    def register(fn: Converter) -> Converter:
        for t in types:
            CONVERTERS[t] = fn
        return fn
    return register


def converter_for(module: Any) -> Converter | None:
    """The converter registered for ``module``'s class or its nearest base class."""
    for cls in type(module).__mro__:
        fn = CONVERTERS.get(cls)
        if fn is not None:
            return fn
    return None


def _param(rec: Recorder, p: Any) -> str:
    return rec.value(p._data)


@converts(nn.Linear)
def _linear(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1:
        return None
    x = names[0]
    w = _param(rec, m.weight)
    if args[0].ndim == 2 and m.bias is not None:
        return [rec.op("Gemm", x, w, _param(rec, m.bias), transB=1)]
    y = rec.op("MatMul", x, rec.op("Transpose", w, perm=[1, 0]))
    return [rec.op("Add", y, _param(rec, m.bias)) if m.bias is not None else y]


@converts(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _conv(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1 or m.padding_mode != "zeros" or args[0].ndim != len(m.kernel_size) + 2:
        return None
    attrs: dict[str, Any] = {"strides": list(m.stride), "dilations": list(m.dilation), "group": m.groups,
                             "kernel_shape": list(m.kernel_size)}
    if m.padding == "same":  # PyTorch puts the odd padding element at the end
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
        attrs["pads"] = [t // 2 for t in total] + [t - t // 2 for t in total]
    elif m.padding == "valid":
        attrs["pads"] = [0] * (2 * len(m.kernel_size))
    else:
        attrs["pads"] = list(m.padding) * 2
    inputs = [names[0], _param(rec, m.weight)] + ([_param(rec, m.bias)] if m.bias is not None else [])
    return [rec.op("Conv", *inputs, **attrs)]


@converts(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _conv_transpose(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    n = len(m.kernel_size)
    if len(args) != 1 or m.padding_mode != "zeros" or isinstance(m.padding, str) or args[0].ndim != n + 2:
        return None  # (the weight layout (in, out / groups, *k) is ONNX's too)
    inputs = [names[0], _param(rec, m.weight)] + ([_param(rec, m.bias)] if m.bias is not None else [])
    return [rec.op("ConvTranspose", *inputs, strides=list(m.stride), dilations=list(m.dilation),
                   pads=list(m.padding) * 2, output_padding=list(m.output_padding), group=m.groups,
                   kernel_shape=list(m.kernel_size))]


@converts(nn.BatchNorm1d, nn.BatchNorm2d)
def _batch_norm(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if m.training or m.running_mean is None or len(args) != 1:
        return None
    dtype = args[0]._data.dtype
    n = m.num_features
    scale = _param(rec, m.weight) if m.weight is not None else rec.const(np.ones(n, dtype=dtype))
    bias = _param(rec, m.bias) if m.bias is not None else rec.const(np.zeros(n, dtype=dtype))
    return [rec.op("BatchNormalization", names[0], scale, bias, _param(rec, m.running_mean),
                   _param(rec, m.running_var), epsilon=float(m.eps))]


@converts(nn.LayerNorm)
def _layer_norm(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1:
        return None
    shape = tuple(m.normalized_shape)
    dtype = args[0]._data.dtype
    scale = _param(rec, m.weight) if m.weight is not None else rec.const(np.ones(shape, dtype=dtype))
    bias = (_param(rec, m.bias) if getattr(m, "bias", None) is not None
            else rec.const(np.zeros(shape, dtype=dtype)))
    return [rec.node("LayerNormalization", [names[0], scale, bias], 1, axis=-len(shape),
                     epsilon=float(m.eps))[0]]


@converts(nn.Dropout)
def _dropout(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    return [rec.op("Identity", names[0])] if not m.training and len(args) == 1 else None


@converts(nn.Identity)
def _identity(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    return [rec.op("Identity", names[0])] if len(args) == 1 else None


def _simple(op: str) -> Converter:
    def convert(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
        return [rec.op(op, names[0])] if len(args) == 1 else None
    return convert


converts(nn.ReLU)(_simple("Relu"))
converts(nn.Sigmoid)(_simple("Sigmoid"))
converts(nn.Tanh)(_simple("Tanh"))


@converts(nn.Softmax)
def _softmax(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1 or m.dim is None:
        return None
    return [rec.op("Softmax", names[0], axis=int(m.dim))]


@converts(nn.Flatten)
def _flatten(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1 or m.start_dim != 1 or m.end_dim not in (-1, args[0].ndim - 1):
        return None
    return [rec.op("Flatten", names[0], axis=1)]


def _pool_tuple(v: Any, n: int) -> list[int]:
    return [int(v)] * n if isinstance(v, int) else [int(x) for x in v]


@converts(nn.MaxPool1d, nn.MaxPool2d)
def _max_pool(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    n = 1 if isinstance(m, nn.MaxPool1d) else 2
    if len(args) != 1 or m.return_indices or args[0].ndim != n + 2:
        return None
    pads = _pool_tuple(m.padding, n)
    return [rec.op("MaxPool", names[0], kernel_shape=_pool_tuple(m.kernel_size, n),
                   strides=_pool_tuple(m.stride, n), pads=pads * 2, dilations=_pool_tuple(m.dilation, n),
                   ceil_mode=int(m.ceil_mode))]


@converts(nn.AvgPool1d, nn.AvgPool2d)
def _avg_pool(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    n = 1 if isinstance(m, nn.AvgPool1d) else 2
    if len(args) != 1 or m.divisor_override is not None or args[0].ndim != n + 2:
        return None
    pads = _pool_tuple(m.padding, n)
    return [rec.op("AveragePool", names[0], kernel_shape=_pool_tuple(m.kernel_size, n),
                   strides=_pool_tuple(m.stride, n), pads=pads * 2, ceil_mode=int(m.ceil_mode),
                   count_include_pad=int(m.count_include_pad))]


@converts(nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)
def _adaptive_avg(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    size = m.output_size
    if len(args) != 1 or any(s != 1 for s in ([size] if isinstance(size, int) else size)):
        return None  # other output sizes: traced (the window loop)
    return [rec.op("GlobalAveragePool", names[0])]


@converts(nn.Embedding)
def _embedding(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if len(args) != 1 or m.max_norm is not None:
        return None
    return [rec.op("Gather", _param(rec, m.weight), names[0], axis=0)]


# ---------------------------------------------------------------------- recurrent layers
#: PyTorch's gate blocks -> ONNX's: LSTM (i, f, g, o) -> (i, o, f, c); GRU (r, z, n) -> (z, r, h).
_GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN_TANH": [0], "RNN_RELU": [0]}


@converts(nn.RNN, nn.LSTM, nn.GRU)
def _recurrent(rec: Recorder, m: Any, names: list, args: tuple) -> list[str] | None:
    if m.proj_size or args[0].ndim != 3 or len(args) > 2:
        return None
    mode = m.mode
    lstm = mode == "LSTM"
    if len(args) == 2 and lstm:
        return None  # (h0, c0) tuples: traced
    order = _GATE_ORDER[mode]
    hidden = m.hidden_size
    dirs = 2 if m.bidirectional else 1
    dtype = args[0]._data.dtype
    x = names[0]
    if m.batch_first:
        x = rec.op("Transpose", x, perm=[1, 0, 2])  # ONNX's layout 0: (seq, batch, features)
    h0 = names[1] if len(names) > 1 else None
    h_n, c_n = [], []
    op = {"LSTM": "LSTM", "GRU": "GRU"}.get(mode, "RNN")
    for layer in range(m.num_layers):
        ws, rs, bs = [], [], []
        for d in range(dirs):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            w = _reorder(getattr(m, "weight_ih" + suffix), order, hidden)
            r = _reorder(getattr(m, "weight_hh" + suffix), order, hidden)
            ws.append(w)
            rs.append(r)
            if m.bias:
                bs.append(np.concatenate([_reorder(getattr(m, "bias_ih" + suffix), order, hidden),
                                          _reorder(getattr(m, "bias_hh" + suffix), order, hidden)]))
        inputs = [x, rec.const(np.stack(ws).astype(dtype)), rec.const(np.stack(rs).astype(dtype)),
                  rec.const(np.stack(bs).astype(dtype)) if m.bias else "", ""]
        if h0 is not None:
            inputs.append(rec.op("Slice", h0, rec.ints([layer * dirs]), rec.ints([(layer + 1) * dirs]),
                                 rec.ints([0])))
        attrs: dict[str, Any] = {"hidden_size": hidden, "direction": "bidirectional" if dirs == 2 else "forward"}
        if op == "GRU":
            attrs["linear_before_reset"] = 1  # PyTorch applies the reset gate after the hidden projection
        if op == "RNN":
            act = "Relu" if mode == "RNN_RELU" else "Tanh"
            attrs["activations"] = [act] * dirs
        outs = rec.node(op, inputs, 3 if lstm else 2, **attrs)
        y = rec.op("Transpose", outs[0], perm=[0, 2, 1, 3])  # (seq, dirs, batch, H) -> (seq, batch, dirs, H)
        x = rec.op("Reshape", y, rec.ints([0, 0, dirs * hidden]))
        h_n.append(outs[1])
        if lstm:
            c_n.append(outs[2])
    output = rec.op("Transpose", x, perm=[1, 0, 2]) if m.batch_first else rec.op("Identity", x)
    h = rec.op("Concat", *h_n, axis=0)
    if lstm:
        return [output, h, rec.op("Concat", *c_n, axis=0)]
    return [output, h]


def _reorder(p: Any, order: list[int], hidden: int) -> np.ndarray:
    a = np.asarray(p.detach().numpy())
    return np.concatenate([a[g * hidden:(g + 1) * hidden] for g in order])
