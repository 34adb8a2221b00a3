"""``nn.functional``: the functional forms of layers, activations and losses."""

from __future__ import annotations

from ..tensor import gelu, log_softmax, relu, sigmoid, silu, softmax, softplus, tanh
from .linear import linear

__all__ = ["gelu", "linear", "log_softmax", "relu", "sigmoid", "silu", "softmax", "softplus", "tanh"]
