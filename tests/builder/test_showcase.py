"""The examples/showcase model: every verb in one graph, and a few epochs of training that lower the loss."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import flowgraph as fg
from flowgraph.builder import FlowBuilder, Graph, MergeOp

_PATH = Path(__file__).resolve().parents[2] / "examples" / "showcase" / "train.py"


def _load():
    spec = importlib.util.spec_from_file_location("showcase_train", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lazy_top_level_names():
    assert fg.FlowBuilder is FlowBuilder and fg.MergeOp is MergeOp and fg.Graph is Graph


def test_showcase_uses_every_verb():
    showcase = _load()
    model = showcase.build_model()
    verbs = {e["verb"] for e in model.structure()}
    assert verbs == {"from", "through", "fork", "split", "merge", "loop", "gate", "switch", "map"}
    assert model.label == "showcase" and model.input_names == ["ctx"]
    assert list(model.subgraphs()) == ["encoder"]
    assert set(model.tags) == {"encoded", "ctx", "aux", "memory"}
    refs = {tag: ref.stream is None for n in model.nodes() for tag, ref in n.refs.items()}
    assert refs == {"ctx": False, "memory": True, "encoded": False}
    assert "also" in {e["verb"] for e in model.encoder.structure()}


def test_showcase_trains(tmp_path):
    showcase = _load()
    seen = []
    model, history = showcase.train(epochs=4, on_epoch=lambda e, s, m: seen.append((e, m["loss"])))
    assert [e for e, _ in seen] == [0, 1, 2, 3]
    losses = [h["loss"] for h in history]
    assert all(loss == loss for loss in losses)          # finite, not NaN
    assert losses[-1] < 0.8 * losses[0]
    out = showcase.write_svg(model, tmp_path / "showcase.svg")
    assert out.exists() and out.stat().st_size > 0
