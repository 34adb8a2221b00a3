"""Path rules, freeze/thaw, parameter groups and set_training_at."""

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.errors import FlowError, PathError
from flowgraph.tree import PathKind

from .conftest import make_model


def test_validate_path_kinds(model):
    assert model.validate_path("encoder") is PathKind.SUBGRAPH
    assert model.validate_path("encoder.scan") is PathKind.SUBGRAPH
    assert model.validate_path("encoder.scan.hidden") is PathKind.TAG
    assert model.validate_path("encoder.read.proj") is PathKind.TAG
    assert model.validate_path("classifier") is PathKind.TAG


def test_typo_gets_a_suggestion_and_the_valid_children(model):
    with pytest.raises(PathError) as err:
        model.validate_path("encoder.scna.hidden")
    msg = str(err.value)
    assert "did you mean 'encoder.scan'" in msg and "'read'" in msg and "'scan'" in msg
    assert isinstance(err.value, KeyError)


def test_internal_tags_are_hidden_from_parents(model):
    with pytest.raises(PathError, match="internal tag"):
        model.validate_path("encoder.scan._inner")
    scan = model.subgraph_at("encoder.scan")
    assert scan.validate_path("_inner") is PathKind.TAG


@pytest.mark.parametrize("bad", ["", ".encoder", "encoder.", "encoder..scan", "nothing"])
def test_malformed_and_unknown_paths(model, bad):
    with pytest.raises(PathError):
        model.validate_path(bad)


def test_parameters_at_and_names(model):
    names = [n for n, _ in model.named_parameters_at("encoder.scan")]
    assert names == ["encoder.scan.hidden.weight", "encoder.scan.hidden.bias",
                     "encoder.scan._inner.weight", "encoder.scan._inner.bias"]
    assert [n for n, _ in model.named_parameters_at("encoder.scan.hidden")] == names[:2]
    assert len(model.parameters_at("encoder")) == 6
    assert {id(p) for p in model.parameters_at("classifier")} == {id(p) for p in model.get_submodule(
        "classifier").parameters()}


def test_freeze_stops_gradients_and_updates(model, device):
    model.to(device)
    model.freeze("encoder.scan")
    assert model.is_frozen("encoder.scan") and not model.is_frozen("encoder")
    frozen = {id(p) for p in model.parameters_at("encoder.scan")}
    assert {id(p) for p in model.trainable_parameters()}.isdisjoint(frozen)
    before = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = fg.randn(16, 4, device=device)
    loss = model(x).pow(2).mean()
    loss.backward()
    for n, p in model.named_parameters():
        assert (p.grad is None) == n.startswith("encoder.scan"), n
    grads = {n: None if p.grad is None else p.grad.numpy().copy() for n, p in model.named_parameters()}
    opt.step()
    for n, p in model.named_parameters():
        now = p.detach().numpy()
        if n.startswith("encoder.scan"):
            np.testing.assert_array_equal(now, before[n], err_msg=n)  # frozen: not updated
        else:  # SGD's update (encoder.read.proj.bias feeds a BatchNorm: its gradient is zero up to rounding)
            np.testing.assert_allclose(now, before[n] - 0.1 * grads[n], rtol=1e-6, atol=1e-7, err_msg=n)
    assert not np.array_equal(model.get_submodule("classifier").weight.detach().numpy(),
                              before["classifier.weight"])
    model.thaw("encoder.scan")
    assert not model.is_frozen("encoder.scan")
    model.zero_grad()
    model(x).pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_param_groups_from_paths_work_with_every_optimizer(model):
    for cls in (optim.SGD, optim.Adam, optim.AdamW, optim.RMSprop, optim.Adagrad, optim.RAdam, optim.NAdam):
        m = make_model()
        opt = cls([{"params": m.parameters_at("encoder.scan"), "lr": 1e-4},
                   {"params": m.parameters_at("classifier"), "lr": 1e-2}])
        m(fg.randn(8, 4)).sum().backward()
        opt.step()
        assert [g["lr"] for g in opt.param_groups] == [1e-4, 1e-2]


def test_set_training_at_stops_batchnorm_statistics(model):
    model.train()
    model.set_training_at("norm", False)
    bn = model.get_submodule("norm")
    assert not bn.training and model.training
    before = bn.running_mean.numpy().copy()
    model(fg.randn(16, 4) * 3 + 1)
    assert (bn.running_mean.numpy() == before).all()
    model.set_training_at("norm", True)
    model(fg.randn(16, 4) * 3 + 1)
    assert (bn.running_mean.numpy() != before).any()


def test_freeze_of_a_parameter_free_path_is_an_error():
    from flowgraph.builder import FlowBuilder

    g = FlowBuilder.from_(nn.Linear(2, 2)).through(nn.ReLU()).tag("act").build()
    with pytest.raises(FlowError, match="no parameters"):
        g.freeze("act")
