"""Loss functions with PyTorch's names, arguments, defaults and formulas: functional forms (``F.mse_loss``
...) and modules (``nn.MSELoss`` ...).

Every loss takes ``reduction`` in ``'mean' | 'sum' | 'none'`` (``kl_div`` also ``'batchmean'``) and, like
PyTorch, the deprecated ``size_average``/``reduce`` pair. All of them are composed from tensor ops, so
they run and differentiate on every backend. ``ctc_loss`` runs the CTC forward algorithm in log space,
one vectorised step per time step over the whole batch and every extended-label position; its gradient
comes from autograd.

    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    loss = loss_fn(logits, targets)      # logits (N, C), targets (N,) class indices
    loss.backward()
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import FlowError, ShapeError
from ..tensor import Tensor, arange, cat, full, maximum, minimum, softplus, tensor, where
from .module import Module

__all__ = [
    "BCELoss", "BCEWithLogitsLoss", "CTCLoss", "CosineEmbeddingLoss", "CrossEntropyLoss", "FocalLoss",
    "GaussianNLLLoss", "HingeEmbeddingLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss",
    "MarginRankingLoss", "NLLLoss", "PoissonNLLLoss", "SmoothL1Loss", "TripletMarginLoss",
]
__functional__ = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cosine_similarity",
    "cross_entropy", "ctc_loss", "gaussian_nll_loss", "hinge_embedding_loss", "huber_loss", "kl_div",
    "l1_loss", "margin_ranking_loss", "mse_loss", "nll_loss", "pairwise_distance", "poisson_nll_loss",
    "sigmoid_focal_loss", "smooth_l1_loss", "triplet_margin_loss",
]

_REDUCTIONS = ("mean", "sum", "none")


# ---------------------------------------------------------------------- shared helpers
def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    """PyTorch's rule for the deprecated ``size_average``/``reduce`` arguments."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def _reduce(loss: Tensor, reduction: str, where_: str) -> Tensor:
    """Apply ``reduction`` to an elementwise loss."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise FlowError(f"{where_}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _check_reduction(reduction: str, where_: str, extra: tuple[str, ...] = ()) -> None:
    if reduction not in _REDUCTIONS + extra:
        raise FlowError(f"{where_}: reduction must be one of {_REDUCTIONS + extra}, got {reduction!r}")


def _check_same_shape(input: Tensor, target: Tensor, where_: str) -> None:
    if tuple(input.shape) != tuple(target.shape):
        raise ShapeError(
            f"{where_}: target shape {tuple(target.shape)} differs from input shape {tuple(input.shape)}; "
            "give both the same shape"
        )


def _as_tensor_like(value, like: Tensor, dtype=None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return tensor(value, dtype=dtype or like.dtype, device=like.device)


def _clamp_min_keep_grad(x: Tensor, minimum_value: float) -> Tensor:
    """``x`` clamped below at ``minimum_value`` in value while the gradient flows as if unclamped.

    This is what PyTorch gets from ``clamp_min_`` under ``no_grad`` on a tensor that is part of a graph
    (``cosine_similarity``'s norms, ``gaussian_nll_loss``'s variance).
    """
    xd = x.detach()
    return x + (xd.clamp(min=minimum_value) - xd)


# ---------------------------------------------------------------------- regression losses
def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean"
             ) -> Tensor:
    """Mean squared error ``(input - target)^2``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    d = input - target
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """Mean absolute error ``|input - target|``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _reduce((input - target).abs(), reduction, "l1_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> Tensor:
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``beta=0`` is the L1 loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise FlowError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    loss = where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce(loss, reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``."""
    if delta <= 0:
        raise FlowError(f"huber_loss: delta must be > 0, got {delta}")
    d = (input - target).abs()
    loss = where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta)
    return _reduce(loss, reduction, "huber_loss")


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,
                     size_average=None, eps: float = 1e-8, reduce=None, reduction: str = "mean") -> Tensor:
    """Poisson negative log likelihood: ``exp(input) - target * input`` (``log_input``) or
    ``input - target * log(input + eps)``; ``full`` adds Stirling's term for targets > 1."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        safe = where(target > 1, target, 1.0)
        stirling = safe * safe.log() - safe + 0.5 * (safe * (2 * math.pi)).log()
        loss = loss + where(target > 1, stirling, 0.0)
    return _reduce(loss, reduction, "poisson_nll_loss")


def gaussian_nll_loss(input: Tensor, target: Tensor, var: Tensor, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """Gaussian negative log likelihood ``0.5 (log(var) + (input - target)^2 / var)`` (+ ``0.5 log(2 pi)``
    with ``full``); ``var`` is clamped below at ``eps`` (gradient passes through, as in PyTorch)."""
    if isinstance(var, (int, float)):
        var = full(input.shape, float(var), dtype=input.dtype, device=input.device)
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape:
            var = var.unsqueeze(-1)
        elif not (input.shape[:-1] == var.shape[:-1] and var.shape[-1:] == (1,)):
            raise ShapeError(
                f"gaussian_nll_loss: var has shape {tuple(var.shape)}, input {tuple(input.shape)}; var must "
                "have the input's shape, or it with the last dim 1 or dropped (homoscedastic)"
            )
    if bool((var < 0).any()):
        raise FlowError("gaussian_nll_loss: var has negative entries; variances must be >= 0")
    var = _clamp_min_keep_grad(var, eps)
    d = input - target
    loss = 0.5 * (var.log() + d * d / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction, "gaussian_nll_loss")


# ---------------------------------------------------------------------- classification losses
def _class_weight_per_target(weight: Tensor | None, safe_target: Tensor) -> Tensor | None:
    return None if weight is None else weight[safe_target]


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log likelihood of class indices: ``-weight[t] * input[n, t]`` with the class dim 1.

    ``input`` is ``(N, C)``, ``(N, C, d1, ...)`` or ``(C,)``; ``target`` holds class indices of shape
    ``(N,)``, ``(N, d1, ...)`` or ``()``. Targets equal to ``ignore_index`` contribute nothing, and the
    mean divides by the sum of the weights of the targets not ignored (PyTorch's weighted mean).
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "nll_loss")
    if input.ndim < 1:
        raise ShapeError("nll_loss: input must have a class dimension; got a 0-d tensor")
    unbatched = input.ndim == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.unsqueeze(0)
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ShapeError(
            f"nll_loss: input of shape {tuple(input.shape)} (class dim 1) needs a target of shape "
            f"{expected}, got {tuple(target.shape)}"
        )
    if target.dtype.is_floating_point:
        raise FlowError("nll_loss: target must hold integer class indices (int64); got a floating tensor")
    ignored = target == ignore_index
    safe = where(ignored, 0, target)
    picked = -input.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = _class_weight_per_target(weight, safe)
    w = where(ignored, 0.0, 1.0).to(input.dtype) if w is None else where(ignored, 0.0, w)
    loss = picked * w
    if reduction == "none":
        return loss.squeeze(0) if unbatched else loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy between logits ``input`` (class dim 1) and ``target``.

    ``target`` is either class indices (integer, shape ``input.shape`` without dim 1) or class
    probabilities (floating, same shape as ``input``). Options as in PyTorch: per-class ``weight``,
    ``ignore_index`` (indices only), ``label_smoothing`` in [0, 1].
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise FlowError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    class_dim = 0 if input.ndim == 1 else 1
    n_classes = input.shape[class_dim]
    logp = input.log_softmax(class_dim)
    wshape = [1] * input.ndim
    wshape[class_dim] = n_classes
    w_b = None if weight is None else weight.reshape(wshape)
    if target.dtype.is_floating_point:  # class probabilities
        _check_same_shape(input, target, "cross_entropy (probability targets)")
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / n_classes
        prod = logp * target if w_b is None else logp * target * w_b
        if reduction == "none":
            return -prod.sum(class_dim)
        if reduction == "sum":
            return -prod.sum()
        return -prod.sum() / (input.numel() // n_classes if input.numel() else float("nan"))
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing == 0:
        return nll
    ignored = target == ignore_index
    smooth = -(logp if w_b is None else logp * w_b).sum(class_dim)
    smooth = where(ignored, 0.0, smooth)
    if reduction == "mean":
        if weight is None:
            denom = (~ignored).sum()
        else:
            denom = where(ignored, 0.0, weight[where(ignored, 0, target)]).sum()
        smooth = smooth.sum() / denom
    elif reduction == "sum":
        smooth = smooth.sum()
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / n_classes)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                         reduce=None, reduction: str = "mean") -> Tensor:
    """Binary cross entropy of probabilities: ``-w (t log(x) + (1 - t) log(1 - x))``, each log clamped
    at -100 as in PyTorch (so a probability of exactly 0 or 1 gives a finite loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_shape(input, target, "binary_cross_entropy")
    log_x = input.log().clamp(min=-100.0)
    log_1mx = (1.0 - input).log().clamp(min=-100.0)
    loss = -(target * log_x + (1.0 - target) * log_1mx)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """Sigmoid + binary cross entropy in one stable expression:
    ``(1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)``, times ``weight``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_shape(input, target, "binary_cross_entropy_with_logits")
    sp = softplus(-input)
    if pos_weight is None:
        loss = (1.0 - target) * input + sp
    else:
        loss = (1.0 - target) * input + ((pos_weight - 1.0) * target + 1.0) * sp
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def sigmoid_focal_loss(inputs: Tensor, targets: Tensor, alpha: float = 0.25, gamma: float = 2.0,
                       reduction: str = "none") -> Tensor:
    """Focal loss of RetinaNet (torchvision's ``sigmoid_focal_loss``, same formula and defaults):
    ``alpha_t (1 - p_t)^gamma BCEWithLogits(x, t)``; ``alpha < 0`` disables the class weighting."""
    p = inputs.sigmoid()
    ce = binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1.0 - p) * (1.0 - targets)
    loss = ce * (1.0 - p_t) ** gamma
    if alpha >= 0:
        loss = (alpha * targets + (1.0 - alpha) * (1.0 - targets)) * loss
    return _reduce(loss, reduction, "sigmoid_focal_loss")


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence with ``input`` as log-probabilities: ``target (log(target) - input)``
    (``0`` where ``target == 0``), or ``exp(t) (t - input)`` with ``log_target``.
    ``reduction='batchmean'`` divides the sum by the batch size (the mathematically right KL)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "kl_div", ("batchmean",))
    if log_target:
        loss = target.exp() * (target - input)
    else:
        positive = target > 0
        xlogy = where(positive, target * where(positive, target, 1.0).log(), 0.0)
        loss = xlogy - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction, "kl_div")


# ---------------------------------------------------------------------- embedding / ranking losses
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine similarity along ``dim``: ``<x1/max(|x1|, eps), x2/max(|x2|, eps)>`` (PyTorch's stable form)."""
    n1 = _clamp_min_keep_grad(x1.norm(2, dim, keepdim=True), eps)
    n2 = _clamp_min_keep_grad(x2.norm(2, dim, keepdim=True), eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
                      ) -> Tensor:
    """The p-norm of ``x1 - x2 + eps`` over the last dimension."""
    return (x1 - x2 + eps).norm(p, -1, keepdim=keepdim)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target == 1``, ``max(0, cos(x1, x2) - margin)`` where ``target == -1``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    dim = target.ndim
    prod = (input1 * input2).sum(dim)
    mag1 = (input1 * input1).sum(dim) + 1e-12
    mag2 = (input2 * input2).sum(dim) + 1e-12
    cos = prod / (mag1 * mag2).sqrt()
    pos = 1.0 - cos
    neg = (cos - margin).clamp(min=0.0)
    loss = where(target == 1, pos, 0.0) + where(target == -1, neg, 0.0)
    return _reduce(loss, reduction, "cosine_embedding_loss")


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
    """``x`` where ``target == 1``, ``max(0, margin - x)`` where ``target == -1``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    margin_clamp = (margin - input).clamp(min=0.0)
    loss = where(target != 1, margin_clamp, 0.0) + where(target != -1, input, 0.0)
    return _reduce(loss, reduction, "hinge_embedding_loss")


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``max(0, -target (input1 - input2) + margin)``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = (-target * (input1 - input2) + margin).clamp(min=0.0)
    return _reduce(loss, reduction, "margin_ranking_loss")


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0,
                        p: float = 2.0, eps: float = 1e-6, swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean") -> Tensor:
    """``max(d(a, p) - d(a, n) + margin, 0)`` with ``d`` the pairwise p-distance; ``swap`` uses
    ``min(d(a, n), d(p, n))`` as the negative distance (Balntas et al.)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if margin <= 0:
        raise FlowError(f"triplet_margin_loss: margin must be > 0, got {margin}")
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    loss = (d_pos - d_neg + margin).clamp(min=0.0)
    return _reduce(loss, reduction, "triplet_margin_loss")


# ---------------------------------------------------------------------- CTC
def _lengths(value, n: int, like: Tensor, name: str) -> Tensor:
    t = value if isinstance(value, Tensor) else tensor(list(value) if isinstance(value, Sequence) else value,
                                                       device=like.device)
    t = t.to(like.device).long().reshape(-1)
    if t.shape[0] != n:
        raise ShapeError(f"ctc_loss: {name} must have one entry per batch element ({n}), got {t.shape[0]}")
    return t


def _logaddexp3(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """``log(exp(a) + exp(b) + exp(c))`` whose value is -inf and whose gradient is 0 where all are -inf."""
    m = maximum(maximum(a, b), c).detach()
    finite = m.isfinite()
    m = where(finite, m, 0.0)
    s = (a - m).exp() + (b - m).exp() + (c - m).exp()
    return where(finite, where(finite, s, 1.0).log() + m, float("-inf"))


def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths, target_lengths, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """Connectionist Temporal Classification loss (Graves et al. 2006), PyTorch's interface.

    ``log_probs`` ``(T, N, C)`` (or ``(T, C)``) are log-probabilities (``log_softmax`` output);
    ``targets`` are padded ``(N, S)`` or concatenated 1-d; ``input_lengths`` and ``target_lengths`` give
    each sample's lengths. ``reduction='mean'`` divides each loss by its target length, then averages.
    ``zero_infinity`` replaces impossible alignments' infinite losses (and their gradients) by zero.

    The forward algorithm runs in log space: one vectorised update per time step over the batch and all
    ``2S+1`` extended-label positions. Note that PyTorch's own backward returns the gradient with respect
    to the logits of a ``log_softmax`` (it adds ``exp(log_probs)``); through ``log_softmax`` both agree.
    """
    _check_reduction(reduction, "ctc_loss")
    unbatched = log_probs.ndim == 2
    if unbatched:
        log_probs = log_probs.unsqueeze(1)
        targets = targets.unsqueeze(0) if targets.ndim == 1 else targets
    if log_probs.ndim != 3:
        raise ShapeError(f"ctc_loss: log_probs must be (T, N, C) or (T, C), got {tuple(log_probs.shape)}")
    T, N, C = log_probs.shape
    if not 0 <= blank < C:
        raise FlowError(f"ctc_loss: blank={blank} is not a class index of the {C} classes")
    in_len = _lengths(input_lengths, N, log_probs, "input_lengths")
    tg_len = _lengths(target_lengths, N, log_probs, "target_lengths")
    targets = targets.to(log_probs.device).long()
    if targets.ndim == 1:  # concatenated targets: pad into (N, S)
        lens = tg_len.tolist()
        S = max(lens) if lens else 0
        starts = [sum(lens[:i]) for i in range(N)]
        last = max(targets.shape[0] - 1, 0)
        idx = tensor([[min(starts[i] + j, last) for j in range(S)] for i in range(N)], dtype=tg_len.dtype,
                     device=log_probs.device).reshape(N, S)
        targets = targets[idx] if S else idx
    S = targets.shape[1]
    if bool((in_len > T).any()):
        raise FlowError(f"ctc_loss: an input length exceeds the {T} time steps of log_probs")
    if bool((tg_len > S).any()):
        raise FlowError(f"ctc_loss: a target length exceeds the {S} columns of targets")
    dev, dt = log_probs.device, log_probs.dtype
    L = 2 * S + 1
    pos = arange(L, device=dev)
    in_target = pos.unsqueeze(0) < (2 * tg_len + 1).unsqueeze(1)  # (N, L): positions inside this sample
    label_at = (pos // 2).clamp(max=max(S - 1, 0)).unsqueeze(0).expand(N, L)
    ext = where(pos.unsqueeze(0) % 2 == 1, targets.gather(1, label_at) if S else label_at * 0 + blank, blank)
    ext = where(in_target, ext, blank)  # (N, L) extended labels: blank, l1, blank, l2, ..., blank
    # the s-2 transition: allowed into a non-blank label that differs from the label two positions back
    prev2 = cat([full((N, 2), blank, dtype=ext.dtype, device=dev), ext[:, :-2]], 1)
    skip_ok = (pos.unsqueeze(0) % 2 == 1) & (ext != prev2) & (pos.unsqueeze(0) >= 2)
    neg_inf = float("-inf")
    skip_bias = where(skip_ok, 0.0, neg_inf).to(dt)
    outside = where(in_target, 0.0, neg_inf).to(dt)
    lp_ext = log_probs.gather(2, ext.unsqueeze(0).expand(T, N, L)) + outside  # (T, N, L)
    start = where(pos < 2, 0.0, neg_inf).to(dt).unsqueeze(0)
    alpha = lp_ext[0] + start
    pad1 = full((N, 1), neg_inf, dtype=dt, device=dev)
    pad2 = full((N, 2), neg_inf, dtype=dt, device=dev)
    active = arange(T, device=dev).unsqueeze(1) < in_len.unsqueeze(0)  # (T, N)
    for t in range(1, T):
        shift1 = cat([pad1, alpha[:, :-1]], 1)
        shift2 = cat([pad2, alpha[:, :-2]], 1) + skip_bias
        new = _logaddexp3(alpha, shift1, shift2) + lp_ext[t]
        alpha = where(active[t].unsqueeze(1), new, alpha)
    last = (2 * tg_len).unsqueeze(1)
    end_a = alpha.gather(1, last).squeeze(1)
    end_b = where(tg_len > 0, alpha.gather(1, (last - 1).clamp(min=0)).squeeze(1), neg_inf)
    m = maximum(end_a, end_b).detach()
    finite = m.isfinite()
    m = where(finite, m, 0.0)
    s = (end_a - m).exp() + (end_b - m).exp()
    loss = -where(finite, where(finite, s, 1.0).log() + m, neg_inf)
    if bool((in_len == 0).any()):  # no frames: only an empty target is possible
        loss = where(in_len == 0, where(tg_len == 0, 0.0, float("inf")), loss)
    if zero_infinity:
        loss = where(loss.isinf(), 0.0, loss)
    if reduction == "mean":
        return (loss / tg_len.clamp(min=1).to(dt)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss.squeeze(0) if unbatched else loss


# ---------------------------------------------------------------------- modules
class _Loss(Module):
    """Base of the loss modules: holds ``reduction`` (with PyTorch's legacy arguments resolved)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _legacy_reduction(size_average, reduce, reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class _WeightedLoss(_Loss):
    """A loss with an optional per-class ``weight`` buffer (in ``state_dict`` as PyTorch keeps it)."""

    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean"
                 ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class MSELoss(_Loss):
    """Mean squared error (``F.mse_loss``)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """Mean absolute error (``F.l1_loss``)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1 loss with threshold ``beta`` (``F.smooth_l1_loss``)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Huber loss with threshold ``delta`` (``F.huber_loss``)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class NLLLoss(_WeightedLoss):
    """Negative log likelihood of class indices (``F.nll_loss``)."""

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy of logits against class indices or class probabilities (``F.cross_entropy``)."""

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities (``F.binary_cross_entropy``)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid + binary cross entropy, stable (``F.binary_cross_entropy_with_logits``)."""

    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean",
                 pos_weight: Tensor | None = None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                pos_weight=self.pos_weight)


class FocalLoss(_Loss):
    """Sigmoid focal loss (RetinaNet; torchvision's formula) as a module; ``reduction`` defaults to
    ``'mean'`` like every loss module (functional ``sigmoid_focal_loss`` keeps torchvision's ``'none'``)."""

    def __init__(self, alpha: float = 0.25, gamma: float = 2.0, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        self.alpha = alpha
        self.gamma = gamma

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return sigmoid_focal_loss(input, target, self.alpha, self.gamma, self.reduction)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence of log-probability inputs (``F.kl_div``)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False
                 ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class CTCLoss(_Loss):
    """Connectionist Temporal Classification loss (``F.ctc_loss``)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False) -> None:
        super().__init__(reduction=reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths, target_lengths) -> Tensor:
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
                        self.zero_infinity)


class PoissonNLLLoss(_Loss):
    """Poisson negative log likelihood (``F.poisson_nll_loss``)."""

    def __init__(self, log_input: bool = True, full: bool = False, size_average=None, eps: float = 1e-8,
                 reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_input = log_input
        self.full = full
        self.eps = eps

    def forward(self, log_input: Tensor, target: Tensor) -> Tensor:
        return poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps,
                                reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    """Gaussian negative log likelihood with predicted variance (``F.gaussian_nll_loss``)."""

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        self.full = full
        self.eps = eps

    def forward(self, input: Tensor, target: Tensor, var: Tensor) -> Tensor:
        return gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class CosineEmbeddingLoss(_Loss):
    """Cosine embedding loss with ``margin`` (``F.cosine_embedding_loss``)."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
    """Hinge embedding loss with ``margin`` (``F.hinge_embedding_loss``)."""

    def __init__(self, margin: float = 1.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)


class MarginRankingLoss(_Loss):
    """Margin ranking loss (``F.margin_ranking_loss``)."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return margin_ranking_loss(input1, input2, target, self.margin, reduction=self.reduction)


class TripletMarginLoss(_Loss):
    """Triplet margin loss with p-distance (``F.triplet_margin_loss``)."""

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False,
                 size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin
        self.p = p
        self.eps = eps
        self.swap = swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                   reduction=self.reduction)

