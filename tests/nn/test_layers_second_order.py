"""Second derivatives through the layers' own graph nodes (im2col and col2im, window max/sum, standardize,
the one-node activations, linear, attention, split): ``fg.gradcheck`` of the first derivative built with
``create_graph=True`` from ``(fn(*inputs) * weight).sum()``, so the gradient reaching each node is a constant (a
backward that chose its non-differentiable path from ``g.requires_grad`` failed this)
(float64 central differences, gradcheck's default tolerances atol=1e-5, rtol=1e-3), and for a few cases the
second derivative compared with torch's (float64, rtol=1e-7, atol=1e-9).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph.nn import functional as F

from .test_layers_support import host, skip_if_no_float64

TF = torch.nn.functional


def _w(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _torch_causal_attention(q, k, v):
    """torch's attention written out (its CPU flash kernel has no double backward)."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return TF.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


# name -> (flowgraph fn, torch fn, input shapes); the fns take (x, *params)
SECOND_ORDER = {
    "conv2d": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), lambda x, w: TF.conv2d(x, w, stride=2, padding=1),
               [(1, 2, 4, 4), (2, 2, 2, 2)]),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2, dilation=2),
                         lambda x, w: TF.conv_transpose1d(x, w, stride=2, dilation=2), [(1, 2, 3), (2, 1, 2)]),
    "unfold_fold": (lambda x: F.fold(F.unfold(x, 2, padding=1) ** 2, (3, 3), 2, padding=1),
                    lambda x: TF.fold(TF.unfold(x, 2, padding=1) ** 2, (3, 3), 2, padding=1), [(1, 1, 3, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x * x, 2, 1), lambda x: TF.max_pool2d(x * x, 2, 1), [(1, 1, 3, 3)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x * x, 2, 1, 1, count_include_pad=False),
                   lambda x: TF.avg_pool2d(x * x, 2, 1, 1, count_include_pad=False), [(1, 1, 3, 3)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), lambda x, w, b: TF.layer_norm(x, (4,), w, b),
                   [(2, 4), (4,), (4,)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True), [(4, 2, 2), (2,), (2,)]),
    "group_norm": (lambda x, w: F.group_norm(x, 2, w), lambda x, w: TF.group_norm(x, 2, w), [(2, 4, 2), (4,)]),
    "elu": (lambda x: F.elu(x, 0.7), lambda x: TF.elu(x, 0.7), [(2, 3)]),
    "celu": (lambda x: F.celu(x, 1.3), lambda x: TF.celu(x, 1.3), [(2, 3)]),
    "mish": (F.mish, TF.mish, [(2, 3)]),
    "softsign": (F.softsign, TF.softsign, [(2, 3)]),
    "logsigmoid": (F.logsigmoid, TF.logsigmoid, [(2, 3)]),
    "hardswish": (F.hardswish, TF.hardswish, [(2, 3)]),
    "interpolate_bilinear": (lambda x: F.interpolate(x * x, scale_factor=2, mode="bilinear"),
                             lambda x: TF.interpolate(x * x, scale_factor=2, mode="bilinear"), [(1, 1, 2, 2)]),
    # the gradient reaching these is the constant weight of the sum: their backward must still build a graph
    "linear_2d": (F.linear, TF.linear, [(3, 4), (2, 4), (2,)]),
    "linear_3d": (F.linear, TF.linear, [(2, 3, 4), (2, 4), (2,)]),
    "gelu": (F.gelu, TF.gelu, [(2, 3)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh"), [(2, 3)]),
    "silu": (F.silu, TF.silu, [(2, 3)]),
    "softplus": (F.softplus, TF.softplus, [(2, 3)]),
    "softmax": (lambda x: F.softmax(x, -1), lambda x: TF.softmax(x, -1), [(2, 3)]),
    "log_softmax": (lambda x: F.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1), [(2, 3)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), lambda x, w: TF.rms_norm(x, (4,), w), [(2, 4), (4,)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    lambda q, k, v: _torch_causal_attention(q, k, v),
                    [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)]),
    "split_mixed": (lambda x: fg.cat([x.split(2, 1)[0], x.split(2, 1)[1] ** 2], 1),
                    lambda x: torch.cat([x.split(2, 1)[0], x.split(2, 1)[1] ** 2], 1), [(2, 4)]),
}  # fmt: skip


def _inputs(shapes):
    arrays = [_w(s, i) for i, s in enumerate(shapes)]
    arrays[0] = arrays[0] + np.sign(arrays[0]) * 0.1  # keep away from kinks at 0
    return arrays


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_gradgradcheck(name: str, device: str):
    skip_if_no_float64(device)
    fn, _, shapes = SECOND_ORDER[name]
    arrays = _inputs(shapes)
    inputs = [fg.tensor(a, dtype=fg.float64, device=device, requires_grad=True) for a in arrays]
    weight = fg.tensor(_w(tuple(fn(*inputs).shape), 9), dtype=fg.float64, device=device)

    def first_derivative(*args):
        with fg.enable_grad():  # gradcheck evaluates under no_grad on fresh tensors
            args = [a if a.requires_grad else a.detach().requires_grad_() for a in args]
            grads = fg.autograd.grad((fn(*args) * weight).sum(), args, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    assert fg.gradcheck(first_derivative, inputs)


@pytest.mark.parametrize("name", ["conv2d", "layer_norm", "batch_norm", "mish", "max_pool2d", "linear_3d", "gelu",
                                  "sdpa_causal", "split_mixed"])
def test_second_derivative_matches_torch(name: str, device: str):
    skip_if_no_float64(device)
    fn, t_fn, shapes = SECOND_ORDER[name]
    arrays = _inputs(shapes)
    inputs = [fg.tensor(a, dtype=fg.float64, device=device, requires_grad=True) for a in arrays]
    t_inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
    weight = _w(tuple(fn(*inputs).shape), 9)
    grads = fg.autograd.grad((fn(*inputs) * fg.tensor(weight, device=device)).sum(), inputs, create_graph=True)
    t_grads = torch.autograd.grad((t_fn(*t_inputs) * torch.tensor(weight)).sum(), t_inputs, create_graph=True)
    sum(((g * g).sum() for g in grads), fg.zeros((), dtype=fg.float64, device=device)).backward()
    sum((g * g).sum() for g in t_grads).backward()
    for a, b in zip(inputs, t_inputs):  # an input the first derivative does not depend on: None or zeros
        mine = np.zeros(a.shape) if a.grad is None else host(a.grad)
        theirs = np.zeros(a.shape) if b.grad is None else b.grad.numpy()
        np.testing.assert_allclose(mine, theirs, rtol=1e-7, atol=1e-9)
