"""PyTorch weights saved with safetensors load into flowgraph modules (same keys) and into a Graph (key map)."""

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder
from flowgraph.errors import CheckpointError
from flowgraph.tree import key_map_by_order, load_safetensors_weights

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def test_torch_state_dict_loads_into_equivalent_modules(tmp_path):
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(tm.state_dict(), str(path))
    fm = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    result = load_safetensors_weights(fm, path)
    assert not result.missing_keys and not result.unexpected_keys
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(fm(fg.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_torch_weights_into_a_graph_through_a_key_map(tmp_path):
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(tm.state_dict(), str(path))
    g = FlowBuilder.from_(nn.Linear(4, 8)).through(nn.GELU()).through(nn.Linear(8, 2)).tag("head").build()
    shapes = {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    mapping = key_map_by_order(g, list(shapes), shapes)
    assert mapping == {"0.weight": "from_0.weight", "0.bias": "from_0.bias", "2.weight": "head.weight",
                       "2.bias": "head.bias"}
    load_safetensors_weights(g, path, key_map=mapping)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(g(fg.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_key_map_refuses_mismatched_shapes():
    g = FlowBuilder.from_(nn.Linear(4, 8)).through(nn.Linear(8, 3)).build()
    with pytest.raises(CheckpointError, match="does not fit"):
        key_map_by_order(g, ["0.weight", "0.bias", "1.weight", "1.bias"],
                         {"0.weight": (8, 4), "0.bias": (8,), "1.weight": (2, 8), "1.bias": (2,)})
