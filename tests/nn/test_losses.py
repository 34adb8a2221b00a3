"""Loss functions and modules against PyTorch CPU (forward, input gradients; float32) and float64 gradchecks.

Tolerance: every torch comparison below uses rtol=1e-5, atol=1e-6 on float32 unless the case states its own
(CTC over 12 time steps: rtol=1e-4, atol=1e-5).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import functional as F
from flowgraph.nn import loss as loss_module

RTOL, ATOL = 1e-5, 1e-6
REDUCTIONS = ["mean", "sum", "none"]


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _softmax(a: np.ndarray, axis: int = 1) -> np.ndarray:
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _log_softmax(a: np.ndarray, axis: int = 1) -> np.ndarray:
    return np.log(_softmax(a, axis))


# ---------------------------------------------------------------------- input makers
# Each returns (arrays, indices of arrays that get gradients). Float arrays are float32.
def _pair(shape=(4, 5), scale=1.0, seed=0):
    r = _rng(seed)
    return [(r.standard_normal(shape) * scale).astype(np.float32),
            (r.standard_normal(shape) * scale).astype(np.float32)], (0, 1)


def _class_indices(shape=(6, 5), extra=(), ignore=None, seed=0):
    r = _rng(seed)
    n, c = shape
    x = r.standard_normal((n, c) + extra).astype(np.float32)
    t = r.integers(0, c, (n,) + extra).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return [x, t], (0,)


def _class_probs(shape=(6, 5), extra=(), seed=0):
    r = _rng(seed)
    x = r.standard_normal(shape + extra).astype(np.float32)
    p = _softmax(r.standard_normal(shape + extra) * 2).astype(np.float32)
    return [x, p], (0, 1)


def _log_probs_targets(ignore=None, extra=(), seed=0):
    arrays, _ = _class_indices(extra=extra, ignore=ignore, seed=seed)
    arrays[0] = _log_softmax(arrays[0]).astype(np.float32)
    return arrays, (0,)


def _probabilities(shape=(4, 3), seed=0):
    r = _rng(seed)
    x = (1 / (1 + np.exp(-r.standard_normal(shape) * 2))).astype(np.float32)
    y = r.uniform(0, 1, shape).astype(np.float32)
    y.reshape(-1)[::4] = 1.0
    y.reshape(-1)[1::4] = 0.0
    return [x, y], (0, 1)


def _logits_targets(shape=(4, 3), seed=0):
    r = _rng(seed)
    x = (r.standard_normal(shape) * 3).astype(np.float32)
    y = r.uniform(0, 1, shape).astype(np.float32)
    y.reshape(-1)[::3] = 1.0
    return [x, y], (0, 1)


def _binary_logits(shape=(4, 3), seed=0):
    r = _rng(seed)
    return [(r.standard_normal(shape) * 2).astype(np.float32),
            r.integers(0, 2, shape).astype(np.float32)], (0,)


def _kl(log_target=False, zero=False, seed=0):
    r = _rng(seed)
    x = _log_softmax(r.standard_normal((4, 5))).astype(np.float32)
    p = _softmax(r.standard_normal((4, 5)) * 2)
    if zero:  # 0 * log(0) = 0 in the loss; torch's target gradient there is NaN, so only the input's is compared
        p[0, 0] = 0.0
    t = np.log(p) if log_target else p
    return [x, t.astype(np.float32)], (0,) if zero else (0, 1)


def _poisson(log_input=True, target_grad=True, seed=0):
    r = _rng(seed)
    x = r.standard_normal((4, 5)).astype(np.float32)
    if not log_input:
        x = np.exp(x).astype(np.float32)
    t = r.integers(0, 6, (4, 5)).astype(np.float32)
    return [x, t], (0, 1) if target_grad else (0,)


def _gaussian(var_shape=(4, 3), seed=0):
    r = _rng(seed)
    return [r.standard_normal((4, 3)).astype(np.float32), r.standard_normal((4, 3)).astype(np.float32),
            r.uniform(0.2, 2.0, var_shape).astype(np.float32)], (0, 1, 2)


def _embedding_pair(seed=0):
    r = _rng(seed)
    t = np.where(r.uniform(size=6) > 0.5, 1.0, -1.0).astype(np.float32)
    return [r.standard_normal((6, 4)).astype(np.float32), r.standard_normal((6, 4)).astype(np.float32), t], (0, 1)


def _hinge(seed=0):
    r = _rng(seed)
    t = np.where(r.uniform(size=(4, 5)) > 0.5, 1.0, -1.0).astype(np.float32)
    return [r.standard_normal((4, 5)).astype(np.float32), t], (0,)


def _ranking(seed=0):
    r = _rng(seed)
    t = np.where(r.uniform(size=7) > 0.5, 1.0, -1.0).astype(np.float32)
    return [r.standard_normal(7).astype(np.float32), r.standard_normal(7).astype(np.float32), t], (0, 1)


def _triplet(seed=0):
    r = _rng(seed)
    return [r.standard_normal((5, 4)).astype(np.float32) for _ in range(3)], (0, 1, 2)


def _weight(n=5, seed=1):
    return _rng(seed).uniform(0.2, 2.0, n).astype(np.float32)


def _torch_focal(inputs, targets, alpha=0.25, gamma=2.0, reduction="mean"):
    """torchvision.ops.sigmoid_focal_loss, written out by hand (torchvision is not a dependency)."""
    p = torch.sigmoid(inputs)
    ce = TF.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


# (id, flowgraph module name, kwargs, maker, torch module factory or None for torch.nn.<same name>)
# Tensors among the kwargs are given as numpy arrays and converted for each side; module buffers are
# also copied through load_state_dict to check the names match.
MODULE_CASES = []


def _case(cid, name, kwargs, maker, torch_factory=None):
    for red in REDUCTIONS:
        MODULE_CASES.append(pytest.param(name, dict(kwargs, reduction=red), maker, torch_factory,
                                         id=f"{cid}-{red}"))


_case("mse", "MSELoss", {}, _pair)
_case("l1", "L1Loss", {}, _pair)
for _b in (1.0, 0.5, 0.0):
    _case(f"smoothl1-beta{_b}", "SmoothL1Loss", {"beta": _b}, lambda: _pair(scale=1.5))
for _d in (1.0, 0.3):
    _case(f"huber-delta{_d}", "HuberLoss", {"delta": _d}, lambda: _pair(scale=1.5))
_case("ce-indices", "CrossEntropyLoss", {}, _class_indices)
_case("ce-weight", "CrossEntropyLoss", {"weight": _weight()}, _class_indices)
_case("ce-ignore", "CrossEntropyLoss", {"ignore_index": -100}, lambda: _class_indices(ignore=-100))
_case("ce-ignore-class", "CrossEntropyLoss", {"ignore_index": 2, "weight": _weight()},
      lambda: _class_indices(ignore=2))
_case("ce-smoothing", "CrossEntropyLoss", {"label_smoothing": 0.1}, _class_indices)
_case("ce-smoothing-weight-ignore", "CrossEntropyLoss",
      {"label_smoothing": 0.2, "weight": _weight(), "ignore_index": 1}, lambda: _class_indices(ignore=1))
_case("ce-kdim", "CrossEntropyLoss", {"ignore_index": 0}, lambda: _class_indices(extra=(3, 2), ignore=0))
_case("ce-kdim-smoothing-weight", "CrossEntropyLoss", {"label_smoothing": 0.3, "weight": _weight()},
      lambda: _class_indices(extra=(3,)))
_case("ce-probs", "CrossEntropyLoss", {}, _class_probs)
_case("ce-probs-smoothing-weight", "CrossEntropyLoss", {"label_smoothing": 0.15, "weight": _weight()},
      _class_probs)
_case("ce-probs-kdim", "CrossEntropyLoss", {}, lambda: _class_probs(extra=(2, 3)))
_case("nll", "NLLLoss", {}, _log_probs_targets)
_case("nll-weight-ignore", "NLLLoss", {"weight": _weight(), "ignore_index": 3}, lambda: _log_probs_targets(3))
_case("nll-kdim", "NLLLoss", {"weight": _weight()}, lambda: _log_probs_targets(extra=(2, 2)))
_case("bce", "BCELoss", {}, _probabilities)
_case("bce-weight", "BCELoss", {"weight": _weight(3)}, _probabilities)
_case("bcelogits", "BCEWithLogitsLoss", {}, _logits_targets)
_case("bcelogits-weight-posweight", "BCEWithLogitsLoss", {"weight": _weight(3), "pos_weight": _weight(3, 2)},
      _logits_targets)
_case("kl", "KLDivLoss", {}, _kl)
_case("kl-zero-target", "KLDivLoss", {}, lambda: _kl(zero=True))
_case("kl-logtarget", "KLDivLoss", {"log_target": True}, lambda: _kl(True))
_case("poisson", "PoissonNLLLoss", {}, _poisson)
# with full=True torch's target gradient is NaN where target <= 1 (log(0) in the masked Stirling term)
_case("poisson-full", "PoissonNLLLoss", {"full": True}, lambda: _poisson(target_grad=False))
_case("poisson-linear-full", "PoissonNLLLoss", {"log_input": False, "full": True},
      lambda: _poisson(False, target_grad=False))
_case("gaussian", "GaussianNLLLoss", {}, _gaussian)
_case("gaussian-full-homosc", "GaussianNLLLoss", {"full": True}, lambda: _gaussian((4,)))
_case("gaussian-lastdim1", "GaussianNLLLoss", {}, lambda: _gaussian((4, 1)))
for _m in (0.0, 0.3):
    _case(f"cosemb-margin{_m}", "CosineEmbeddingLoss", {"margin": _m}, _embedding_pair)
for _m in (1.0, 0.5):
    _case(f"hinge-margin{_m}", "HingeEmbeddingLoss", {"margin": _m}, _hinge)
for _m in (0.0, 0.2):
    _case(f"ranking-margin{_m}", "MarginRankingLoss", {"margin": _m}, _ranking)
_case("triplet", "TripletMarginLoss", {}, _triplet)
_case("triplet-p1-swap", "TripletMarginLoss", {"p": 1.0, "swap": True, "margin": 2.0}, _triplet)
_case("triplet-p3-eps", "TripletMarginLoss", {"p": 3.0, "eps": 1e-3, "margin": 0.5}, _triplet)
_case("focal", "FocalLoss", {}, _binary_logits,
      lambda reduction, **kw: (lambda x, y: _torch_focal(x, y, reduction=reduction, **kw)))
_case("focal-soft-alpha-gamma", "FocalLoss", {"alpha": 0.6, "gamma": 1.5}, _logits_targets,
      lambda reduction, **kw: (lambda x, y: _torch_focal(x, y, reduction=reduction, **kw)))
_case("focal-noalpha", "FocalLoss", {"alpha": -1.0, "gamma": 3.0}, _binary_logits,
      lambda reduction, **kw: (lambda x, y: _torch_focal(x, y, reduction=reduction, **kw)))


def _kw_to(kwargs, make):
    return {k: make(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


def _compare(fg_out, t_out, fg_in, t_in, grad_idx, rtol=RTOL, atol=ATOL, seed=7):
    np.testing.assert_allclose(_np(fg_out), t_out.detach().numpy(), rtol=rtol, atol=atol)
    g = _rng(seed).standard_normal(tuple(t_out.shape)).astype(np.float32)
    t_out.backward(torch.tensor(g))
    fg_out.backward(fg.tensor(g, device=fg_out.device))
    for i in grad_idx:
        np.testing.assert_allclose(_np(fg_in[i].grad), t_in[i].grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


def _inputs(arrays, grad_idx, device):
    fg_in = [fg.tensor(a, device=device, requires_grad=i in grad_idx) for i, a in enumerate(arrays)]
    t_in = [torch.tensor(a, requires_grad=i in grad_idx) for i, a in enumerate(arrays)]
    return fg_in, t_in


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
@pytest.mark.parametrize("name, kwargs, maker, torch_factory", MODULE_CASES)
def test_loss_module_matches_torch(device, name, kwargs, maker, torch_factory):
    arrays, grad_idx = maker()
    fg_kwargs = _kw_to(kwargs, lambda a: fg.tensor(a, device=device))
    module = getattr(nn, name)(**fg_kwargs)
    if torch_factory is None:
        t_module = getattr(torch.nn, name)(**_kw_to(kwargs, torch.tensor))
        sd = {k: v.detach().numpy() for k, v in t_module.state_dict().items()}
        assert set(sd) == set(module.state_dict())
        module.load_state_dict(sd)
    else:
        t_module = torch_factory(**kwargs)
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    _compare(module(*fg_in), t_module(*t_in), fg_in, t_in, grad_idx)


# functional forms that only the functional API has, or whose functional defaults differ
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_sigmoid_focal_loss_functional_matches_torchvision_formula(device, reduction):
    arrays, grad_idx = _logits_targets()
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    _compare(F.sigmoid_focal_loss(*fg_in, reduction=reduction), _torch_focal(*t_in, reduction=reduction),
             fg_in, t_in, grad_idx)


def test_sigmoid_focal_loss_default_reduction_is_none_like_torchvision(device):
    x = fg.zeros(2, 3, device=device)
    assert F.sigmoid_focal_loss(x, x).shape == (2, 3)


@pytest.mark.parametrize("dim, eps", [(1, 1e-8), (0, 1e-8), (-1, 0.5)])
def test_cosine_similarity_matches_torch(device, dim, eps):
    arrays, grad_idx = _pair((4, 5))
    arrays[0][1] = 0.0  # a zero vector: the eps clamp is active there
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    _compare(F.cosine_similarity(*fg_in, dim=dim, eps=eps), TF.cosine_similarity(*t_in, dim=dim, eps=eps),
             fg_in, t_in, grad_idx)


@pytest.mark.parametrize("p, keepdim", [(2.0, False), (1.0, True), (3.0, False), (math.inf, False)])
def test_pairwise_distance_matches_torch(device, p, keepdim):
    arrays, grad_idx = _pair((4, 5))
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    _compare(F.pairwise_distance(*fg_in, p=p, keepdim=keepdim), TF.pairwise_distance(*t_in, p=p, keepdim=keepdim),
             fg_in, t_in, grad_idx)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
def test_cross_entropy_unbatched_matches_torch(device, label_smoothing):
    x = _rng(3).standard_normal(5).astype(np.float32)
    fg_x, t_x = fg.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = F.cross_entropy(fg_x, fg.tensor(2, device=device), label_smoothing=label_smoothing)
    ref = TF.cross_entropy(t_x, torch.tensor(2), label_smoothing=label_smoothing)
    _compare(out, ref, [fg_x], [t_x], (0,))


def test_legacy_size_average_reduce_arguments(device):
    arrays, grad_idx = _pair()
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    for sa, rd in [(False, None), (None, False), (True, True)]:
        with pytest.warns(UserWarning):
            ref = TF.mse_loss(*t_in, size_average=sa, reduce=rd)
        np.testing.assert_allclose(_np(F.mse_loss(*fg_in, size_average=sa, reduce=rd)), ref.detach().numpy(),
                                   rtol=RTOL, atol=ATOL)


def test_bce_log_is_clamped_at_minus_100_like_torch(device):
    x = np.array([0.0, 1.0, 0.5], dtype=np.float32)
    y = np.array([1.0, 0.0, 1.0], dtype=np.float32)
    out = F.binary_cross_entropy(fg.tensor(x, device=device), fg.tensor(y, device=device), reduction="none")
    ref = TF.binary_cross_entropy(torch.tensor(x), torch.tensor(y), reduction="none")
    np.testing.assert_allclose(_np(out), ref.numpy(), rtol=RTOL)
    assert np.isfinite(_np(out)).all()


def test_bce_with_logits_is_stable_for_large_logits(device):
    x = np.array([-200.0, -30.0, 0.0, 30.0, 200.0], dtype=np.float32)
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)
    fg_x = fg.tensor(x, device=device, requires_grad=True)
    t_x = torch.tensor(x, requires_grad=True)
    _compare(F.binary_cross_entropy_with_logits(fg_x, fg.tensor(y, device=device), reduction="none"),
             TF.binary_cross_entropy_with_logits(t_x, torch.tensor(y), reduction="none"), [fg_x], [t_x], (0,))


def test_kl_div_batchmean_matches_torch(device):
    arrays, grad_idx = _kl()
    fg_in, t_in = _inputs(arrays, grad_idx, device)
    _compare(F.kl_div(*fg_in, reduction="batchmean"), TF.kl_div(*t_in, reduction="batchmean"), fg_in, t_in,
             grad_idx)


def test_reduction_is_validated():
    x = fg.zeros(3)
    with pytest.raises(fg.FlowError, match="reduction"):
        F.mse_loss(x, x, reduction="avg")
    with pytest.raises(fg.FlowError, match="reduction"):
        F.cross_entropy(fg.zeros(2, 3), fg.tensor([0, 1]), reduction="bogus")
    with pytest.raises(fg.ShapeError, match="target"):
        F.nll_loss(fg.zeros(2, 3), fg.tensor([0, 1, 2]))


# ---------------------------------------------------------------------- CTC
def _ctc_inputs(T=12, N=3, C=5, S=4, seed=0, repeats=True):
    r = _rng(seed)
    logits = r.standard_normal((T, N, C)).astype(np.float32)
    targets = r.integers(1, C, (N, S)).astype(np.int64)
    if repeats:
        targets[0, 1] = targets[0, 0]  # a repeated label needs a blank between the two
    input_lengths = np.array([T, T - 3, T - 1][:N], dtype=np.int64)
    target_lengths = np.array([S, S - 2, 0][:N], dtype=np.int64)
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("layout", ["padded", "concatenated", "unbatched"])
@pytest.mark.parametrize("blank", [0, 4])
def test_ctc_loss_matches_torch(device, reduction, layout, blank):
    logits, targets, il, tl = _ctc_inputs()
    if blank == 4:
        targets = np.where(targets == 4, 0, targets)
    if layout == "concatenated":
        targets = np.concatenate([targets[i, : tl[i]] for i in range(len(tl))])
    if layout == "unbatched":
        logits, targets, il, tl = logits[:, 0], targets[0], il[:1].reshape(()), tl[:1].reshape(())
    fg_x = fg.tensor(logits, device=device, requires_grad=True)
    t_x = torch.tensor(logits, requires_grad=True)
    dim = -1
    out = nn.CTCLoss(blank=blank, reduction=reduction)(
        fg_x.log_softmax(dim), fg.tensor(targets, device=device), fg.tensor(il), fg.tensor(tl))
    ref = torch.nn.CTCLoss(blank=blank, reduction=reduction)(
        t_x.log_softmax(dim), torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    _compare(out, ref, [fg_x], [t_x], (0,), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_impossible_alignment(device, zero_infinity):
    # a target of 3 labels with a repeat needs 4 frames; 3 are given -> infinite loss
    logits = _rng(1).standard_normal((3, 1, 4)).astype(np.float32)
    targets, il, tl = np.array([[1, 1, 2]]), [3], [3]
    fg_x = fg.tensor(logits, device=device, requires_grad=True)
    t_x = torch.tensor(logits, requires_grad=True)
    out = F.ctc_loss(fg_x.log_softmax(-1), fg.tensor(targets, device=device), il, tl, reduction="sum",
                     zero_infinity=zero_infinity)
    ref = TF.ctc_loss(t_x.log_softmax(-1), torch.tensor(targets), il, tl, reduction="sum",
                      zero_infinity=zero_infinity)
    assert _np(out) == ref.detach().numpy()
    if zero_infinity:
        out.backward()
        ref.backward()
        np.testing.assert_allclose(_np(fg_x.grad), t_x.grad.numpy(), atol=ATOL)


def test_ctc_loss_errors():
    lp = fg.zeros(4, 2, 3)
    with pytest.raises(fg.FlowError, match="blank"):
        F.ctc_loss(lp, fg.tensor([[1], [1]]), [4, 4], [1, 1], blank=3)
    with pytest.raises(fg.FlowError, match="input length"):
        F.ctc_loss(lp, fg.tensor([[1], [1]]), [5, 4], [1, 1])
    with pytest.raises(fg.ShapeError, match="one entry per batch"):
        F.ctc_loss(lp, fg.tensor([[1], [1]]), [4], [1, 1])


# ---------------------------------------------------------------------- float64 gradchecks
def _f64(arrays, grad_idx, device):
    return [fg.tensor(a.astype(np.float64) if a.dtype == np.float32 else a, device=device,
                      requires_grad=i in grad_idx) for i, a in enumerate(arrays)]


def _small(maker, **kw):
    return lambda: maker(**kw)


# name -> (callable over the inputs, maker); one row per loss, functional and module
GRADCHECK = {
    "mse_loss": (F.mse_loss, _small(_pair, shape=(2, 3))),
    "l1_loss": (F.l1_loss, _small(_pair, shape=(2, 3))),
    "smooth_l1_loss": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.7), _small(_pair, shape=(2, 3), scale=1.5)),
    "huber_loss": (lambda x, y: F.huber_loss(x, y, delta=0.6), _small(_pair, shape=(2, 3), scale=1.5)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t, weight=fg.tensor(_weight(5), dtype=fg.float64,
                                                                          device=x.device),
                                                    label_smoothing=0.1, ignore_index=2),
                      _small(_class_indices, shape=(4, 5), ignore=2)),
    "cross_entropy_probs": (lambda x, p: F.cross_entropy(x, p, label_smoothing=0.2),
                            _small(_class_probs, shape=(3, 4))),
    "nll_loss": (lambda x, t: F.nll_loss(x, t, ignore_index=1), _small(_log_probs_targets, ignore=1)),
    "binary_cross_entropy": (F.binary_cross_entropy, _small(_probabilities, shape=(2, 3))),
    "binary_cross_entropy_with_logits": (
        lambda x, y: F.binary_cross_entropy_with_logits(
            x, y, pos_weight=fg.tensor([0.5, 2.0, 1.5], dtype=fg.float64, device=x.device)),
        _small(_logits_targets, shape=(2, 3))),
    "sigmoid_focal_loss": (lambda x, y: F.sigmoid_focal_loss(x, y, reduction="mean"),
                           _small(_logits_targets, shape=(2, 3))),
    "kl_div": (lambda x, t: F.kl_div(x, t, reduction="batchmean"), _kl),
    "kl_div_log_target": (lambda x, t: F.kl_div(x, t, log_target=True), _small(_kl, log_target=True)),
    # targets moved off the integers: Stirling's term switches on at target > 1, a jump finite differences see
    "poisson_nll_loss": (lambda x, t: F.poisson_nll_loss(x, t + 0.25, full=True), _poisson),
    "gaussian_nll_loss": (lambda x, t, v: F.gaussian_nll_loss(x, t, v, full=True), _gaussian),
    "cosine_embedding_loss": (lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=0.1), _embedding_pair),
    "hinge_embedding_loss": (F.hinge_embedding_loss, _hinge),
    "margin_ranking_loss": (lambda a, b, t: F.margin_ranking_loss(a, b, t, margin=0.1), _ranking),
    "triplet_margin_loss": (lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=True), _triplet),
    "cosine_similarity": (F.cosine_similarity, _small(_pair, shape=(3, 4))),
    "pairwise_distance": (F.pairwise_distance, _small(_pair, shape=(3, 4))),
    "ctc_loss": (lambda x, t: F.ctc_loss(x.log_softmax(-1), t, [5, 4], [2, 1]),
                 lambda: ([_rng(0).standard_normal((5, 2, 3)), np.array([[1, 1], [2, 0]])], (0,))),
}
# module classes checked through the functional row they call
MODULE_TO_FUNCTIONAL = {
    "MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
    "CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll_loss", "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits", "FocalLoss": "sigmoid_focal_loss",
    "KLDivLoss": "kl_div", "CTCLoss": "ctc_loss", "PoissonNLLLoss": "poisson_nll_loss",
    "GaussianNLLLoss": "gaussian_nll_loss", "CosineEmbeddingLoss": "cosine_embedding_loss",
    "HingeEmbeddingLoss": "hinge_embedding_loss", "MarginRankingLoss": "margin_ranking_loss",
    "TripletMarginLoss": "triplet_margin_loss",
}


def test_every_loss_has_a_gradcheck_row_and_a_torch_case():
    assert sorted(set(loss_module.__functional__) - set(GRADCHECK)) == []
    assert sorted(set(loss_module.__all__) - set(MODULE_TO_FUNCTIONAL)) == []
    compared = {p.values[0] for p in MODULE_CASES}
    assert sorted(set(loss_module.__all__) - compared - {"CTCLoss"}) == []


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck_float64(device, name):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64")
    fn, maker = GRADCHECK[name]
    arrays, grad_idx = maker()
    assert fg.gradcheck(fn, _f64(arrays, grad_idx, device))
