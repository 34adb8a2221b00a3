"""Sampling from categorical distributions: ``multinomial``, PyTorch's semantics, on every backend.

Composed from the core ops (uniform samples, ``cumsum``, comparisons, ``topk``), so it runs on the device
that holds the probabilities and follows that device's seed (``fg.manual_seed``); the streams differ from
PyTorch's, the distributions do not.

* With replacement: inverse-CDF sampling. Each draw ``u`` uniform in ``[0, total)`` picks the first category
  whose cumulative weight exceeds ``u``; a category of weight 0 can never be picked.
* Without replacement: the exponential race (Efraimidis and Spirakis): each category gets the key
  ``w / E`` with ``E`` a standard exponential sample, and the ``num_samples`` largest keys are taken in order.
  This has exactly the law of drawing one category at a time and removing it. Categories of weight 0 come last
  (in random order), as in PyTorch, which also returns them once the others are used up.
"""

from __future__ import annotations

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, ShapeError
from .creation import arange, rand
from .dtype import float32, float64
from .elementwise import where
from .reduction import amax
from .tensor import Tensor

#: Elements of the (rows, samples, categories) comparison made per step of inverse-CDF sampling.
_CHUNK_ELEMENTS = 1 << 24


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002 - PyTorch's name
                generator: object = None) -> Tensor:
    """Indices sampled from the categorical distribution in each row of ``input``, as ``torch.multinomial``.

    ``input`` is 1-d (one distribution) or 2-d (one per row) of non-negative weights that need not sum to 1.
    Returns int64 indices of shape ``(num_samples,)`` or ``(rows, num_samples)``, on ``input``'s device.
    Without ``replacement`` no index repeats within a row, so ``num_samples`` is at most the number of
    categories. Weights that are negative, infinite or NaN, and a row whose weights sum to 0, raise
    ``FlowError`` (one host read checks them).

        next_token = fg.multinomial(probs, num_samples=1)      # (batch, 1), as in nanoGPT's sampling loop
    """
    if generator is not None:
        raise FlowError("multinomial: generator= is not supported; seed the device with fg.manual_seed(seed) "
                        "and pass generator=None")
    if not isinstance(input, Tensor):
        raise FlowError(f"multinomial: input must be a Tensor of weights, got {type(input).__name__}")
    if input.ndim not in (1, 2):
        raise ShapeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {input.shape}")
    if not input.dtype.is_floating_point:
        raise FlowError(f"multinomial: input must be a floating tensor of weights, got {input.dtype}; "
                        "convert with .float()")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
        raise FlowError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
    categories = input.shape[-1]
    if categories == 0:
        raise ShapeError("multinomial: the distribution has no categories (last dim of size 0)")
    if not replacement and num_samples > categories:
        raise FlowError(f"multinomial: cannot sample num_samples={num_samples} > {categories} categories without "
                        "replacement; pass replacement=True or fewer samples")
    with no_grad():
        w = input.detach()
        w = w.reshape(1, categories) if w.ndim == 1 else w
        work = float64 if w.dtype == float64 else float32  # half-precision weights are summed in float32
        w = w.to(work)
        _check_weights(w)
        out = _with_replacement(w, num_samples) if replacement else _without_replacement(w, num_samples)
    return out.reshape(num_samples) if input.ndim == 1 else out


def _check_weights(w: Tensor) -> None:
    """PyTorch's two checks, read back together in one host transfer."""
    bad = (w.isfinite().logical_not() | (w < 0)).any().reshape(1)
    empty = (w.sum(-1) <= 0).any().reshape(1)
    from .shape import cat

    invalid, zero_sum = cat([bad, empty]).tolist()
    if invalid:
        raise FlowError("multinomial: probability tensor contains either inf, nan or element < 0; pass finite, "
                        "non-negative weights (e.g. softmax output)")
    if zero_sum:
        raise FlowError("multinomial: invalid multinomial distribution (sum of probabilities <= 0): a row has "
                        "only zero weights")


def _with_replacement(w: Tensor, n: int) -> Tensor:
    rows, categories = w.shape
    cdf = w.cumsum(-1)
    total = cdf.narrow(1, categories - 1, 1)  # (rows, 1): the cumulative sum's own last value
    # The last category of non-zero weight: a draw rounding up to the total must not land on a zero weight.
    positions = arange(categories, device=w.device).reshape(1, categories)
    last = amax(where(w > 0, positions, -1), dim=-1, keepdim=True)
    step = max(1, _CHUNK_ELEMENTS // max(1, rows * categories))
    parts = []
    for start in range(0, n, step):
        count = min(step, n - start)
        u = rand(rows, count, dtype=w.dtype, device=w.device) * total  # (rows, count) in [0, total)
        below = (cdf.unsqueeze(1) <= u.unsqueeze(2)).sum(-1)  # categories passed: the index drawn
        parts.append(below.minimum(last))
    if len(parts) == 1:
        return parts[0]
    from .shape import cat

    return cat(parts, dim=1)


def _without_replacement(w: Tensor, n: int) -> Tensor:
    u = rand(*w.shape, dtype=w.dtype, device=w.device)
    e = (1 - u).log().neg()  # standard exponential samples in [0, inf)
    keys = where(w > 0, w / e, e.neg())  # zero weights: non-positive keys, in random order after the others
    from .extra import topk

    return topk(keys, n, dim=-1).indices
