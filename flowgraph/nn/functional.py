"""``nn.functional``: the functional forms of layers, activations and losses.

Every family module lists its functions in ``__functional__``; they are gathered here so
``F.conv2d``, ``F.cross_entropy`` ... work as in PyTorch.
"""

from __future__ import annotations

from ..tensor import gelu, log_softmax, relu, sigmoid, silu, softmax, softplus, tanh
from . import activation, attention, conv, dropout, loss, normalization, pooling, reshape, rnn, sparse
from . import linear as _linear_module
from .linear import bilinear, linear

for _family in (activation, attention, conv, dropout, loss, normalization, pooling, reshape, rnn, sparse):
    for _name in _family.__functional__:
        globals()[_name] = getattr(_family, _name)
del _family, _linear_module

__all__ = ["bilinear", "gelu", "linear", "log_softmax", "relu", "sigmoid", "silu", "softmax", "softplus", "tanh"]
