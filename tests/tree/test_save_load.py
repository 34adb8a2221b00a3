"""``fg.save`` / ``fg.load``: nested training state round trips exactly, never pickle, errors name the place."""

import io
import json
import math
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save as st_save

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.errors import CheckpointError
from flowgraph.tree import checkpoint_metadata, load_checkpoint, migrate_checkpoint, save_checkpoint


def _model(seed=0):
    fg.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 2))


def test_nested_values_round_trip_with_their_types(tmp_path, device):
    dtypes = [fg.float32, fg.int64, fg.int32, fg.bool, fg.uint8]
    if device == "cpu":
        dtypes += [fg.bfloat16, fg.float16, fg.float64]
    tensors = {d.name: (fg.arange(6).reshape(2, 3) % 3).to(d).to(device) for d in dtypes}
    obj = {
        "tensors": tensors, "iter": 7, "lr": 3e-4, "whole": 2.0, "flags": [True, False, None],
        "specials": [math.inf, -math.inf, math.nan], "name": "run/1 ~ä", "betas": (0.9, 0.95),
        "nested": [[1, (2, [3.5])], {"deep": {"x": ()}}], "by_int": {0: "a", 10: "b"}, "mixed": {1: 1, "1": 2},
        "tuple_key": {(1, "a"): 3, None: 4, 2.5: 5, True: 6}, "at": {"@tensor": "not a reference"},
        "dtype": fg.bfloat16, "ordered": OrderedDict([("b", 1), ("a", 2)]), "empty": {}, "array": np.arange(4.0),
    }
    path = tmp_path / "state.fg"
    fg.save(obj, path)
    out = fg.load(path)
    assert list(out) == list(obj)
    for name, t in tensors.items():
        got = out["tensors"][name]
        assert got.dtype == t.dtype and got.device == t.device and got.shape == t.shape
        assert np.array_equal(got.numpy(), t.numpy()), name
    for key in ("iter", "lr", "whole", "flags", "name", "betas", "nested", "by_int", "mixed", "tuple_key", "at",
                "empty"):
        assert out[key] == obj[key], key
        assert type(out[key]) is type(obj[key])
    assert type(out["iter"]) is int and type(out["whole"]) is float and type(out["betas"]) is tuple
    assert type(out["nested"][0][1]) is tuple and list(out["mixed"]) == [1, "1"]
    assert out["specials"][0] == math.inf and out["specials"][1] == -math.inf and math.isnan(out["specials"][2])
    assert out["dtype"] is fg.bfloat16
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert isinstance(out["array"], np.ndarray) and np.array_equal(out["array"], obj["array"])


def test_entries_are_named_by_their_place_in_the_object(tmp_path):
    fg.save({"model": {"fc.weight": fg.ones(2)}, "opt": [fg.zeros(1)], "a/b~c": fg.ones(1)}, tmp_path / "k.fg")
    with safe_open(str(tmp_path / "k.fg"), framework="numpy") as f:
        assert sorted(f.keys()) == ["a~1b~0c", "model/fc.weight", "opt/0"]
        assert f.metadata()["format"] == "flowgraph.save"
    fg.save(fg.ones(3), tmp_path / "root.fg")
    assert fg.load(tmp_path / "root.fg").tolist() == [1.0, 1.0, 1.0]


def test_requires_grad_and_parameters_are_kept_like_torch(tmp_path):
    leaf = fg.ones(2, requires_grad=True)
    result = leaf * 2  # not a leaf: comes back as a leaf that requires grad, as torch.load gives it
    param = nn.Parameter(fg.ones(3))
    frozen = nn.Parameter(fg.ones(1), requires_grad=False)
    fg.save({"leaf": leaf, "result": result, "param": param, "frozen": frozen, "plain": fg.ones(1)},
            tmp_path / "g.fg")
    out = fg.load(tmp_path / "g.fg")
    assert out["leaf"].requires_grad and out["leaf"].is_leaf
    assert out["result"].requires_grad and out["result"].is_leaf and out["result"].tolist() == [2.0, 2.0]
    assert type(out["param"]) is nn.Parameter and out["param"].requires_grad
    assert type(out["frozen"]) is nn.Parameter and not out["frozen"].requires_grad
    assert not out["plain"].requires_grad and type(out["plain"]) is fg.Tensor


def test_sharing_same_object_and_tied_storage_but_views_are_copies(tmp_path, device):
    t = fg.arange(6.0, device=device)
    shared_storage = t.detach()
    view = t[2:4]
    fg.save({"a": t, "b": [t], "c": shared_storage, "v": view}, tmp_path / "s.fg")
    with safe_open(str(tmp_path / "s.fg"), framework="numpy") as f:
        assert sorted(f.keys()) == ["a", "v"]  # t and its detached alias are stored once
    out = fg.load(tmp_path / "s.fg")
    assert out["a"] is out["b"][0]
    assert out["c"] is not out["a"]
    out["a"].add_(1.0)
    assert out["c"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # one storage, as saved
    assert out["v"].tolist() == [2.0, 3.0]  # a view was saved as its own values


def test_tied_weights_in_a_state_dict_load_back_tied(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

    m = Tied()
    fg.save(m.state_dict(), tmp_path / "tied.fg")
    sd = fg.load(tmp_path / "tied.fg")
    assert list(sd) == ["emb.weight", "head.weight"]
    sd["emb.weight"].mul_(0.0)
    assert float(abs(sd["head.weight"]).sum()) == 0.0
    fresh = Tied()
    fresh.load_state_dict(fg.load(tmp_path / "tied.fg"))
    assert np.array_equal(fresh.head.weight.detach().numpy(), m.emb.weight.detach().numpy())


def _train(model, opt, steps, seed):
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        x = fg.tensor(rng.standard_normal((16, 4)).astype(np.float32))
        y = fg.tensor(rng.standard_normal((16, 2)).astype(np.float32))
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_resuming_adam_from_a_saved_state_equals_uninterrupted_training(tmp_path):
    config = {"lr": 1e-2, "betas": (0.9, 0.95), "schedule": {"warmup": 2, "decay": None}}
    straight = _model()
    opt_s = optim.Adam(straight.parameters(), lr=config["lr"], betas=config["betas"])
    expected = _train(straight, opt_s, 4, seed=1) + _train(straight, opt_s, 4, seed=2)

    first = _model()
    opt_f = optim.Adam(first.parameters(), lr=config["lr"], betas=config["betas"])
    _train(first, opt_f, 4, seed=1)
    path = tmp_path / "ckpt.fg"
    fg.save({"model": first.state_dict(), "optimizer": opt_f.state_dict(), "iter": 4, "config": config}, path)

    state = fg.load(path)
    assert state["iter"] == 4 and state["config"] == config
    resumed = _model(seed=9)  # different weights: everything must come from the file
    opt_r = optim.Adam(resumed.parameters(), lr=state["config"]["lr"], betas=state["config"]["betas"])
    resumed.load_state_dict(state["model"])
    opt_r.load_state_dict(state["optimizer"])
    assert _train(resumed, opt_r, 4, seed=2) == expected[4:]
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert np.array_equal(a.detach().numpy(), b.detach().numpy())


def test_structure_matches_what_torch_load_gives(tmp_path):
    torch = pytest.importorskip("torch")
    tm = torch.nn.Linear(3, 2)
    topt = torch.optim.Adam(tm.parameters(), lr=1e-3, betas=(0.8, 0.9))
    tm(torch.randn(2, 3)).sum().backward()
    topt.step()
    torch.save({"opt": topt.state_dict(), "sd": tm.state_dict()}, tmp_path / "t.pt")
    t_state = torch.load(tmp_path / "t.pt", weights_only=True)

    fm = nn.Linear(3, 2)
    fopt = optim.Adam(fm.parameters(), lr=1e-3, betas=(0.8, 0.9))
    fm(fg.randn(2, 3)).sum().backward()
    fopt.step()
    fg.save({"opt": fopt.state_dict(), "sd": fm.state_dict()}, tmp_path / "f.fg")
    f_state = fg.load(tmp_path / "f.fg")

    assert type(f_state["sd"]) is type(t_state["sd"]) and list(f_state["sd"]) == list(t_state["sd"])
    assert list(f_state["opt"]["state"]) == list(t_state["opt"]["state"]) == [0, 1]  # int keys stay ints
    assert type(f_state["opt"]["param_groups"][0]["betas"]) is type(t_state["opt"]["param_groups"][0]["betas"])
    assert sorted(f_state["opt"]["state"][0]) == sorted(t_state["opt"]["state"][0])


def test_unsupported_objects_name_their_place(tmp_path):
    path = tmp_path / "bad.fg"
    fg.save({"ok": 1}, path)
    before = path.read_bytes()
    Point = namedtuple("Point", "x y")

    class Custom:
        pass

    cases = [
        ({"config": {"fn": lambda x: x}}, r"obj\['config'\]\['fn'\]: a function cannot be saved; save its name"),
        ({"model": nn.Linear(2, 2)}, r"obj\['model'\]: a module \(Linear\) cannot be saved; save module.state_dict"),
        ({"layers": [1, 2, Custom()]}, r"obj\['layers'\]\[2\]: a .*Custom cannot be saved"),
        ({"p": Point(1, 2)}, r"obj\['p'\]: a Point \(a tuple subclass\) cannot be saved"),
        ({"x": np.float32(1.0)}, r"obj\['x'\]: a NumPy scalar .* save x.item\(\)"),
        ({"s": {1, 2}}, r"obj\['s'\]: a set cannot be saved"),
        ({"k": {object(): 1}}, r"obj\['k'\]: a dict key of type object"),
        ({"b": b"raw"}, r"obj\['b'\]: bytes cannot be saved"),
        ({"e": __import__("enum").StrEnum("Mode", "A")("a")}, r"obj\['e'\]: a .*Mode cannot be saved"),
        ({"o": optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)}, r"obj\['o'\]: an optimizer \(SGD\)"),
    ]
    for obj, message in cases:
        with pytest.raises(CheckpointError, match=message):
            fg.save(obj, path)
    cyclic = {"a": []}
    cyclic["a"].append(cyclic)
    with pytest.raises(CheckpointError, match=r"obj\['a'\]\[0\]: the object contains itself"):
        fg.save(cyclic, path)
    deep = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(CheckpointError, match="nested too deeply"):
        fg.save(deep, path)
    assert path.read_bytes() == before  # nothing written by a failed save
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_file_objects_and_map_location(tmp_path, device):
    buf = io.BytesIO()
    fg.save({"w": fg.ones(2, device=device) * 3}, buf)
    buf.seek(0)
    assert fg.load(buf, map_location="cpu")["w"].device == "cpu"
    path = tmp_path / "m.fg"
    fg.save({"w": fg.ones(2, device=device)}, path)
    assert fg.load(path)["w"].device == fg.load(path, map_location=None)["w"].device == fg.device(device)
    assert fg.load(path, device="cpu")["w"].device == "cpu"
    assert fg.load(path, map_location={device: "cpu"}, weights_only=True)["w"].device == "cpu"
    with pytest.raises(CheckpointError, match="disagree"):
        fg.load(path, map_location="cpu", device=device if device != "cpu" else "opencl")


def _rewrite(path, change):
    with safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = dict(f.metadata())
    change(tensors, metadata)
    path.write_bytes(st_save(tensors, metadata=metadata))


def test_corrupt_or_foreign_files_raise_checkpoint_errors(tmp_path):
    path = tmp_path / "c.fg"
    fg.save({"w": fg.arange(8.0), "n": 1}, path)
    good = path.read_bytes()
    raw = bytearray(good)
    raw[-3] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="'w' does not match its checksum"):
        fg.load(path)
    path.write_bytes(good[:40])
    with pytest.raises(CheckpointError, match="truncated"):
        fg.load(path)
    path.write_bytes(b"\x00" * 3)
    with pytest.raises(CheckpointError, match="truncated or not a safetensors file"):
        fg.load(path)
    model = _model()
    save_checkpoint(model, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="not written by fg.save.*g.load_checkpoint"):
        fg.load(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot read"):
        fg.load(tmp_path / "missing.fg")

    def crafted(field, value):
        path.write_bytes(good)
        _rewrite(path, lambda t, m: m.__setitem__(field, value))
        with pytest.raises(CheckpointError, match="corrupt|version"):
            fg.load(path)

    crafted("object", "{not json")
    crafted("object", json.dumps({"@tensor": "w", "object": "zero"}))
    crafted("object", json.dumps({"@tensor": "nope", "object": 0}))
    crafted("object", json.dumps({"@float": "1e999"}))
    crafted("object", json.dumps({"@tuple": 1}))
    crafted("object", json.dumps({"@dtype": "complex64"}))
    crafted("object", json.dumps({"@items": [[1]]}))
    crafted("object", json.dumps({"@items": [[[1, 2], 3]]}))  # a list as a dict key
    crafted("object", "[" * 100000 + "]" * 100000)
    crafted("tensors", json.dumps({"w": {"dtype": "object"}}))
    crafted("checksums", "[]")
    crafted("format_version", "99")
    path.write_bytes(good)
    _rewrite(path, lambda t, m: m.__setitem__("tensors", json.dumps({"w": {"dtype": "float32", "device": "cuda:7"}})))
    if "cuda:7" not in fg.available_devices():
        with pytest.raises(CheckpointError, match="saved on 'cuda:7' cannot be placed.*map_location='cpu'"):
            fg.load(path)
        with pytest.raises(CheckpointError, match="saved on 'cpu' and mapped to 'cuda:7'"):
            fg.load(_saved_on_cpu(tmp_path), map_location="cuda:7")
        assert fg.load(path, map_location="cpu")["w"].tolist() == list(range(8))


def _saved_on_cpu(tmp_path):
    path = tmp_path / "cpu.fg"
    fg.save({"w": fg.ones(1)}, path)
    return path


def test_checkpoint_metadata_round_trips_and_is_checked(tmp_path):
    model = _model()
    path = tmp_path / "m.safetensors"
    meta = {"epoch": 7, "best": math.inf, "config": {"betas": (0.9, 0.95), "layers": [4, 8, 2], "name": "run"}}
    save_checkpoint(model, path, metadata=meta)
    report = load_checkpoint(_model(seed=1), path)
    assert report.metadata == meta and type(report.metadata["config"]["betas"]) is tuple
    assert checkpoint_metadata(path) == meta
    save_checkpoint(model, tmp_path / "plain.safetensors")
    assert load_checkpoint(_model(), tmp_path / "plain.safetensors").metadata == {}
    assert checkpoint_metadata(tmp_path / "plain.safetensors") == {}
    migrate_checkpoint(path, tmp_path / "migrated.safetensors", _model())
    assert checkpoint_metadata(tmp_path / "migrated.safetensors") == meta
    with pytest.raises(CheckpointError, match=r"save_checkpoint metadata: obj\['config'\]\['fn'\]: a function"):
        save_checkpoint(model, path, metadata={"config": {"fn": print}})
    with pytest.raises(CheckpointError, match=r"obj\['w'\]: a tensor cannot be stored in checkpoint metadata"):
        save_checkpoint(model, path, metadata={"w": fg.ones(1)})
    with pytest.raises(CheckpointError, match="metadata must be a dict"):
        save_checkpoint(model, path, metadata=[1])
    assert checkpoint_metadata(path) == meta  # the failed saves wrote nothing


def test_graph_save_checkpoint_takes_metadata(tmp_path):
    from .conftest import make_model

    g = make_model(seed=1)
    path = tmp_path / "g.safetensors"
    g.save_checkpoint(path, metadata={"epoch": 3, "label": None})
    report = make_model(seed=2).load_checkpoint(path)
    assert report.metadata == {"epoch": 3, "label": None} and not report.missing
