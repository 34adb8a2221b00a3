"""``nn.utils.rnn``: batching variable-length sequences."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import FlowError, ShapeError
from ...tensor import Tensor, stack
from ...tensor.shape import pad


def pad_sequence(sequences: Sequence[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of shapes ``(L_i, *)`` into one ``(L_max, B, *)`` tensor (``(B, L_max, *)`` with
    ``batch_first``), filling the missing steps with ``padding_value`` after each sequence (``padding_side=
    "right"``) or before it (``"left"``). Differentiable with respect to the sequences."""
    if padding_side not in ("right", "left"):
        raise FlowError(f"pad_sequence: padding_side must be 'right' or 'left', got {padding_side!r}")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    sequences = list(sequences)
    if not sequences:
        raise FlowError("pad_sequence: sequences is empty; pass a list of at least one (L_i, *) tensor")
    for i, s in enumerate(sequences):
        if not isinstance(s, Tensor) or s.ndim == 0:
            raise FlowError(f"pad_sequence: sequences[{i}] must be a Tensor of shape (L_i, *), got "
                            f"{type(s).__name__ if not isinstance(s, Tensor) else 'a 0-d tensor'}")
        if s.shape[1:] != sequences[0].shape[1:]:
            raise ShapeError(f"pad_sequence: sequences[{i}] has trailing shape {s.shape[1:]}, but sequences[0] has "
                             f"{sequences[0].shape[1:]}; all sequences must agree after the first dim")
    longest = max(s.shape[0] for s in sequences)
    trailing = [0, 0] * (sequences[0].ndim - 1)
    padded = []
    for s in sequences:
        missing = longest - s.shape[0]
        widths = [0, missing] if padding_side == "right" else [missing, 0]
        padded.append(pad(s, trailing + widths, value=padding_value) if missing else s)
    return stack(padded, dim=0 if batch_first else 1)
