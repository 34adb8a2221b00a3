"""``nn.Module`` and friends against PyTorch: traversal, state dicts, modes, conversion, hooks, repr, and
``nn.init`` (gains exactly; distributions statistically, with bounds stated per test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn import init


def small_net(lib):
    """The same nested model in either library."""
    return lib.Sequential(
        lib.Conv2d(3, 4, 3, padding=1),
        lib.BatchNorm2d(4),
        lib.ReLU(),
        lib.MaxPool2d(2),
        lib.Sequential(lib.Flatten(), lib.Dropout(0.2), lib.Linear(16, 5)),
        lib.LayerNorm(5),
    )


def host(t) -> np.ndarray:
    return t.detach().to("cpu").numpy() if isinstance(t, fg.Tensor) else t.detach().numpy()


# ---------------------------------------------------------------------- traversal and naming
def test_names_match_torch():
    f, t = small_net(nn), small_net(torch.nn)
    assert [n for n, _ in f.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in f.named_buffers()] == [n for n, _ in t.named_buffers()]
    assert list(f.state_dict()) == list(t.state_dict())
    assert [n for n, _ in f.named_modules()] == [n for n, _ in t.named_modules()]
    assert [type(m).__name__ for m in f.modules()] == [type(m).__name__ for m in t.modules()]
    assert [n for n, _ in f.named_children()] == [n for n, _ in t.named_children()]
    assert len(list(f.children())) == len(list(t.children())) == 6
    assert [tuple(p.shape) for p in f.parameters()] == [tuple(p.shape) for p in t.parameters()]
    assert [tuple(b.shape) for b in f.buffers()] == [tuple(b.shape) for b in t.buffers()]


def test_shared_parameters_and_modules_appear_once():
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert len(list(model.parameters())) == 2
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias"]
    assert len(list(model.modules())) == 3  # Sequential, Linear (once), ReLU
    assert len(list(model.named_parameters(remove_duplicate=False))) == 4


def test_get_submodule_and_parameter():
    model = small_net(nn)
    assert model.get_submodule("4.2") is model[4][2]
    assert model.get_parameter("4.2.bias") is model[4][2].bias
    with pytest.raises(fg.FlowError, match="no child"):
        model.get_submodule("4.7")


def test_non_persistent_buffer_not_in_state_dict():
    m = nn.Module()
    m.register_buffer("kept", fg.zeros(2))
    m.register_buffer("scratch", fg.zeros(2), persistent=False)
    assert list(m.state_dict()) == ["kept"]
    assert [n for n, _ in m.named_buffers()] == ["kept", "scratch"]


def test_assignment_before_init_is_an_error():
    class Broken(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(fg.zeros(1))

    with pytest.raises(fg.FlowError, match="super\\(\\).__init__"):
        Broken()


def test_containers():
    ml = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
    ml.append(nn.Tanh())
    assert len(ml) == 3 and isinstance(ml[2], nn.Tanh)
    assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias"]
    md = nn.ModuleDict({"a": nn.Linear(2, 3), "b": nn.ReLU()})
    assert list(md.keys()) == ["a", "b"] and "a" in md
    assert [n for n, _ in md.named_parameters()] == ["a.weight", "a.bias"]
    pl = nn.ParameterList([nn.Parameter(fg.zeros(2)), nn.Parameter(fg.ones(3))])
    assert [n for n, _ in pl.named_parameters()] == ["0", "1"]
    seq = small_net(nn)
    assert len(seq) == 6 and isinstance(seq[-1], nn.LayerNorm) and len(seq[1:3]) == 2


# ---------------------------------------------------------------------- state dicts
def test_load_state_dict_from_torch_round_trip():
    f, t = small_net(nn), small_net(torch.nn)
    t.train()
    t(torch.randn(4, 3, 4, 4))  # moves the batch-norm buffers away from their initial values
    result = f.load_state_dict(t.state_dict())  # torch tensors are accepted directly
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (name, value), (t_name, t_value) in zip(f.state_dict().items(), t.state_dict().items()):
        assert name == t_name
        np.testing.assert_array_equal(host(value), host(t_value))
    f.eval()
    t.eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(host(f(fg.tensor(x))), host(t(torch.tensor(x))), rtol=1e-5, atol=1e-5)


def test_load_state_dict_strict_reports_keys():
    f = small_net(nn)
    state = dict(f.state_dict())
    del state["0.bias"]
    state["extra.weight"] = fg.zeros(1)
    with pytest.raises(fg.FlowError) as err:
        f.load_state_dict(state)
    assert "0.bias" in str(err.value) and "extra.weight" in str(err.value)
    result = f.load_state_dict(state, strict=False)
    assert result.missing_keys == ["0.bias"] and result.unexpected_keys == ["extra.weight"]
    t_result = small_net(torch.nn).load_state_dict({k: torch.tensor(host(v)) for k, v in state.items()}, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (t_result.missing_keys, t_result.unexpected_keys)


def test_load_state_dict_shape_mismatch():
    f = nn.Linear(3, 2)
    with pytest.raises(fg.ShapeError, match="weight"):
        f.load_state_dict({"weight": fg.zeros(3, 3), "bias": fg.zeros(2)})


def test_load_state_dict_keeps_parameter_objects_and_values_are_copies():
    f = nn.Linear(2, 2)
    weight = f.weight
    source = fg.ones(2, 2)
    f.load_state_dict({"weight": source, "bias": fg.zeros(2)})
    assert f.weight is weight and weight.requires_grad
    with fg.no_grad():
        source.mul_(5)
    np.testing.assert_array_equal(host(f.weight), np.ones((2, 2)))


def test_state_dict_is_detached():
    f = nn.Linear(2, 2)
    assert all(not v.requires_grad for v in f.state_dict().values())
    assert all(v.requires_grad for v in f.state_dict(keep_vars=True).values())


# ---------------------------------------------------------------------- modes, conversion, gradients
def test_train_eval_propagate():
    f = small_net(nn)
    assert all(m.training for m in f.modules())
    assert f.eval() is f
    assert not any(m.training for m in f.modules())
    f[4].train()
    assert f[4][1].training and not f[1].training


def test_to_dtype_casts_floating_only():
    f = small_net(nn).to(fg.float64)
    assert all(p.dtype == fg.float64 for p in f.parameters())
    assert f[1].running_mean.dtype == fg.float64
    assert f[1].num_batches_tracked.dtype == fg.int64
    assert f.float()[0].weight.dtype == fg.float32
    out = f.double()(fg.randn(2, 3, 4, 4, dtype=fg.float64))
    assert out.dtype == fg.float64


def test_to_device_keeps_parameter_identity(device: str):
    f = nn.Linear(3, 2)
    weight = f.weight
    f.to(device)
    assert f.weight is weight and isinstance(f.weight, nn.Parameter) and f.weight.device == device
    out = f(fg.ones(1, 3, device=device))
    out.sum().backward()
    assert f.weight.grad.device == device


def test_apply_visits_children_first_like_torch():
    seen_f, seen_t = [], []
    small_net(nn).apply(lambda m: seen_f.append(type(m).__name__))
    small_net(torch.nn).apply(lambda m: seen_t.append(type(m).__name__))
    assert seen_f == seen_t


def test_apply_can_initialise():
    model = small_net(nn)

    def zero_linear(m):
        if isinstance(m, nn.Linear):
            init.zeros_(m.weight)

    model.apply(zero_linear)
    assert not host(model[4][2].weight).any()


def test_zero_grad_and_requires_grad():
    f = nn.Linear(3, 2)
    f(fg.ones(1, 3)).sum().backward()
    assert f.weight.grad is not None
    f.zero_grad(set_to_none=False)
    assert f.weight.grad is not None and not host(f.weight.grad).any()
    f.zero_grad()
    assert f.weight.grad is None and f.bias.grad is None
    assert f.requires_grad_(False) is f
    assert not any(p.requires_grad for p in f.parameters())
    assert not f(fg.ones(1, 3)).requires_grad
    f.requires_grad_()
    assert all(p.requires_grad for p in f.parameters())


def test_forward_hooks():
    f = nn.Linear(2, 2)
    calls = []
    pre = f.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    post = f.register_forward_hook(lambda m, args, out: calls.append(out.shape) or out + 1)
    out = f(fg.ones(1, 2))
    np.testing.assert_allclose(host(out), host(f.bias)[None] + 1, rtol=1e-6)
    assert calls == [(1, 2)]
    pre.remove()
    post.remove()
    np.testing.assert_allclose(host(f(fg.zeros(1, 2))), host(f.bias)[None], rtol=1e-6)


# ---------------------------------------------------------------------- repr
@pytest.mark.parametrize(
    "build",
    [
        small_net,
        lambda lib: lib.Linear(3, 4, bias=False),
        lambda lib: lib.Conv2d(3, 8, (3, 5), stride=2, padding=(1, 2), dilation=2, groups=1, bias=False),
        lambda lib: lib.ConvTranspose2d(4, 2, 3, stride=2, output_padding=1),
        lambda lib: lib.Conv1d(2, 4, 3, padding="same", padding_mode="reflect"),
        lambda lib: lib.Sequential(lib.GELU(approximate="tanh"), lib.LeakyReLU(0.2, inplace=True), lib.Softmax(-1)),
        lambda lib: lib.ModuleList([lib.Embedding(10, 3, padding_idx=0), lib.GroupNorm(2, 4), lib.RMSNorm(4)]),
        lambda lib: lib.ModuleDict({"pool": lib.AdaptiveAvgPool2d((1, 1)), "up": lib.Upsample(scale_factor=2)}),
        lambda lib: lib.Sequential(lib.InstanceNorm2d(3), lib.AvgPool2d(3, 2, 1), lib.PixelShuffle(2), lib.Identity()),
        lambda lib: lib.Sequential(
            lib.ModuleList([lib.Linear(2, 2) for _ in range(3)] + [lib.ReLU()]), lib.ModuleList()
        ),
    ],
    ids=[
        "net",
        "linear",
        "conv2d",
        "convT2d",
        "conv1d",
        "activations",
        "modulelist",
        "moduledict",
        "misc",
        "modulelist-runs",
    ],
)
def test_repr_like_torch(build):
    assert repr(build(nn)) == repr(build(torch.nn))


# ---------------------------------------------------------------------- init
@pytest.mark.parametrize(
    "nonlinearity, param",
    [
        ("linear", None),
        ("conv2d", None),
        ("conv_transpose3d", None),
        ("sigmoid", None),
        ("tanh", None),
        ("relu", None),
        ("leaky_relu", None),
        ("leaky_relu", 0.2),
        ("selu", None),
    ],
)
def test_calculate_gain_like_torch(nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, param))


def test_calculate_gain_unknown():
    with pytest.raises(fg.FlowError, match="nonlinearity"):
        init.calculate_gain("swishy")


def _uniform_check(values: np.ndarray, bound: float) -> None:
    """All within [-bound, bound], and the standard deviation that of U(-bound, bound) within 2%."""
    assert np.abs(values).max() <= bound * (1 + 1e-6)
    assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert abs(values.mean()) < 0.02 * bound


@pytest.mark.parametrize("fan_in, fan_out", [(300, 200), (50, 40)])
def test_linear_default_init_like_torch(fan_in, fan_out):
    fg.manual_seed(0)
    layer = nn.Linear(fan_in, fan_out)
    bound = 1 / math.sqrt(fan_in)  # PyTorch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    t_layer = torch.nn.Linear(fan_in, fan_out)
    assert np.abs(t_layer.weight.detach().numpy()).max() <= bound
    _uniform_check(host(layer.weight).ravel(), bound)
    assert np.abs(host(layer.bias)).max() <= bound


def test_conv_default_init_like_torch():
    fg.manual_seed(1)
    conv = nn.Conv2d(16, 64, 5)
    fan_in = 16 * 25
    _uniform_check(host(conv.weight).ravel(), 1 / math.sqrt(fan_in))
    assert np.abs(host(conv.bias)).max() <= 1 / math.sqrt(fan_in)
    convt = nn.ConvTranspose2d(16, 32, 3)  # weight (in, out, k, k): torch's fan_in is dim 1 * k * k
    _uniform_check(host(convt.weight).ravel(), 1 / math.sqrt(32 * 9))


def test_embedding_and_norm_default_init():
    fg.manual_seed(2)
    emb = host(nn.Embedding(400, 100).weight)
    assert emb.std() == pytest.approx(1.0, rel=0.02) and abs(emb.mean()) < 0.02
    bn = nn.BatchNorm1d(5)
    assert host(bn.weight).tolist() == [1.0] * 5 and host(bn.bias).tolist() == [0.0] * 5
    assert host(bn.running_var).tolist() == [1.0] * 5 and int(bn.num_batches_tracked.item()) == 0


@pytest.mark.parametrize(
    "fn, kwargs, std",
    [
        (init.kaiming_normal_, {}, math.sqrt(2) / math.sqrt(500)),
        (init.kaiming_normal_, {"mode": "fan_out", "nonlinearity": "relu"}, math.sqrt(2) / math.sqrt(400)),
        (init.xavier_normal_, {"gain": 2.0}, 2.0 * math.sqrt(2 / 900)),
        (init.normal_, {"mean": 0.0, "std": 0.3}, 0.3),
    ],
)
def test_normal_initialisers(fn, kwargs, std):
    fg.manual_seed(3)
    w = fg.empty(400, 500)
    assert fn(w, **kwargs) is w
    values = host(w)
    assert values.std() == pytest.approx(std, rel=0.02)
    assert abs(values.mean()) < 0.02 * std


def test_uniform_initialisers():
    fg.manual_seed(4)
    w = fg.empty(400, 500)
    _uniform_check(host(init.xavier_uniform_(w)).ravel(), math.sqrt(6 / 900))
    _uniform_check(
        host(init.kaiming_uniform_(w, a=0.0, nonlinearity="relu")).ravel(), math.sqrt(2) * math.sqrt(3 / 500)
    )
    values = host(init.uniform_(w, -0.5, 1.5))
    assert values.min() >= -0.5 and values.max() < 1.5 and values.mean() == pytest.approx(0.5, abs=0.01)


def test_trunc_normal_orthogonal_and_constants():
    fg.manual_seed(5)
    w = host(init.trunc_normal_(fg.empty(300, 300), std=1.0, a=-1.0, b=1.5))
    assert w.min() >= -1.0 and w.max() <= 1.5
    expected = torch.nn.init.trunc_normal_(torch.empty(200_000), std=1.0, a=-1.0, b=1.5).mean().item()
    assert w.mean() == pytest.approx(expected, abs=0.02)  # the truncated distribution's mean (~0.14)
    q = host(init.orthogonal_(fg.empty(6, 10), gain=2.0))
    np.testing.assert_allclose(q @ q.T, 4 * np.eye(6), atol=1e-5)
    np.testing.assert_array_equal(host(init.eye_(fg.empty(3, 4))), np.eye(3, 4))
    assert host(init.constant_(fg.empty(2, 2), 0.25)).tolist() == [[0.25, 0.25], [0.25, 0.25]]
    assert not host(init.zeros_(fg.ones(3))).any() and host(init.ones_(fg.zeros(3))).all()


def test_init_runs_without_recording_on_parameters():
    layer = nn.Linear(3, 3)
    init.xavier_uniform_(layer.weight)
    assert layer.weight.is_leaf and layer.weight.grad_fn is None and layer.weight.requires_grad


def test_init_errors():
    with pytest.raises(fg.FlowError, match="at least 2 dims"):
        init.xavier_uniform_(fg.empty(5))
    with pytest.raises(fg.FlowError, match="mode"):
        init.kaiming_uniform_(fg.empty(3, 3), mode="fan_middle")


def test_attribute_assignment_rules_like_torch():
    """A registered name only takes its own kind (or None), as in PyTorch; Parameters and Modules take over."""
    f = nn.Linear(2, 2)
    with pytest.raises(fg.FlowError, match="nn.Parameter or None"):
        f.weight = fg.zeros(2, 2)
    assert isinstance(f.weight, nn.Parameter) and "weight" in dict(f.named_parameters())
    f.bias = None
    assert [n for n, _ in f.named_parameters()] == ["weight"] and f.bias is None
    seq = nn.Sequential(nn.ReLU())
    with pytest.raises(fg.FlowError, match="nn.Module or None"):
        setattr(seq, "0", 3)
    bn = nn.BatchNorm1d(2)
    with pytest.raises(fg.FlowError, match="buffer"):
        bn.running_mean = [0.0, 0.0]
    bn.running_mean = fg.ones(2)
    assert "running_mean" in bn.state_dict()
    bn.running_var = nn.Parameter(fg.ones(2))  # a Parameter takes the name over from the buffer
    assert "running_var" in dict(bn.named_parameters()) and "running_var" not in dict(bn.named_buffers())


def test_register_parameter_needs_a_parameter():
    m = nn.Module()
    with pytest.raises(fg.FlowError, match="nn.Parameter or None"):
        m.register_parameter("w", fg.zeros(2))
    m.register_parameter("w", None)
    m.register_parameter("v", nn.Parameter(fg.zeros(2)))
    assert [n for n, _ in m.named_parameters()] == ["v"] and m.w is None


def test_container_editing_like_torch():
    layers = [nn.Linear(1, 1), nn.ReLU(), nn.Tanh()]
    t_layers = [torch.nn.Linear(1, 1), torch.nn.ReLU(), torch.nn.Tanh()]
    ml, tl = nn.ModuleList(layers), torch.nn.ModuleList(t_layers)
    for lst, lib in ((ml, nn), (tl, torch.nn)):
        lst.insert(1, lib.Sigmoid())
        lst.pop(0)
        del lst[-1]
        lst += [lib.GELU()]
        lst.append(lib.Identity())
    assert [n for n, _ in ml.named_children()] == [n for n, _ in tl.named_children()] == ["0", "1", "2", "3"]
    assert [type(m).__name__ for m in ml] == [type(m).__name__ for m in tl]
    assert len(ml + nn.ModuleList([nn.ReLU()])) == 5
    md = nn.ModuleDict({"a": nn.ReLU()})
    md.update({"b": nn.Tanh()})
    md.update([("c", nn.GELU())])
    assert isinstance(md.pop("a"), nn.ReLU) and list(md.keys()) == ["b", "c"]
    del md["b"]
    assert list(md) == ["c"]
    md.clear()
    assert len(md) == 0
    with pytest.raises(fg.FlowError, match="no such key"):
        md.pop("z")
    pl = nn.ParameterList().extend([nn.Parameter(fg.zeros(1)), nn.Parameter(fg.ones(2))])
    assert [n for n, _ in pl.named_parameters()] == ["0", "1"]


@pytest.mark.parametrize("shape, groups", [((4, 2, 3), 1), ((6, 4, 3, 3), 2), ((2, 2, 1, 3, 3), 1), ((4, 6, 3, 3), 1)])
def test_dirac_like_torch(shape, groups):
    np.testing.assert_array_equal(
        host(init.dirac_(fg.empty(*shape), groups)), torch.nn.init.dirac_(torch.empty(*shape), groups).numpy()
    )


def test_dirac_conv_is_identity():
    conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)
    init.dirac_(conv.weight)
    x = fg.randn(2, 3, 5, 5)
    np.testing.assert_allclose(host(conv(x)), host(x), rtol=1e-6, atol=1e-6)


def test_sparse_zeros_per_column():
    fg.manual_seed(6)
    w = host(init.sparse_(fg.empty(10, 400), sparsity=0.3, std=0.5))
    assert ((w == 0).sum(0) == 3).all()  # ceil(0.3 * 10) zeros in every column, as torch's sparse_
    assert w[w != 0].std() == pytest.approx(0.5, rel=0.05)
    zero_rows = (w == 0).sum(1)
    assert zero_rows.min() > 60 and zero_rows.max() < 180  # spread over rows (expected 120 each)
