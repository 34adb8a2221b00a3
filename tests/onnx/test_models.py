"""Every example model, the seven benchmark models and the showcase, exported and run in onnxruntime."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

import flowgraph as fg

from .helpers import export_and_compare

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(rel: str):
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location("onnx_" + path.parent.name + "_" + path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = {
    # example -> (model factory, input shapes)
    "quickstart": ("make_model", [(16, 2)]),
    "sine_wave": ("make_model", [(16, 1)]),
    "observation": ("make_model", [(16, 8)]),
    "schedulers": ("make_model", [(16, 8)]),
    "transfer_learning": ("make_model", [(16, 16)]),
    "mixed_precision": ("make_model", [(16, 16)]),
    "data_parallel": ("make_model", [(16, 8)]),
}


def test_every_example_is_listed():
    assert {p.parent.name for p in ROOT.glob("examples/*/train.py")} == set(EXAMPLES) | {"showcase"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_model(name, tmp_path):
    factory, shapes = EXAMPLES[name]
    fg.manual_seed(0)
    model = getattr(load(f"examples/{name}/train.py"), factory)()
    export_and_compare(model, tuple(fg.randn(*s) for s in shapes), tmp_path / f"{name}.onnx")


def test_trained_batchnorm_statistics_are_exported(tmp_path):
    fg.manual_seed(0)
    model = load("examples/data_parallel/train.py").make_model()
    model.train()
    for _ in range(3):  # move the running statistics away from (0, 1)
        model(fg.randn(32, 8) * 3 + 1)
    export_and_compare(model, (fg.randn(16, 8),), tmp_path / "bn.onnx")


@pytest.mark.parametrize("name", ["mlp", "convnet", "gru_seq", "residual_tower", "gated_routing",
                                  "iterative_refine", "feedback_fixed"])
def test_benchmark_model(name, tmp_path):
    from benchmarks.models import MODELS, build_flowgraph, spec

    assert name in MODELS
    fg.manual_seed(0)
    scale = 0.03
    model = build_flowgraph(name, scale)
    sp = spec(name, scale)
    x = fg.randn(*sp.input_shape)
    proto, _ = export_and_compare(model, (x,), tmp_path / f"{name}.onnx")
    ops = {n.op_type for n in proto.graph.node}
    if name in ("iterative_refine", "feedback_fixed"):
        assert "Loop" in ops  # for_n is an ONNX Loop, not unrolled
    if name == "convnet":
        assert {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool"} <= ops


@pytest.mark.parametrize("opset", [17, 18])  # 18 moved the reductions' axes from attributes to inputs
def test_showcase(tmp_path, opset):
    showcase = load("examples/showcase/train.py")
    fg.manual_seed(0)
    model, _ = showcase.train(epochs=1, model=showcase.build_model())  # trained: routing and halting vary
    x, ctx, _ = showcase.make_data(n=32, seed=3)
    proto, _ = export_and_compare(model, (x, ctx), tmp_path / "showcase.onnx", input_names=["x", "ctx"],
                                  output_names=["y"], opset_version=opset)
    assert proto.opset_import[0].version == opset
    ops = {n.op_type for n in proto.graph.node}
    assert {"Loop", "Where"} <= ops
