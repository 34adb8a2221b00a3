"""Parameter initialisation (``nn.init``), PyTorch's names and formulas; every function works in place
under ``no_grad`` and returns its tensor."""

from __future__ import annotations

import math

from ..autograd.grad_mode import no_grad
from ..errors import FlowError
from ..tensor import Tensor


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table)."""
    linear_fns = {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d", "sigmoid"}
    if nonlinearity in linear_fns:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise FlowError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise FlowError(f"fan in/out need a tensor with at least 2 dims, got shape {tensor.shape}")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise FlowError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with U(a, b)."""
    with no_grad():
        return tensor.uniform_(a, b)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with N(mean, std^2)."""
    with no_grad():
        return tensor.normal_(mean, std)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with 0."""
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    """Fill with 1."""
    return constant_(tensor, 1.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-d tensor with the identity."""
    from ..tensor import eye

    if tensor.ndim != 2:
        raise FlowError(f"eye_ needs a 2-d tensor, got shape {tensor.shape}")
    with no_grad():
        return tensor.copy_(eye(*tensor.shape, dtype=tensor.dtype, device=tensor.device))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot uniform: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
                     ) -> Tensor:
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan)."""
    if 0 in tensor.shape:
        return tensor
    fan = _fan(tensor, mode)
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
                    ) -> Tensor:
    """He normal: N(0, std^2) with std = gain / sqrt(fan)."""
    if 0 in tensor.shape:
        return tensor
    fan = _fan(tensor, mode)
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """Normal samples redrawn until they fall in [a, b] (rejection; exact truncated distribution)."""
    from ..tensor import where

    with no_grad():
        out = tensor.detach().normal_(mean, std)
        for _ in range(100):
            bad = (out < a) | (out > b)
            if not bool(bad.any().item()):
                break
            fresh = tensor.detach().normal_(mean, std)
            out = where(bad, fresh, out)
        return tensor.copy_(out.clamp(a, b))


def orthogonal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """A (semi-)orthogonal matrix from the QR decomposition of a normal sample (on the host)."""
    import numpy as np

    from ..tensor import randn
    from ..tensor import tensor as make

    if tensor.ndim < 2:
        raise FlowError(f"orthogonal_ needs at least 2 dims, got shape {tensor.shape}")
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = randn(rows, cols, dtype=make(0.0).dtype).numpy().astype(np.float64)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    with no_grad():
        return tensor.copy_(make(q.reshape(tensor.shape) * gain, dtype=tensor.dtype, device=tensor.device))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """A 3-, 4- or 5-d convolution weight that passes its input through: 1 at the kernel centre of channel
    ``i -> i`` in each of ``groups`` groups, 0 elsewhere (PyTorch's ``dirac_``)."""
    import numpy as np

    from ..tensor import tensor as make

    if tensor.ndim not in (3, 4, 5):
        raise FlowError(f"dirac_ needs a 3-, 4- or 5-d convolution weight, got shape {tensor.shape}")
    out_channels = tensor.shape[0]
    if groups < 1 or out_channels % groups:
        raise FlowError(f"dirac_: groups ({groups}) must divide the first dim ({out_channels})")
    per_group = out_channels // groups
    values = np.zeros(tensor.shape)
    centre = tuple(s // 2 for s in tensor.shape[2:])
    for g in range(groups):
        for d in range(min(per_group, tensor.shape[1])):
            values[(g * per_group + d, d) + centre] = 1.0
    with no_grad():
        return tensor.copy_(make(values, dtype=tensor.dtype, device=tensor.device))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01) -> Tensor:
    """A 2-d tensor of N(0, std^2) values with ``ceil(sparsity * rows)`` zeros in every column, at random rows
    (PyTorch's ``sparse_``)."""
    import math as _math

    from ..tensor import rand, where

    if tensor.ndim != 2:
        raise FlowError(f"sparse_ needs a 2-d tensor, got shape {tensor.shape}")
    rows, _ = tensor.shape
    num_zeros = _math.ceil(sparsity * rows)
    with no_grad():
        tensor.normal_(0.0, std)
        if num_zeros:
            # the num_zeros smallest of per-column random keys mark each column's zeros (a random subset)
            keys = rand(*tensor.shape, device=tensor.device)
            threshold = keys.sort(0)[0][num_zeros - 1 : num_zeros]
            tensor.copy_(where(keys <= threshold, 0.0, tensor))
        return tensor
