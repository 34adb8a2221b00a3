"""Layers (conv, pooling, normalization, sparse, reshape, dropout) against PyTorch CPU, and float64 gradchecks.

Every module class exported by those families appears in ``CASES`` (compared with torch: output, input
gradients, parameter gradients, buffers after each step, in float32 with the weights copied from torch's
``state_dict``) and in ``GRADCHECK`` (float64 central differences with respect to inputs and parameters), or
in ``NOT_COMPARED`` with the reason; ``test_every_module_is_covered`` fails when one is missing.

Tolerance: rtol=1e-5, atol=1e-5 (``RTOL``/``ATOL``) unless a case states its own; the looser ones are sums of
many float32 products (transposed/strided convolutions, 3-d pooling of normalised values), where both
libraries round differently: rtol=1e-4, atol=1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import conv, dropout, normalization, pooling, reshape, sparse
from flowgraph.nn import functional as F

from .test_layers_support import (
    Case,
    compare_with_torch,
    floats,
    gradcheck_module,
    host,
    ints,
    randomize_parameters,
    skip_if_no_float64,
)

#: The reference PyTorch of this project (pyproject pins torch==2.13.0). On other releases (e.g. the GPU
#: machine's 2.11) a few reprs and LPPool's inf norm differ; those checks run against the reference only.
TORCH_IS_REFERENCE = torch.__version__.startswith("2.13")

LOOSE = {"rtol": 1e-4, "atol": 1e-5}


def ties(*shape: int):
    """Rounded, ReLU'd values: many equal maxima per window (PyTorch sends the gradient to the first)."""
    return lambda rng: [np.maximum(np.round(rng.standard_normal(shape)), 0).astype(np.float32)]


def unpool_inputs(nd: int, shape, *pool_args):
    """MaxUnpool inputs: the values and indices torch's max pooling returns for a random input."""
    pool = getattr(torch.nn.functional, f"max_pool{nd}d")

    def make(rng):
        x = torch.tensor(rng.standard_normal(shape).astype(np.float32))
        values, indices = pool(x, *pool_args, return_indices=True)
        return [values.numpy(), indices.numpy()]

    return make


def bags(num: int, ids: list[int], offsets: list[int], weights: bool = False):
    """EmbeddingBag inputs: 1-d ids, offsets and (optionally) per-sample weights."""

    def make(rng):
        out = [np.array(ids, dtype=np.int64), np.array(offsets, dtype=np.int64)]
        if weights:
            out.append(rng.random(len(ids)).astype(np.float32))
        return out

    return make


CASES = [
    # ---------------------------------------------------------------- convolutions
    Case("conv1d", "Conv1d", (3, 4, 3), {}, floats(2, 3, 9)),
    Case("conv1d-stride-pad", "Conv1d", (3, 4, 3), {"stride": 2, "padding": 1}, floats(2, 3, 9)),
    Case("conv1d-same-dilated", "Conv1d", (3, 4, 3), {"padding": "same", "dilation": 2}, floats(2, 3, 9)),
    Case("conv1d-valid", "Conv1d", (3, 4, 2), {"padding": "valid"}, floats(2, 3, 6)),
    Case("conv1d-groups-nobias", "Conv1d", (4, 6, 3), {"groups": 2, "bias": False}, floats(2, 4, 8)),
    Case("conv1d-reflect", "Conv1d", (2, 3, 3), {"padding": 2, "padding_mode": "reflect"}, floats(2, 2, 7)),
    Case("conv1d-replicate", "Conv1d", (2, 3, 3), {"padding": 2, "padding_mode": "replicate"}, floats(2, 2, 7)),
    Case("conv1d-circular", "Conv1d", (2, 3, 3), {"padding": 1, "padding_mode": "circular"}, floats(2, 2, 7)),
    Case("conv1d-unbatched", "Conv1d", (2, 3, 3), {"padding": 1}, floats(2, 7)),
    Case("conv2d", "Conv2d", (3, 4, 3), {}, floats(2, 3, 6, 5)),
    Case(
        "conv2d-stride-pad-tuple", "Conv2d", (3, 4, (3, 2)), {"stride": (2, 1), "padding": (1, 2)}, floats(2, 3, 7, 6)
    ),
    Case("conv2d-dilation", "Conv2d", (2, 3, 3), {"dilation": 2, "padding": 2}, floats(2, 2, 7, 7)),
    Case("conv2d-groups", "Conv2d", (4, 6, (3, 2)), {"groups": 2, "stride": 2}, floats(2, 4, 7, 6)),
    Case("conv2d-depthwise", "Conv2d", (4, 4, 3), {"groups": 4, "padding": 1}, floats(2, 4, 5, 5)),
    Case("conv2d-same-even-kernel", "Conv2d", (2, 3, (2, 4)), {"padding": "same"}, floats(2, 2, 5, 6)),
    Case("conv2d-1x1", "Conv2d", (3, 5, 1), {}, floats(2, 3, 4, 4)),
    Case("conv2d-stride3-nobias", "Conv2d", (2, 3, 2), {"stride": 3, "bias": False}, floats(2, 2, 8, 7)),
    Case("conv2d-reflect", "Conv2d", (2, 3, 3), {"padding": 1, "padding_mode": "reflect"}, floats(2, 2, 5, 4)),
    Case("conv2d-circular", "Conv2d", (2, 3, 3), {"padding": (1, 2), "padding_mode": "circular"}, floats(2, 2, 5, 4)),
    Case("conv3d", "Conv3d", (2, 3, 2), {}, floats(1, 2, 4, 4, 3)),
    Case("conv3d-stride-groups", "Conv3d", (2, 4, 3), {"stride": 2, "padding": 1, "groups": 2}, floats(2, 2, 5, 4, 4)),
    Case(
        "convT1d",
        "ConvTranspose1d",
        (3, 4, 3),
        {"stride": 2, "padding": 1, "output_padding": 1},
        floats(2, 3, 5),
        **LOOSE,
    ),
    Case(
        "convT1d-groups-dilation",
        "ConvTranspose1d",
        (4, 6, 3),
        {"stride": 3, "padding": 2, "output_padding": 1, "groups": 2, "dilation": 2},
        floats(2, 4, 5),
        **LOOSE,
    ),
    Case("convT2d", "ConvTranspose2d", (3, 4, 3), {}, floats(2, 3, 4, 4), **LOOSE),
    Case(
        "convT2d-stride-outpad",
        "ConvTranspose2d",
        (3, 4, (3, 2)),
        {"stride": 2, "padding": 1, "output_padding": 1},
        floats(2, 3, 4, 5),
        **LOOSE,
    ),
    Case(
        "convT2d-groups-dilation-nobias",
        "ConvTranspose2d",
        (4, 2, 3),
        {"stride": (2, 3), "groups": 2, "dilation": (2, 1), "bias": False},
        floats(2, 4, 3, 3),
        **LOOSE,
    ),
    Case("convT3d", "ConvTranspose3d", (2, 3, 2), {"stride": 2}, floats(1, 2, 3, 3, 2), **LOOSE),
    # ---------------------------------------------------------------- pooling
    Case("maxpool1d", "MaxPool1d", (2,), {}, floats(2, 3, 8)),
    Case("maxpool1d-ceil", "MaxPool1d", (3, 2, 1), {"ceil_mode": True}, floats(2, 3, 10)),
    Case("maxpool2d", "MaxPool2d", (2,), {}, floats(2, 3, 6, 6)),
    Case("maxpool2d-stride-pad", "MaxPool2d", (3, 2, 1), {}, floats(2, 3, 7, 8)),
    Case("maxpool2d-ceil", "MaxPool2d", (3, 2), {"ceil_mode": True}, floats(2, 3, 7, 8)),
    Case("maxpool2d-dilation", "MaxPool2d", ((2, 3), (1, 2)), {"dilation": 2, "padding": 1}, floats(2, 3, 7, 8)),
    Case("maxpool2d-indices", "MaxPool2d", (3, 2, 1), {"return_indices": True, "ceil_mode": True}, floats(2, 3, 7, 8)),
    Case("maxpool2d-ties", "MaxPool2d", (3, 2, 1), {}, ties(2, 3, 7, 8)),
    Case("maxpool1d-ties", "MaxPool1d", (4, 1), {}, ties(2, 3, 9)),
    Case("adaptivemax2d-ties", "AdaptiveMaxPool2d", ((2, 3),), {}, ties(2, 3, 5, 7)),
    Case("adaptivemax3d-ties", "AdaptiveMaxPool3d", ((2, 3, 2),), {}, ties(1, 2, 5, 4, 3)),
    Case("maxpool3d-ties", "MaxPool3d", (2,), {}, ties(1, 2, 4, 4, 4)),
    Case("maxpool3d", "MaxPool3d", (2,), {}, floats(1, 2, 4, 4, 4)),
    Case("maxpool3d-ceil-pad", "MaxPool3d", (3, 2, 1), {"ceil_mode": True}, floats(1, 2, 5, 5, 4)),
    Case("avgpool1d", "AvgPool1d", (3, 2, 1), {}, floats(2, 3, 9)),
    Case(
        "avgpool1d-ceil-nopadcount",
        "AvgPool1d",
        (3, 2, 1),
        {"ceil_mode": True, "count_include_pad": False},
        floats(2, 3, 10),
    ),
    Case("avgpool2d", "AvgPool2d", (2,), {}, floats(2, 3, 6, 6)),
    Case("avgpool2d-stride-pad", "AvgPool2d", (3, 2, 1), {}, floats(2, 3, 7, 8)),
    Case("avgpool2d-ceil-pad", "AvgPool2d", (3, 2, 1), {"ceil_mode": True}, floats(2, 3, 7, 8)),
    Case("avgpool2d-nopadcount", "AvgPool2d", (3, 2, 1), {"count_include_pad": False}, floats(2, 3, 7, 8)),
    Case("avgpool2d-ceil", "AvgPool2d", (3, 2), {"ceil_mode": True}, floats(2, 3, 7, 8)),
    Case("avgpool2d-divisor", "AvgPool2d", (2,), {"padding": 1, "divisor_override": 5}, floats(2, 3, 5, 5)),
    Case("avgpool3d", "AvgPool3d", (2,), {}, floats(1, 2, 4, 4, 4)),
    Case(
        "avgpool3d-ceil-nopadcount",
        "AvgPool3d",
        (3, 2, 1),
        {"ceil_mode": True, "count_include_pad": False},
        floats(1, 2, 5, 4, 5),
    ),
    Case("adaptiveavg1d", "AdaptiveAvgPool1d", (4,), {}, floats(2, 3, 10)),
    Case("adaptiveavg2d", "AdaptiveAvgPool2d", ((3, 4),), {}, floats(2, 3, 7, 9)),
    Case("adaptiveavg2d-global", "AdaptiveAvgPool2d", (1,), {}, floats(2, 3, 5, 4)),
    Case("adaptiveavg2d-global-unbatched", "AdaptiveAvgPool2d", ((1, 1),), {}, floats(3, 5, 4)),
    Case("adaptiveavg3d-global", "AdaptiveAvgPool3d", (1,), {}, floats(2, 2, 3, 4, 2)),
    Case("adaptiveavg2d-none", "AdaptiveAvgPool2d", ((None, 2),), {}, floats(2, 3, 5, 5)),
    Case("adaptiveavg3d", "AdaptiveAvgPool3d", ((2, 3, 1),), {}, floats(1, 2, 5, 4, 3)),
    Case("adaptivemax1d", "AdaptiveMaxPool1d", (3,), {}, floats(2, 3, 8)),
    Case("adaptivemax2d", "AdaptiveMaxPool2d", ((3, 4),), {}, floats(2, 3, 7, 9)),
    Case("adaptivemax3d", "AdaptiveMaxPool3d", (2,), {}, floats(1, 2, 5, 4, 3)),
    Case("maxunpool1d", "MaxUnpool1d", (2,), {}, unpool_inputs(1, (2, 3, 8), 2)),
    Case("maxunpool2d", "MaxUnpool2d", (2,), {}, unpool_inputs(2, (2, 3, 6, 6), 2)),
    Case("maxunpool2d-stride-pad", "MaxUnpool2d", (3, 2, 1), {}, unpool_inputs(2, (2, 3, 7, 7), 3, 2, 1)),
    Case("maxunpool3d", "MaxUnpool3d", (2,), {}, unpool_inputs(3, (1, 2, 4, 4, 4), 2)),
    Case("lppool1d", "LPPool1d", (2, 3, 2), {}, floats(2, 3, 9)),
    Case("lppool2d", "LPPool2d", (1.5, (2, 3)), {"stride": 1}, floats(2, 3, 5, 6, scale=0.5, offset=2)),
    Case("lppool2d-ceil", "LPPool2d", (2, 3, 2), {"ceil_mode": True}, floats(2, 3, 8, 8)),
    Case("lppool2d-inf", "LPPool2d", (float("inf"), 2), {}, floats(2, 3, 6, 6)),
    Case("lppool3d", "LPPool3d", (2, 2), {}, floats(1, 2, 4, 4, 4)),
    # ---------------------------------------------------------------- normalization (train steps, then eval)
    Case("bn1d", "BatchNorm1d", (4,), {}, floats(6, 4, scale=2, offset=1), steps=3, eval_step=True),
    Case(
        "bn1d-3d-cumulative",
        "BatchNorm1d",
        (4,),
        {"momentum": None},
        floats(5, 4, 3, scale=2, offset=1),
        steps=3,
        eval_step=True,
    ),
    Case("bn1d-noaffine", "BatchNorm1d", (4,), {"affine": False}, floats(6, 4), steps=2, eval_step=True),
    Case("bn2d", "BatchNorm2d", (3,), {}, floats(4, 3, 3, 3, scale=2, offset=-1), steps=3, eval_step=True),
    Case(
        "bn2d-nostats", "BatchNorm2d", (3,), {"track_running_stats": False}, floats(4, 3, 3, 3), steps=2, eval_step=True
    ),
    Case(
        "bn2d-momentum-eps",
        "BatchNorm2d",
        (3,),
        {"momentum": 0.5, "eps": 1e-3},
        floats(4, 3, 2, 3),
        steps=2,
        eval_step=True,
    ),
    Case("bn3d", "BatchNorm3d", (2,), {}, floats(3, 2, 2, 3, 2), steps=2, eval_step=True),
    Case("layernorm", "LayerNorm", (5,), {}, floats(3, 4, 5, scale=2, offset=1)),
    Case("layernorm-2d-shape", "LayerNorm", ((4, 5),), {}, floats(3, 4, 5)),
    Case("layernorm-noaffine", "LayerNorm", (5,), {"elementwise_affine": False}, floats(3, 4, 5)),
    Case("layernorm-nobias", "LayerNorm", (5,), {"bias": False}, floats(3, 4, 5)),
    Case("groupnorm", "GroupNorm", (2, 6), {}, floats(3, 6, 4)),
    Case("groupnorm-noaffine", "GroupNorm", (3, 6), {"affine": False}, floats(2, 6, 2, 3)),
    Case("groupnorm-one-group", "GroupNorm", (1, 4), {}, floats(2, 4, 3, 3)),
    Case("instancenorm1d", "InstanceNorm1d", (3,), {}, floats(2, 3, 7)),
    Case(
        "instancenorm2d-affine-stats",
        "InstanceNorm2d",
        (3,),
        {"affine": True, "track_running_stats": True},
        floats(2, 3, 4, 4, scale=2, offset=1),
        steps=2,
        eval_step=True,
    ),
    Case("instancenorm2d-unbatched", "InstanceNorm2d", (3,), {}, floats(3, 4, 5)),
    Case("instancenorm3d", "InstanceNorm3d", (2,), {"affine": True}, floats(2, 2, 3, 3, 2)),
    Case("rmsnorm", "RMSNorm", (5,), {}, floats(3, 4, 5)),
    Case("rmsnorm-2d-eps", "RMSNorm", ((4, 5),), {"eps": 1e-3}, floats(3, 4, 5)),
    Case("rmsnorm-noaffine", "RMSNorm", (5,), {"elementwise_affine": False}, floats(3, 4, 5)),
    # ---------------------------------------------------------------- sparse
    Case("embedding", "Embedding", (10, 4), {}, ints(10, 3, 5)),
    Case("embedding-padding", "Embedding", (10, 4), {"padding_idx": 0}, ints(10, 3, 5)),
    Case("embedding-freq", "Embedding", (10, 4), {"scale_grad_by_freq": True}, ints(4, 3, 5)),
    Case("embedding-maxnorm", "Embedding", (10, 4), {"max_norm": 1.0}, ints(10, 3, 5)),
    Case("embeddingbag-mean", "EmbeddingBag", (10, 3), {}, bags(10, [1, 2, 4, 5, 4, 3, 2, 9, 0], [0, 2, 2, 5])),
    Case(
        "embeddingbag-sum-weights",
        "EmbeddingBag",
        (10, 3),
        {"mode": "sum"},
        bags(10, [1, 2, 4, 5, 4, 3, 2, 9, 0], [0, 2, 2, 5], weights=True),
    ),
    Case(
        "embeddingbag-max", "EmbeddingBag", (10, 3), {"mode": "max"}, bags(10, [1, 2, 4, 5, 4, 3, 2, 9, 0], [0, 3, 4])
    ),
    Case("embeddingbag-2d", "EmbeddingBag", (10, 3), {"mode": "sum"}, ints(10, 3, 4)),
    Case(
        "embeddingbag-padding",
        "EmbeddingBag",
        (10, 3),
        {"padding_idx": 4},
        bags(10, [1, 2, 4, 5, 4, 3, 2, 9, 0], [0, 2, 5]),
    ),
    Case(
        "embeddingbag-last-offset",
        "EmbeddingBag",
        (10, 3),
        {"mode": "max", "include_last_offset": True},
        bags(10, [1, 2, 4, 5, 4, 3, 2, 9, 0], [0, 2, 5, 9]),
    ),
    # ---------------------------------------------------------------- reshape
    Case("flatten", "Flatten", (), {}, floats(2, 3, 4)),
    Case("flatten-0-1", "Flatten", (0, 1), {}, floats(2, 3, 4)),
    Case("unflatten", "Unflatten", (1, (2, 3)), {}, floats(2, 6, 4)),
    Case("pixelshuffle", "PixelShuffle", (2,), {}, floats(2, 8, 3, 3)),
    Case("pixelunshuffle", "PixelUnshuffle", (2,), {}, floats(2, 2, 4, 6)),
    Case("channelshuffle", "ChannelShuffle", (3,), {}, floats(2, 6, 2, 2)),
    Case("upsample-nearest", "Upsample", (), {"scale_factor": 2}, floats(2, 3, 3, 4)),
    Case("upsample-nearest-size", "Upsample", ((5, 7),), {}, floats(2, 3, 3, 4)),
    Case("upsample-nearest-frac", "Upsample", (), {"scale_factor": 1.7}, floats(2, 3, 3, 4)),
    Case("upsample-nearest-exact", "Upsample", (), {"scale_factor": 2.5, "mode": "nearest-exact"}, floats(2, 3, 3, 4)),
    Case("upsample-linear", "Upsample", (), {"scale_factor": 2, "mode": "linear"}, floats(2, 3, 5)),
    Case("upsample-bilinear", "Upsample", (), {"scale_factor": 2, "mode": "bilinear"}, floats(2, 3, 3, 4)),
    Case(
        "upsample-bilinear-corners",
        "Upsample",
        ((5, 9),),
        {"mode": "bilinear", "align_corners": True},
        floats(2, 3, 3, 4),
    ),
    Case(
        "upsample-bilinear-down", "Upsample", (), {"scale_factor": (1.5, 0.5), "mode": "bilinear"}, floats(2, 3, 4, 6)
    ),
    Case("upsample-bicubic", "Upsample", (), {"scale_factor": 2, "mode": "bicubic"}, floats(2, 3, 3, 4)),
    Case(
        "upsample-bicubic-corners",
        "Upsample",
        ((5, 3),),
        {"mode": "bicubic", "align_corners": True},
        floats(2, 3, 4, 6),
    ),
    Case("upsample-trilinear", "Upsample", ((3, 5, 2),), {"mode": "trilinear"}, floats(1, 2, 2, 3, 4)),
    Case("upsample-area", "Upsample", ((2, 3),), {"mode": "area"}, floats(2, 3, 4, 7)),
    Case("upsampling-nearest2d", "UpsamplingNearest2d", (7,), {}, floats(2, 3, 4, 5)),
    Case("upsampling-bilinear2d", "UpsamplingBilinear2d", (), {"scale_factor": 2}, floats(2, 3, 3, 4)),
    Case("unfold", "Unfold", ((2, 3),), {"dilation": (1, 2), "padding": 1, "stride": 2}, floats(2, 3, 6, 7)),
    Case("fold", "Fold", ((4, 5), 2), {"padding": 1}, floats(2, 12, 30)),
    Case("fold-strided", "Fold", ((6, 7), (2, 3)), {"dilation": (1, 2), "padding": 1, "stride": 2}, floats(2, 18, 12)),
    Case("zeropad1d", "ZeroPad1d", ((1, 2),), {}, floats(2, 3, 5)),
    Case("zeropad2d", "ZeroPad2d", ((1, 2, 0, 3),), {}, floats(2, 3, 4, 5)),
    Case("zeropad3d", "ZeroPad3d", (1,), {}, floats(1, 2, 3, 2, 2)),
    Case("constantpad1d", "ConstantPad1d", (2, 3.5), {}, floats(2, 3, 5)),
    Case("constantpad2d", "ConstantPad2d", ((1, 0, 2, 1), -1.0), {}, floats(2, 3, 4, 5)),
    Case("constantpad3d", "ConstantPad3d", (1, 2.0), {}, floats(1, 2, 3, 2, 2)),
    Case("reflectionpad1d", "ReflectionPad1d", ((2, 1),), {}, floats(2, 3, 5)),
    Case("reflectionpad2d", "ReflectionPad2d", (2,), {}, floats(2, 3, 4, 5)),
    Case("reflectionpad3d", "ReflectionPad3d", (1,), {}, floats(1, 2, 3, 3, 2)),
    Case("replicationpad1d", "ReplicationPad1d", ((1, 3),), {}, floats(2, 3, 5)),
    Case("replicationpad2d", "ReplicationPad2d", ((1, 0, 2, 1),), {}, floats(2, 3, 4, 5)),
    Case("replicationpad3d", "ReplicationPad3d", (1,), {}, floats(1, 2, 3, 4, 5)),
    Case("circularpad1d", "CircularPad1d", ((2, 1),), {}, floats(2, 3, 5)),
    Case("circularpad2d", "CircularPad2d", (1,), {}, floats(2, 3, 4, 5)),
    Case("circularpad3d", "CircularPad3d", (1,), {}, floats(1, 2, 3, 3, 2)),
    # ---------------------------------------------------------------- dropout: identity in eval / with p=0
    Case("dropout-p0", "Dropout", (0.0,), {}, floats(4, 5)),
    Case("dropout1d-p0", "Dropout1d", (0.0,), {}, floats(2, 3, 5)),
    Case("dropout2d-p0", "Dropout2d", (0.0,), {}, floats(2, 3, 4, 5)),
    Case("dropout3d-p0", "Dropout3d", (0.0,), {}, floats(2, 3, 2, 4, 5)),
    Case("alphadropout-p0", "AlphaDropout", (0.0,), {}, floats(4, 5)),
]

# One small float64 configuration per class (inputs and parameters perturbed one by one).
GRADCHECK = [
    Case("conv1d", "Conv1d", (2, 2, 3), {"stride": 2, "padding": 1, "dilation": 1}, floats(1, 2, 7)),
    Case("conv2d", "Conv2d", (2, 4, 2), {"stride": 2, "padding": 1, "groups": 2}, floats(1, 2, 4, 4)),
    Case("conv3d", "Conv3d", (1, 2, 2), {"padding": 1}, floats(1, 1, 3, 2, 2)),
    Case("convT1d", "ConvTranspose1d", (2, 2, 3), {"stride": 2, "output_padding": 1}, floats(1, 2, 3)),
    Case("convT2d", "ConvTranspose2d", (2, 2, 2), {"stride": 2, "padding": 1, "dilation": 2}, floats(1, 2, 3, 3)),
    Case("convT3d", "ConvTranspose3d", (1, 1, 2), {"stride": 2}, floats(1, 1, 2, 2, 2)),
    Case("maxpool1d", "MaxPool1d", (3, 2, 1), {"ceil_mode": True}, floats(1, 2, 8)),
    Case("maxpool2d", "MaxPool2d", (3, 2, 1), {}, floats(1, 2, 5, 5)),
    Case("maxpool3d", "MaxPool3d", (2,), {}, floats(1, 1, 4, 2, 4)),
    Case("avgpool1d", "AvgPool1d", (3, 2, 1), {"count_include_pad": False}, floats(1, 2, 7)),
    Case("avgpool2d", "AvgPool2d", (3, 2, 1), {"ceil_mode": True}, floats(1, 2, 6, 5)),
    Case("avgpool3d", "AvgPool3d", (2,), {}, floats(1, 1, 4, 2, 4)),
    Case("adaptiveavg1d", "AdaptiveAvgPool1d", (3,), {}, floats(1, 2, 7)),
    Case("adaptiveavg2d", "AdaptiveAvgPool2d", ((2, 3),), {}, floats(1, 2, 5, 4)),
    Case("adaptiveavg3d", "AdaptiveAvgPool3d", (2,), {}, floats(1, 1, 3, 3, 3)),
    Case("adaptiveavg2d-global", "AdaptiveAvgPool2d", (1,), {}, floats(1, 2, 3, 4)),
    Case("adaptivemax1d", "AdaptiveMaxPool1d", (3,), {}, floats(1, 2, 7)),
    Case("adaptivemax2d", "AdaptiveMaxPool2d", ((2, 3),), {}, floats(1, 2, 5, 4)),
    Case("adaptivemax3d", "AdaptiveMaxPool3d", (2,), {}, floats(1, 1, 3, 3, 3)),
    Case("maxunpool1d", "MaxUnpool1d", (2,), {}, unpool_inputs(1, (1, 2, 6), 2)),
    Case("maxunpool2d", "MaxUnpool2d", (2,), {}, unpool_inputs(2, (1, 2, 4, 4), 2)),
    Case("maxunpool3d", "MaxUnpool3d", (2,), {}, unpool_inputs(3, (1, 1, 4, 2, 2), 2)),
    Case("lppool1d", "LPPool1d", (2, 3, 2), {}, floats(1, 2, 7)),
    Case("lppool2d", "LPPool2d", (1.5, 2), {}, floats(1, 1, 4, 4, scale=0.5, offset=2)),
    Case("lppool3d", "LPPool3d", (2, 2), {}, floats(1, 1, 2, 2, 4)),
    Case("bn1d", "BatchNorm1d", (3,), {}, floats(4, 3)),
    Case("bn2d", "BatchNorm2d", (2,), {}, floats(3, 2, 2, 2)),
    Case("bn2d-rows", "BatchNorm2d", (3,), {}, floats(5, 3, 2, 7)),  # rows of 14: the CUDA/OpenCL row kernels
    Case("bn3d", "BatchNorm3d", (2,), {}, floats(2, 2, 2, 2, 1)),
    Case("layernorm", "LayerNorm", (4,), {}, floats(3, 4)),
    Case("groupnorm", "GroupNorm", (2, 4), {}, floats(2, 4, 3)),
    Case("instancenorm1d", "InstanceNorm1d", (2,), {"affine": True}, floats(2, 2, 4)),
    Case("instancenorm2d", "InstanceNorm2d", (2,), {}, floats(2, 2, 2, 3)),
    Case("instancenorm3d", "InstanceNorm3d", (1,), {"affine": True}, floats(1, 1, 2, 2, 2)),
    Case("rmsnorm", "RMSNorm", (4,), {}, floats(3, 4)),
    Case("embedding", "Embedding", (5, 3), {"padding_idx": 1}, ints(5, 2, 3)),
    Case("embeddingbag", "EmbeddingBag", (5, 2), {"mode": "max"}, bags(5, [1, 2, 4, 0, 3, 3], [0, 2, 2])),
    Case("flatten", "Flatten", (), {}, floats(2, 2, 3)),
    Case("unflatten", "Unflatten", (1, (2, 2)), {}, floats(2, 4)),
    Case("pixelshuffle", "PixelShuffle", (2,), {}, floats(1, 4, 2, 2)),
    Case("pixelunshuffle", "PixelUnshuffle", (2,), {}, floats(1, 1, 4, 4)),
    Case("channelshuffle", "ChannelShuffle", (2,), {}, floats(1, 4, 2, 1)),
    Case("upsample", "Upsample", (), {"scale_factor": 1.5, "mode": "bilinear"}, floats(1, 1, 3, 3)),
    Case("upsampling-nearest2d", "UpsamplingNearest2d", (), {"scale_factor": 2}, floats(1, 1, 2, 3)),
    Case("upsampling-bilinear2d", "UpsamplingBilinear2d", ((3, 4),), {}, floats(1, 1, 2, 3)),
    Case("unfold", "Unfold", (2,), {"padding": 1, "stride": 2}, floats(1, 2, 3, 3)),
    Case("fold", "Fold", ((3, 3), 2), {}, floats(1, 4, 4)),
    Case("zeropad1d", "ZeroPad1d", (1,), {}, floats(1, 2, 3)),
    Case("zeropad2d", "ZeroPad2d", ((1, 0, 2, 1),), {}, floats(1, 1, 2, 3)),
    Case("zeropad3d", "ZeroPad3d", (1,), {}, floats(1, 1, 2, 2, 1)),
    Case("constantpad1d", "ConstantPad1d", (1, 2.0), {}, floats(1, 2, 3)),
    Case("constantpad2d", "ConstantPad2d", (1, 2.0), {}, floats(1, 1, 2, 3)),
    Case("constantpad3d", "ConstantPad3d", (1, 2.0), {}, floats(1, 1, 2, 2, 1)),
    Case("reflectionpad1d", "ReflectionPad1d", (2,), {}, floats(1, 2, 4)),
    Case("reflectionpad2d", "ReflectionPad2d", (1,), {}, floats(1, 1, 3, 3)),
    Case("reflectionpad3d", "ReflectionPad3d", (1,), {}, floats(1, 1, 2, 2, 2)),
    Case("replicationpad1d", "ReplicationPad1d", ((2, 1),), {}, floats(1, 2, 3)),
    Case("replicationpad2d", "ReplicationPad2d", (1,), {}, floats(1, 1, 2, 3)),
    Case("replicationpad3d", "ReplicationPad3d", (1,), {}, floats(1, 1, 2, 2, 1)),
    Case("circularpad1d", "CircularPad1d", (1,), {}, floats(1, 2, 3)),
    Case("circularpad2d", "CircularPad2d", (1,), {}, floats(1, 1, 2, 3)),
    Case("circularpad3d", "CircularPad3d", (1,), {}, floats(1, 1, 2, 2, 2)),
    Case("dropout", "Dropout", (0.4,), {}, floats(3, 4)),
    Case("dropout1d", "Dropout1d", (0.4,), {}, floats(2, 3, 2)),
    Case("dropout2d", "Dropout2d", (0.4,), {}, floats(2, 3, 2, 1)),
    Case("dropout3d", "Dropout3d", (0.4,), {}, floats(2, 3, 1, 2, 1)),
    Case("alphadropout", "AlphaDropout", (0.4,), {}, floats(3, 4)),
]

FAMILIES = (conv, pooling, normalization, sparse, reshape, dropout)
NOT_COMPARED: dict[str, str] = {}  # class name -> why it is not compared with torch (none at present)


def test_every_module_is_covered():
    """Every exported module class of these families has a torch comparison and a gradcheck."""
    exported = {name for family in FAMILIES for name in family.__all__}
    compared = {c.cls for c in CASES} | set(NOT_COMPARED)
    checked = {c.cls for c in GRADCHECK}
    assert sorted(exported - compared) == [], "modules without a torch comparison"
    assert sorted(exported - checked) == [], "modules without a gradcheck"
    assert sorted((compared | checked) - exported) == [], "cases for classes these families do not export"


def test_functional_names_exported():
    """Every name a family lists in ``__functional__`` is reachable as ``nn.functional.<name>``."""
    for family in FAMILIES:
        for name in family.__functional__:
            assert getattr(F, name) is getattr(family, name), name
        for name in family.__all__:
            assert getattr(nn, name) is getattr(family, name), name


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")  # torch's own note
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_module_matches_torch(case: Case, device: str):
    if case.id.endswith("-inf") and not TORCH_IS_REFERENCE:
        pytest.skip(f"LPPool with norm_type=inf changed after torch {torch.__version__}; compared with 2.13 only")
    t_mod = case.build(torch.nn)
    randomize_parameters(t_mod)
    f_mod = case.build(nn)
    if TORCH_IS_REFERENCE:  # reprs and a few edge semantics changed across torch releases
        assert repr(f_mod) == repr(t_mod)
    compare_with_torch(f_mod, t_mod, case.inputs, device, case.rtol, case.atol, case.steps, case.eval_step)


@pytest.mark.parametrize("case", GRADCHECK, ids=[c.id for c in GRADCHECK])
def test_module_gradcheck(case: Case, device: str):
    skip_if_no_float64(device)
    mod = case.build(nn).to(device).double()
    arrays = case.inputs(np.random.default_rng(1))
    inputs = [
        fg.tensor(a.astype(np.float64), device=device, requires_grad=True)
        if a.dtype.kind == "f"
        else fg.tensor(a, device=device)
        for a in arrays
    ]
    reseed = (lambda: fg.manual_seed(7)) if case.cls.endswith("Dropout") or "Dropout" in case.cls else None
    assert gradcheck_module(mod, inputs, reseed)


# ---------------------------------------------------------------------- behaviour beyond the tables
def test_maxpool_return_indices_match_torch(device: str):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 8)).astype(np.float32)
    for kwargs in (
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": (2, 3), "stride": (1, 2), "dilation": 2},
    ):
        values, idx = F.max_pool2d(fg.tensor(x, device=device), return_indices=True, **kwargs)
        t_values, t_idx = torch.nn.functional.max_pool2d(torch.tensor(x), return_indices=True, **kwargs)
        np.testing.assert_array_equal(host(idx), t_idx.numpy())
        np.testing.assert_array_equal(host(values), t_values.numpy())
    values, idx = F.max_pool1d(fg.tensor(x[0], device=device), 3, 2, return_indices=True)
    t_values, t_idx = torch.nn.functional.max_pool1d(torch.tensor(x[0]), 3, 2, return_indices=True)
    np.testing.assert_array_equal(host(idx), t_idx.numpy())


def test_conv_transpose_output_size_argument(device: str):
    t_mod = torch.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
    f_mod = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
    f_mod.load_state_dict({k: v.detach().numpy() for k, v in t_mod.state_dict().items()})
    f_mod.to(device)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    out = f_mod(fg.tensor(x, device=device), output_size=(8, 8))
    expected = t_mod(torch.tensor(x), output_size=(8, 8))
    assert out.shape == (1, 3, 8, 8)
    np.testing.assert_allclose(host(out), host(expected), rtol=1e-5, atol=1e-5)
    with pytest.raises(fg.FlowError, match="output_size"):
        f_mod(fg.tensor(x, device=device), output_size=(10, 10))


def test_conv_functional_matches_module(device: str):
    x = fg.randn(2, 3, 6, 6, device=device)
    m = nn.Conv2d(3, 4, 3, stride=2, padding=1).to(device)
    np.testing.assert_allclose(host(m(x)), host(F.conv2d(x, m.weight, m.bias, 2, 1)), rtol=1e-6, atol=1e-6)


def test_fold_is_adjoint_of_unfold(device: str):
    """<unfold(x), y> == <x, fold(y)>: fold is unfold's transpose (and so conv's gradient is right)."""
    rng = np.random.default_rng(3)
    x = fg.tensor(rng.standard_normal((2, 3, 6, 5)).astype(np.float32), device=device)
    cols = F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1))
    y = fg.tensor(rng.standard_normal(cols.shape).astype(np.float32), device=device)
    folded = F.fold(y, (6, 5), (3, 2), dilation=(1, 2), padding=1, stride=(2, 1))
    lhs = float((cols * y).sum().item())
    rhs = float((x * folded).sum().item())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: nn.Conv2d(3, 4, 3, groups=2), "divisible by groups"),
        (lambda: nn.Conv2d(4, 4, 3, padding="same", stride=2), "same"),
        (lambda: nn.Conv2d(4, 4, 3, padding="full"), "padding"),
        (lambda: nn.Conv2d(4, 4, 3, padding_mode="mirror"), "padding_mode"),
        (lambda: nn.Conv2d(3, 4, 3)(fg.zeros(1, 2, 5, 5)), "channels"),
        (lambda: nn.Conv2d(3, 4, 3)(fg.zeros(1, 3, 5)), "input"),
        (lambda: nn.Conv2d(3, 4, 5)(fg.zeros(1, 3, 3, 3)), "smaller than the kernel"),
        (lambda: nn.MaxPool2d(2, padding=2), None),
        (lambda: F.max_pool2d(fg.zeros(1, 1, 4, 4), 2, padding=2), "half of the kernel"),
        (lambda: nn.BatchNorm1d(3)(fg.zeros(1, 3)), "more than 1 value per channel"),
        (lambda: nn.BatchNorm2d(3)(fg.zeros(2, 3, 4)), "4-d"),
        (lambda: nn.LayerNorm(4)(fg.zeros(2, 5)), "normalized_shape"),
        (lambda: nn.GroupNorm(4, 6), "divisible"),
        (lambda: nn.Embedding(3, 2)(fg.tensor([0.5])), "integer"),
        (lambda: nn.EmbeddingBag(3, 2, mode="median"), "mode"),
        (lambda: nn.Dropout(1.5), "between 0 and 1"),
        (lambda: nn.PixelShuffle(2)(fg.zeros(1, 3, 2, 2)), "divisible"),
        (lambda: F.interpolate(fg.zeros(1, 1, 2, 2), scale_factor=2, mode="lanczos"), "mode"),
        (lambda: F.interpolate(fg.zeros(1, 1, 2, 2), scale_factor=2, align_corners=True), "align_corners"),
        (lambda: F.interpolate(fg.zeros(1, 1, 2, 2), mode="linear", size=3), "needs a 3-d input"),
        (lambda: F.fold(fg.zeros(1, 5, 4), (3, 3), 2), "does not match"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_misuse_raises_flow_error(bad, match):
    if match is None:  # PyTorch accepts this construction; the error comes at the call
        bad()
        return
    with pytest.raises(fg.FlowError, match=match):
        bad()


# ---------------------------------------------------------------------- batch norm details
def test_batchnorm_counts_batches_and_eval_uses_running_stats(device: str):
    bn = nn.BatchNorm1d(2, momentum=None).to(device)
    xs = [fg.randn(8, 2, device=device) * 3 + 1 for _ in range(4)]
    for x in xs:
        bn(x)
    assert int(bn.num_batches_tracked.item()) == 4
    stacked = np.stack([host(x) for x in xs])
    np.testing.assert_allclose(host(bn.running_mean), stacked.mean(1).mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(bn.running_var), stacked.var(1, ddof=1).mean(0), rtol=1e-5, atol=1e-5)
    bn.eval()
    x = xs[0]
    expected = (host(x) - host(bn.running_mean)) / np.sqrt(host(bn.running_var) + bn.eps)
    expected = expected * host(bn.weight) + host(bn.bias)
    np.testing.assert_allclose(host(bn(x)), expected, rtol=1e-5, atol=1e-5)
    assert int(bn.num_batches_tracked.item()) == 4  # eval does not count


@pytest.mark.parametrize("spatial", [(5, 6), (1, 2)], ids=["statistics-kernel", "generic"])
def test_batchnorm2d_counts_batches_in_its_statistics_call_like_torch(device: str, spatial: tuple):
    """On CUDA and OpenCL a layer with a fixed momentum counts its batches in the backend call that updates the
    running statistics: for rows long enough for their kernels, inside the statistics kernel (no write of its
    own: ``_count_batch`` never gets the counter), else by ``_count_batch``; on NumPy the layer counts. Values,
    running statistics and counts as torch's, the counter's version bumped once a step."""
    rng = np.random.default_rng(3)
    ref = torch.nn.BatchNorm2d(3, momentum=0.3)
    bn = nn.BatchNorm2d(3, momentum=0.3).to(device)
    count = bn.num_batches_tracked
    bk, version = count._backend, count._version
    given: list[bool] = []
    original = bk._count_batch
    bk._count_batch = lambda b: (given.append(b is not None), original(b))[1]
    try:
        for _ in range(3):
            x = rng.standard_normal((4, 3, *spatial)).astype(np.float32)
            np.testing.assert_allclose(host(bn(fg.tensor(x, device=device))), ref(torch.from_numpy(x)).detach(),
                                       rtol=1e-5, atol=1e-5)
    finally:
        del bk._count_batch
    assert int(count.item()) == 3 == int(ref.num_batches_tracked)
    assert count._version == version + 3
    np.testing.assert_allclose(host(bn.running_mean), ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(bn.running_var), ref.running_var.numpy(), rtol=1e-5, atol=1e-6)
    # the layer hands the counter to a lazy backend, whose statistics kernel counts where the rows are long
    assert given.count(True) == (3 if bk.defers_elementwise and spatial == (1, 2) else 0), given
    bn.eval()
    bn(fg.tensor(rng.standard_normal((4, 3, *spatial)).astype(np.float32), device=device))
    assert int(count.item()) == 3  # eval does not count


def test_batchnorm2d_counts_batches_once_per_jitted_step(device: str):
    """Under ``fg.jit`` the count rises by one at every call, eager, recorded and replayed alike (on CUDA and
    OpenCL the statistics kernel that counts is part of the replay)."""
    bn = nn.BatchNorm2d(3).to(device)
    x = fg.tensor(np.random.default_rng(4).standard_normal((4, 3, 5, 6)).astype(np.float32), device=device)

    @fg.jit
    def step(x):
        return bn(x).sum()

    for k in range(1, 6):
        step(x).item()
        assert int(bn.num_batches_tracked.item()) == k


def test_batchnorm_state_dict_keys_like_torch():
    assert list(nn.BatchNorm2d(3).state_dict()) == list(torch.nn.BatchNorm2d(3).state_dict())
    assert list(nn.BatchNorm2d(3, track_running_stats=False).state_dict()) == ["weight", "bias"]
    assert nn.BatchNorm2d(3).num_batches_tracked.dtype == fg.int64


# ---------------------------------------------------------------------- dropout statistics and modes
@pytest.mark.parametrize(
    "cls, shape",
    [
        ("Dropout", (400, 50)),
        ("Dropout1d", (40, 50, 4)),
        ("Dropout2d", (40, 50, 2, 2)),
        ("Dropout3d", (40, 50, 1, 2, 2)),
    ],
)
def test_dropout_rate_scale_and_eval(cls: str, shape, device: str):
    p = 0.3
    layer = getattr(nn, cls)(p)
    fg.manual_seed(0)
    x = fg.ones(*shape, device=device)
    y = host(layer(x))
    kept = y != 0
    assert abs(1 - kept.mean() - p) < 0.03  # 20,000 Bernoulli draws (2,000 channels): 4+ standard deviations
    np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-6)
    if cls != "Dropout":  # whole channels: every element of a channel shares its fate
        per_channel = kept.reshape(shape[0], shape[1], -1)
        assert (per_channel.all(-1) | ~per_channel.any(-1)).all()
    fg.manual_seed(0)
    np.testing.assert_array_equal(host(layer(x)), y)  # fg.manual_seed reproduces the mask
    layer.eval()
    assert layer(x) is x


def test_dropout_gradient_uses_the_mask(device: str):
    x = fg.ones(20, 30, device=device, requires_grad=True)
    y = F.dropout(x, 0.5)
    y.sum().backward()
    np.testing.assert_array_equal(host(x.grad), host(y.detach()))


def test_alpha_dropout_keeps_mean_and_variance(device: str):
    fg.manual_seed(0)
    x = fg.randn(200_000, device=device)
    y = host(nn.AlphaDropout(0.2)(x))
    assert abs(y.mean()) < 0.02 and abs(y.var() - 1) < 0.03
    assert F.alpha_dropout(x, 0.2) is x  # training=False by default, as in PyTorch


def test_dropout_p_one_and_inplace(device: str):
    x = fg.randn(4, 5, device=device)
    assert not host(F.dropout(x, 1.0)).any()
    y = fg.ones(4, 5, device=device)
    out = F.dropout(y, 0.5, inplace=True)
    assert out is y and set(np.unique(host(y))) <= {0.0, 2.0}


# ---------------------------------------------------------------------- sparse extras
def test_embedding_from_pretrained_and_padding_init(device: str):
    w = fg.randn(4, 3)
    emb = nn.Embedding.from_pretrained(w).to(device)
    assert not emb.weight.requires_grad
    np.testing.assert_array_equal(host(emb(fg.tensor([2, 0], device=device))), host(w)[[2, 0]])
    assert nn.Embedding.from_pretrained(w, freeze=False).weight.requires_grad
    padded = nn.Embedding(5, 3, padding_idx=-1)
    assert padded.padding_idx == 4 and not host(padded.weight)[4].any()
    bag = nn.EmbeddingBag.from_pretrained(w, mode="sum")
    np.testing.assert_allclose(host(bag(fg.tensor([[0, 1]]))), host(w)[[0]] + host(w)[[1]], rtol=1e-6)


def test_one_hot_like_torch(device: str):
    labels = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(
        host(F.one_hot(fg.tensor(labels, device=device))), torch.nn.functional.one_hot(torch.tensor(labels)).numpy()
    )
    out = F.one_hot(fg.tensor(labels, device=device), num_classes=6)
    assert out.shape == (2, 2, 6) and out.dtype == fg.int64
    with pytest.raises(fg.FlowError, match="range"):
        F.one_hot(fg.tensor([0, 5]), num_classes=3)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_without_bags(mode: str, device: str):
    bag = nn.EmbeddingBag(5, 3, mode=mode).to(device)
    out = bag(fg.tensor([1, 2, 3], device=device), fg.tensor([], dtype=fg.int64, device=device))
    assert out.shape == (0, 3)  # torch gives (0, 3) for sum/mean (and crashes for max)


FUNCTIONAL_EXTRAS = {
    "normalize-p2": (lambda m, x: m.normalize(x), (3, 4)),
    "normalize-p1-dim0": (lambda m, x: m.normalize(x, p=1.0, dim=0), (3, 4)),
    "normalize-eps": (lambda m, x: m.normalize(x * 1e-7, eps=1e-3), (3, 4)),
    "pad-constant": (lambda m, x: m.pad(x, (1, 2, 0, 1), value=0.5), (2, 3, 4)),
    "pad-reflect": (lambda m, x: m.pad(x, (2, 1), mode="reflect"), (2, 3, 4)),
    "pad-replicate": (lambda m, x: m.pad(x, (1, 1, 2, 0), mode="replicate"), (1, 2, 3, 4)),
    "pad-circular": (lambda m, x: m.pad(x, (1, 2), mode="circular"), (2, 3, 4)),
    "interpolate-recompute": (lambda m, x: m.interpolate(x, scale_factor=1.7, mode="bilinear",
                                                         recompute_scale_factor=True), (1, 2, 3, 4)),
    "interpolate-area": (lambda m, x: m.interpolate(x, size=(2, 3), mode="area"), (1, 2, 5, 7)),
    "layer_norm-fn": (lambda m, x: m.layer_norm(x, (4,), eps=1e-3), (3, 4)),
    "rms_norm-fn": (lambda m, x: m.rms_norm(x, (4,)), (3, 4)),
    "group_norm-fn": (lambda m, x: m.group_norm(x, 2), (2, 4, 3)),
    "instance_norm-fn": (lambda m, x: m.instance_norm(x), (2, 3, 5)),
    "conv1d-fn-same": (lambda m, x: m.conv1d(x, x[:2, :, :3] * 1.0, padding="same"), (3, 3, 6)),
    "unfold-fn": (lambda m, x: m.unfold(x, 2, stride=2), (1, 2, 4, 4)),
    "adaptive_max_pool1d-fn": (lambda m, x: m.adaptive_max_pool1d(x, 3), (2, 3, 7)),
    "lp_pool1d-inf": (lambda m, x: m.lp_pool1d(x, float("inf"), 2), (2, 3, 6)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FUNCTIONAL_EXTRAS))
def test_functional_forms_match_torch(name: str, device: str):
    """Functional forms not reached through a module above (rtol=1e-5, atol=1e-5; gradients too)."""
    if name.endswith("-inf") and not TORCH_IS_REFERENCE:
        pytest.skip(f"lp_pool with norm_type=inf changed after torch {torch.__version__}; compared with 2.13 only")
    fn, shape = FUNCTIONAL_EXTRAS[name]
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    a = fg.tensor(x, device=device, requires_grad=True)
    b = torch.tensor(x, requires_grad=True)
    y, z = fn(F, a), fn(torch.nn.functional, b)
    np.testing.assert_allclose(host(y), host(z), rtol=1e-5, atol=1e-5)
    g = np.random.default_rng(7).standard_normal(tuple(z.shape)).astype(np.float32)
    y.backward(fg.tensor(g, device=device))
    z.backward(torch.tensor(g))
    np.testing.assert_allclose(host(a.grad), host(b.grad), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "cls, args, shape",
    [
        ("BatchNorm2d", (3,), (2, 3, 2, 2)),
        ("LayerNorm", (4,), (2, 4)),
        ("GroupNorm", (1, 3), (2, 3, 2)),
        ("RMSNorm", (4,), (2, 4)),
        ("InstanceNorm1d", (3,), (2, 3, 4)),
    ],
)
def test_norm_keeps_half_input_dtype(cls: str, args, shape):
    """A float16 input through a float32 module stays float16, as in PyTorch (parameters and statistics do not
    promote it)."""
    layer = getattr(nn, cls)(*args, **({"affine": True} if cls.startswith("Instance") else {}))
    for training in (True, False):
        layer.train(training)
        out = layer(fg.randn(*shape).half())
        assert out.dtype == fg.float16, (cls, training, out.dtype)


def test_conv_argument_check_is_remembered_per_value_and_still_refuses_bools():
    # the check's memo is keyed by the value's identity: True (== 1, same hash) is still refused after 1 passed
    assert conv._ntuple(1, 2, "stride", "conv2d") == (1, 1)
    assert conv._ntuple((2, 3), 2, "stride", "conv2d") == (2, 3)
    with pytest.raises(fg.FlowError, match="stride must be an int or a tuple of 2 ints"):
        conv._ntuple(True, 2, "stride", "conv2d")
    # the same value under another name or rank is checked again (kernel_size 0 is refused, padding 0 is not)
    assert conv._ntuple(0, 2, "padding", "conv2d") == (0, 0)
    with pytest.raises(fg.FlowError, match="kernel_size must be >= 1"):
        conv._ntuple(0, 2, "kernel_size", "conv2d")
    assert conv._ntuple(0, 3, "padding", "conv3d") == (0, 0, 0)
    m = nn.Conv2d(2, 3, 3, stride=(1, 2))
    x = fg.tensor(np.ones((1, 2, 5, 5), np.float32))
    assert m(x).shape == m(x).shape == (1, 3, 3, 2)
