"""Lookup layers: ``Embedding``, ``EmbeddingBag`` and ``one_hot``.

An embedding is one ``index_select`` of weight rows (its gradient is the matching ``index_add``).
Bags are padded to the longest bag on the host (the offsets decide the output's shape anyway), gathered in
one ``index_select`` and reduced with a validity mask, so sum/mean/max bags cost a handful of ops whatever
their number.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, arange, empty, ones, tensor, where, zeros
from ..tensor.tensor import check_index_range
from . import init
from .module import Module, Parameter

__all__ = ["Embedding", "EmbeddingBag"]
__functional__ = ["embedding", "embedding_bag", "one_hot"]


def _check_indices(input: Tensor, where_: str) -> None:
    if not isinstance(input, Tensor) or input.dtype.is_floating_point or input.dtype.name == "bool":
        got = type(input).__name__ if not isinstance(input, Tensor) else input.dtype
        raise FlowError(f"{where_}: indices must be an integer tensor (int32/int64), got {got}")


def _renorm_(weight: Tensor, flat: Tensor, max_norm: float, norm_type: float) -> None:
    """PyTorch's ``max_norm``: rescale, in place, the referenced rows whose norm exceeds ``max_norm``."""
    with no_grad():
        rows = weight.detach().index_select(0, flat)
        norms = rows.norm(norm_type, 1, keepdim=True)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), norms * 0 + 1)
        weight[flat] = rows * scale


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Rows of ``weight`` picked by the integer ``input``: output shape ``input.shape + (embedding_dim,)``.

    ``padding_idx``: that row receives no gradient. ``max_norm``: referenced rows are renormalised in place
    first. ``scale_grad_by_freq``: gradients are divided by each index's count in the batch. ``sparse`` is
    accepted for compatibility; gradients are always dense.
    """
    _check_indices(input, "embedding")
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-d (num_embeddings, embedding_dim), got {weight.shape}")
    num = weight.shape[0]
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise FlowError(f"embedding: padding_idx {padding_idx} out of range for {num} embeddings")
        padding_idx %= num
    flat = input.reshape(-1)
    if flat.dtype.name != "int64":
        flat = flat.long()
    check_index_range(flat, 0, num, f"embedding of {num} rows")  # as PyTorch: no negative indices
    if max_norm is not None:
        _renorm_(weight, flat, max_norm, norm_type)
    out = weight.index_select(0, flat)
    if out.requires_grad:
        if scale_grad_by_freq:
            counts = zeros(num, dtype=out.dtype, device=out.device).index_add(
                0, flat, ones(flat.shape[0], dtype=out.dtype, device=out.device)
            )
            inv = counts.index_select(0, flat).reciprocal().unsqueeze(1)
            out = out.detach() + (out - out.detach()) * inv  # same values, gradient / frequency
        if padding_idx is not None:
            out = where((flat == padding_idx).unsqueeze(1), out.detach(), out)
    return out.reshape(tuple(input.shape) + (weight.shape[1],))


def _bag_layout(input: Tensor, offsets: Tensor | None, include_last_offset: bool):
    """``(positions (B, L) int64, valid (B, L) bool)`` on the input's device."""
    device = input.device
    if input.ndim == 2:
        if offsets is not None:
            raise FlowError("embedding_bag: offsets must be None when the input is 2-d (one bag per row)")
        b, length = input.shape
        pos = arange(b * length, device=device).reshape(b, length)
        return pos, ones(b, length, dtype="bool", device=device)
    if input.ndim != 1:
        raise ShapeError(f"embedding_bag: input must be 1-d (with offsets) or 2-d, got shape {input.shape}")
    if offsets is None or offsets.ndim != 1:
        raise FlowError("embedding_bag: a 1-d input needs 1-d offsets (the start of each bag)")
    starts = offsets.to("cpu").numpy().astype(np.int64)  # the offsets decide the output's shape: host ints
    n = input.shape[0]
    ends = np.append(starts[1:], n) if starts.size else starts
    if include_last_offset:
        starts, ends = starts[:-1], starts[1:]
    if ((starts < 0) | (ends > n) | (starts > ends)).any():
        raise FlowError(
            f"embedding_bag: offsets {starts.tolist()} must be non-decreasing and within the input length {n}"
        )
    lengths = ends - starts
    length = max(int(lengths.max()) if lengths.size else 0, 1)
    steps = np.arange(length)
    pos = np.minimum(starts[:, None] + steps[None, :], max(n - 1, 0))
    valid = steps[None, :] < lengths[:, None]
    return tensor(pos, dtype="int64", device=device), tensor(valid, dtype="bool", device=device)


def embedding_bag(
    input: Tensor,
    weight: Tensor,
    offsets: Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> Tensor:
    """Sum, mean or max of embedding bags, without materialising the per-index embeddings per bag.

    A 2-d input is one bag per row; a 1-d input is split by ``offsets``. Entries equal to ``padding_idx``
    are left out (and not counted by ``mean``); an empty bag gives zeros.
    """
    _check_indices(input, "embedding_bag")
    if mode not in ("sum", "mean", "max"):
        raise FlowError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if per_sample_weights is not None and mode != "sum":
        raise FlowError(f"embedding_bag: per_sample_weights is only supported with mode='sum', got {mode!r}")
    if scale_grad_by_freq and mode == "max":
        raise FlowError("embedding_bag: scale_grad_by_freq is not supported with mode='max'")
    pos, valid = _bag_layout(input, offsets, include_last_offset)
    b, length = pos.shape
    flat_in = input.reshape(-1)
    idx = flat_in.index_select(0, pos.reshape(-1)) if flat_in.shape[0] else pos.reshape(-1) * 0
    if padding_idx is not None:
        num = weight.shape[0]
        if not -num <= padding_idx < num:
            raise FlowError(f"embedding_bag: padding_idx {padding_idx} out of range for {num} embeddings")
        valid = valid & (idx.reshape(b, length) != padding_idx % num)
    rows = embedding(idx, weight, None, max_norm, norm_type, scale_grad_by_freq).reshape(b, length, weight.shape[1])
    mask = valid.unsqueeze(2)
    if mode == "max":
        filled = where(mask, rows, -math.inf)
        best = filled.gather(1, filled.argmax(1, keepdim=True)).squeeze(1)
        return where(valid.any(1, keepdim=True), best, 0.0)
    if per_sample_weights is not None:
        if per_sample_weights.shape != tuple(input.shape):
            raise ShapeError(
                f"embedding_bag: per_sample_weights has shape {per_sample_weights.shape}, "
                f"expected the input's {tuple(input.shape)}"
            )
        w = per_sample_weights.reshape(-1).index_select(0, pos.reshape(-1)).reshape(b, length, 1)
        rows = rows * w
    total = where(mask, rows, 0.0).sum(1)
    if mode == "sum":
        return total
    count = valid.sum(1, keepdim=True).to(total.dtype).clamp(min=1.0)
    return total / count


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """``(..., num_classes)`` int64 one-hot encoding (``num_classes=-1``: the largest value + 1)."""
    _check_indices(tensor, "one_hot")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise FlowError("one_hot: can not infer num_classes from an empty tensor; pass num_classes")
        num_classes = int(tensor.max().item()) + 1
    if tensor.numel() and (int(tensor.min().item()) < 0 or int(tensor.max().item()) >= num_classes):
        raise FlowError(f"one_hot: class values must be in [0, {num_classes}); got values outside that range")
    classes = arange(num_classes, device=tensor.device)
    return (tensor.long().unsqueeze(-1) == classes).long()


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim`` (initialised N(0, 1))::

    emb = nn.Embedding(1000, 64, padding_idx=0)
    vectors = emb(token_ids)            # (..., 64)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        _freeze: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FlowError(f"Embedding: {name} must be an int >= 0, got {value!r}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise FlowError(
                    f"Embedding: padding_idx {padding_idx} must be within num_embeddings ({num_embeddings})"
                )
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = Parameter(
                empty(num_embeddings, embedding_dim, device=device, dtype=dtype), requires_grad=not _freeze
            )
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ShapeError(
                    f"Embedding: _weight has shape {tuple(_weight.shape)}, expected {(num_embeddings, embedding_dim)}"
                )
            self.weight = Parameter(_weight.detach().clone(), requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        """N(0, 1) weights; the padding row zero."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, input: Tensor) -> Tensor:
        return embedding(
            input,
            self.weight,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        if self.sparse:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        """An ``Embedding`` holding a copy of the 2-d ``embeddings`` (frozen by default)."""
        if embeddings.ndim != 2:
            raise ShapeError(f"Embedding.from_pretrained: embeddings must be 2-d, got shape {embeddings.shape}")
        rows, cols = embeddings.shape
        return cls(
            rows,
            cols,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            _weight=embeddings,
            _freeze=freeze,
        )


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (``mode='mean'`` by default)::

    bag = nn.EmbeddingBag(1000, 32, mode="sum")
    out = bag(ids, offsets)             # ids 1-d, offsets the start of each bag -> (bags, 32)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if mode not in ("sum", "mean", "max"):
            raise FlowError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise FlowError(
                    f"EmbeddingBag: padding_idx {padding_idx} must be within num_embeddings ({num_embeddings})"
                )
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
            self.reset_parameters()
        else:
            self.weight = Parameter(_weight.detach().clone())

    def reset_parameters(self) -> None:
        """N(0, 1) weights; the padding row zero."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, input: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None) -> Tensor:
        return embedding_bag(
            input,
            self.weight,
            offsets,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.mode,
            self.sparse,
            per_sample_weights,
            self.include_last_offset,
            self.padding_idx,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        s += f", mode='{self.mode}'"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
    ) -> EmbeddingBag:
        """An ``EmbeddingBag`` holding a copy of the 2-d ``embeddings`` (frozen by default)."""
        if embeddings.ndim != 2:
            raise ShapeError(f"EmbeddingBag.from_pretrained: embeddings must be 2-d, got shape {embeddings.shape}")
        rows, cols = embeddings.shape
        bag = cls(
            rows,
            cols,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            mode,
            sparse,
            embeddings,
            include_last_offset,
            padding_idx,
        )
        bag.weight.requires_grad_(not freeze)
        return bag
