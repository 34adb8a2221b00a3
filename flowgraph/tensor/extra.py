"""More of PyTorch's tensor API, composed from the core ops: triangular masks, diagonals, sorting and top-k,
closeness tests, ``nan_to_num``, ``inference_mode``, ``addcmul``/``addcdiv``, ``view_as``/``reshape_as`` and the
``is_cpu``/``is_cuda`` flags.

Sorting has no backend primitive: ``sort``/``argsort``/``topk`` compute the permutation on the host
(one device-to-host copy of the keys) and then gather on the device, so values stay differentiable and
the result lives where the input lives.
"""

from __future__ import annotations

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import FlowError
from .creation import arange, tensor
from .elementwise import where
from .sampling import multinomial
from .shape import pad
from .tensor import Tensor, _norm_dim, _wrap


def _tri_mask(a: Tensor, diagonal: int, upper: bool) -> Tensor:
    if a.ndim < 2:
        raise FlowError(f"{'triu' if upper else 'tril'}: expected at least 2 dims, got shape {a.shape}")
    rows, cols = a.shape[-2], a.shape[-1]
    r = arange(rows, device=a.device).reshape(rows, 1)
    c = arange(cols, device=a.device).reshape(1, cols)
    return (c - r >= diagonal) if upper else (c - r <= diagonal)


def tril(a: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (elements above ``diagonal`` set to 0)."""
    return where(_tri_mask(a, diagonal, upper=False), a, 0)


def triu(a: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (elements below ``diagonal`` set to 0)."""
    return where(_tri_mask(a, diagonal, upper=True), a, 0)


def diagonal(a: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of ``a`` over ``dim1``/``dim2`` (moved to the last dim), as PyTorch's ``diagonal``."""
    d1, d2 = _norm_dim(dim1, a.ndim, "diagonal"), _norm_dim(dim2, a.ndim, "diagonal")
    if d1 == d2:
        raise FlowError("diagonal: dim1 and dim2 must differ")
    rest = [i for i in range(a.ndim) if i not in (d1, d2)]
    m = a.permute(rest + [d1, d2])
    n1, n2 = m.shape[-2], m.shape[-1]
    start_r, start_c = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(n1 - start_r, n2 - start_c))
    rows = arange(start_r, start_r + length, device=a.device)
    cols = arange(start_c, start_c + length, device=a.device)
    flat = m.reshape(m.shape[:-2] + (n1 * n2,))
    return flat.index_select(-1, rows * n2 + cols)


def diag(a: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-d input becomes a diagonal matrix; a 2-d input gives its diagonal."""
    if a.ndim == 2:
        return globals()["diagonal"](a, diagonal)
    if a.ndim != 1:
        raise FlowError(f"diag: expected a 1-d or 2-d tensor, got shape {a.shape}")
    n = a.shape[0] + abs(diagonal)
    r = arange(n, device=a.device).reshape(n, 1)
    c = arange(n, device=a.device).reshape(1, n)
    # k >= 0: row r holds a[r] at column r + k; k < 0: column c holds a[c] at row c - k.
    v = pad(a, (0, diagonal)).reshape(n, 1) if diagonal >= 0 else pad(a, (0, -diagonal)).reshape(1, n)
    return where(c - r == diagonal, v, 0)


def trace(a: Tensor) -> Tensor:
    """Sum of the main diagonal of a 2-d tensor."""
    return diagonal(a).sum()


def _sorted_indices(a: Tensor, dim: int, descending: bool, stable: bool) -> Tensor:
    """The backend's stable sort order along ``dim`` (always stable: ``stable=False`` allows any order)."""
    return _wrap(a._backend.argsort(a._data, dim, descending), a._backend)


def sort(a: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """``(values, indices)`` sorted along ``dim`` (ties keep their order); values carry gradients."""
    d = _norm_dim(dim, a.ndim, "sort")
    if a.ndim == 0:
        return a * 1, tensor(0, device=a.device)
    idx = _sorted_indices(a, d, descending, stable)
    from .reduction import MinMax

    return MinMax(a.gather(d, idx), idx)


def argsort(a: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """Indices that sort ``a`` along ``dim``."""
    d = _norm_dim(dim, a.ndim, "argsort")
    return _sorted_indices(a, d, descending, stable)


def topk(a: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The ``k`` largest (or smallest) elements along ``dim`` as ``(values, indices)``."""
    d = _norm_dim(dim, a.ndim, "topk")
    if not 0 <= k <= a.shape[d]:
        raise FlowError(f"topk: k={k} out of range for dim {d} of size {a.shape[d]}")
    idx = _sorted_indices(a, d, largest, True).narrow(d, 0, k)
    from .reduction import MinMax

    return MinMax(a.gather(d, idx), idx)


def isclose(a: Tensor, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """Elementwise ``|a - b| <= atol + rtol * |b|`` (bool), PyTorch's definition."""
    with no_grad():
        close = (a - b).abs() <= atol + rtol * (b.abs() if isinstance(b, Tensor) else abs(b))
        close = close | (a == b)
        if equal_nan:
            close = close | (a.isnan() & (b.isnan() if isinstance(b, Tensor) else False))
    return close


def allclose(a: Tensor, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    """Whether every element is close (see ``isclose``)."""
    return bool(isclose(a, b, rtol, atol, equal_nan).all().item())


def equal(a: Tensor, b: Tensor) -> bool:
    """Same shape and same values."""
    return a.shape == b.shape and bool((a == b).all().item())


def nan_to_num(a: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """Replace NaN, +inf and -inf with finite numbers (defaults: 0 and the dtype's extremes)."""
    info = np.finfo(a.dtype.np) if a.dtype.is_floating_point and a.dtype.name != "bfloat16" else np.finfo(np.float32)
    posinf = float(info.max) if posinf is None else posinf
    neginf = float(info.min) if neginf is None else neginf
    out = where(a.isnan(), nan, a)
    out = where(out == float("inf"), posinf, out)
    return where(out == float("-inf"), neginf, out)


class inference_mode(no_grad):  # noqa: N801 - PyTorch's name
    """Like ``no_grad``: no graph is recorded inside (PyTorch's ``inference_mode``)."""

    def __init__(self, mode: bool = True):
        self._value = not mode


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: float = 1) -> Tensor:  # noqa: A002
    """``input + value * tensor1 * tensor2`` (broadcast), as ``torch.addcmul``; differentiable in all three."""
    product = tensor1 * tensor2
    return input + (product if value == 1 else product * value)


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: float = 1) -> Tensor:  # noqa: A002
    """``input + value * tensor1 / tensor2`` (broadcast), as ``torch.addcdiv``; differentiable in all three.

    Integer ``tensor1`` and ``tensor2`` raise, as in PyTorch (true or floor division would be ambiguous)."""
    if all(isinstance(t, Tensor) and not t.dtype.is_floating_point for t in (tensor1, tensor2)):
        raise FlowError(f"addcdiv: integer division of {tensor1.dtype} by {tensor2.dtype} is not supported; "
                        "convert tensor1 or tensor2 to a floating dtype, or use addcmul with a reciprocal")
    quotient = tensor1 / tensor2
    return input + (quotient if value == 1 else quotient * value)


def _addc_inplace(name: str, fn):
    def method(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: float = 1) -> Tensor:
        from .indexing import apply_inplace

        return apply_inplace(self, lambda s: fn(s, tensor1, tensor2, value=value), name, tensor1, tensor2)

    method.__name__ = name
    method.__doc__ = f"In-place ``{name[:-1]}``: writes the result into this tensor and returns it."
    return method


addcmul_ = _addc_inplace("addcmul_", addcmul)
addcdiv_ = _addc_inplace("addcdiv_", addcdiv)


def _tri_inplace(name: str, fn):
    def method(self: Tensor, diagonal: int = 0) -> Tensor:
        from .indexing import apply_inplace

        return apply_inplace(self, lambda s: fn(s, diagonal), name)

    method.__name__ = name
    method.__doc__ = (f"In-place ``{name[:-1]}``: zeroes the elements {'below' if name == 'triu_' else 'above'} "
                      "``diagonal`` of the last two dims and returns this tensor.")
    return method


tril_ = _tri_inplace("tril_", tril)
triu_ = _tri_inplace("triu_", triu)


def type_as(a: Tensor, other: Tensor) -> Tensor:
    """``a`` cast to ``other``'s dtype and moved to its device (``a`` itself when both already match)."""
    if not isinstance(other, Tensor):
        raise FlowError(f"type_as: other must be a Tensor, got {type(other).__name__}; use .to(dtype) for a dtype")
    return a.to(other.device, other.dtype)


def is_contiguous(a: Tensor) -> bool:
    """Whether the tensor's storage is laid out row-major (C order), as the backend reports it; a pending
    (fused, not yet run) result counts as contiguous, since it is written into a fresh row-major buffer."""
    return a._backend.is_contiguous(a._data)


def bernoulli_(a: Tensor, p=0.5) -> Tensor:
    """Fill in place with 0/1 draws that are 1 with probability ``p`` (a float, or a tensor broadcast to ``a``'s
    shape). Not differentiable: the old values get a zero gradient."""
    from .creation import rand
    from .indexing import apply_inplace

    if isinstance(p, Tensor):
        p = p.detach().to(a.device)
    elif isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise FlowError(f"bernoulli_: p must be a probability in [0, 1] (a float or a Tensor), got {p!r}")
    with no_grad():
        draws = (rand(*a.shape, device=a.device) < p).to(a.dtype)
    return apply_inplace(a, lambda s: draws, "bernoulli_")


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002 - PyTorch's names
           return_counts: bool = False, dim: int | None = None):
    """The distinct elements of ``input`` (flattened), ascending, on ``input``'s device; with
    ``return_inverse`` also each element's index into them (``input``'s shape) and with ``return_counts``
    how often each occurs (both int64). Only ``dim=None``.

    The output's length depends on the data, so this runs on the host with ``numpy.unique`` (one copy there
    and back). ``sorted=False`` also returns them ascending (PyTorch leaves that order unspecified). Not
    differentiable.
    """
    if dim is not None:
        raise FlowError(f"unique: dim={dim!r} is not supported; only dim=None (the distinct elements of the "
                        "flattened tensor)")
    host = input.detach().numpy()
    values, inverse, counts = np.unique(host.reshape(-1), return_inverse=True, return_counts=True,
                                        equal_nan=False)
    out = tensor(values, dtype=input.dtype, device=input.device)
    if not (return_inverse or return_counts):
        return out
    result = (out,)
    if return_inverse:
        result += (tensor(inverse.reshape(input.shape).astype(np.int64), device=input.device),)
    if return_counts:
        result += (tensor(counts.astype(np.int64), device=input.device),)
    return result


def view_as(a: Tensor, other: Tensor) -> Tensor:
    """``a.view(other.shape)``: a view with ``other``'s shape (``a`` must be viewable as it)."""
    return a.view(other.shape)


def reshape_as(a: Tensor, other: Tensor) -> Tensor:
    """``a.reshape(other.shape)``: ``other``'s shape, a view where possible and a copy otherwise."""
    return a.reshape(other.shape)


def _is_cuda(self: Tensor) -> bool:
    """Whether the tensor lives on a CUDA device (``torch.Tensor.is_cuda``)."""
    return self.device.startswith("cuda")


def _is_cpu(self: Tensor) -> bool:
    """Whether the tensor lives on the CPU (``torch.Tensor.is_cpu``)."""
    return self.device == "cpu"


def _t_property(self: Tensor) -> Tensor:
    """``x.T``: all dims reversed (a matrix transpose for 2-d)."""
    return self.permute(tuple(range(self.ndim - 1, -1, -1))) if self.ndim > 1 else self


def _mt_property(self: Tensor) -> Tensor:
    """``x.mT``: the last two dims swapped."""
    return self.transpose(-2, -1)


def install(T: type) -> None:
    """Attach these ops to ``Tensor``."""
    for name, fn in (("tril", tril), ("triu", triu), ("diagonal", diagonal), ("diag", diag), ("trace", trace),
                     ("sort", sort), ("argsort", argsort), ("topk", topk), ("isclose", isclose),
                     ("allclose", allclose), ("equal", equal), ("nan_to_num", nan_to_num), ("addcmul", addcmul),
                     ("addcdiv", addcdiv), ("addcmul_", addcmul_), ("addcdiv_", addcdiv_), ("view_as", view_as),
                     ("reshape_as", reshape_as), ("multinomial", multinomial),
                     ("tril_", tril_), ("triu_", triu_), ("type_as", type_as), ("is_contiguous", is_contiguous),
                     ("bernoulli_", bernoulli_), ("unique", unique)):
        setattr(T, name, fn)
    T.is_cuda = property(_is_cuda)
    T.is_cpu = property(_is_cpu)
    T.T = property(_t_property)
    T.mT = property(_mt_property)
