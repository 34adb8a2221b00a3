"""Export a model, check it, run it in onnxruntime and compare with flowgraph's eval-mode output."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install 'flowgraph[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'flowgraph[onnx]')")

import flowgraph as fg  # noqa: E402

TOL = 1e-5


def flowgraph_outputs(model, inputs: tuple) -> list[np.ndarray]:
    """``model.eval(); model(*inputs)`` from a reset state, as host arrays."""
    model.eval()
    if isinstance(model, fg.Graph):
        model.reset_state()
    with fg.no_grad():
        out = model(*inputs)
    outs = []

    def flat(v):
        if isinstance(v, (tuple, list)):
            for item in v:
                flat(item)
        elif v is not None:
            outs.append(v.detach().to("cpu").numpy())

    flat(out)
    return outs


def run_onnx(path, inputs: tuple, names: list[str] | None = None) -> list[np.ndarray]:
    """Run the file in onnxruntime on the CPU."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = names or [i.name for i in session.get_inputs()]
    return session.run(None, {n: x.detach().to("cpu").numpy() for n, x in zip(names, inputs)})


def export_and_compare(model, inputs: tuple, path, **kwargs) -> tuple:
    """Export, check (``onnx.checker`` with full shape inference), run; outputs within ``TOL`` of flowgraph's."""
    sample = inputs if len(inputs) > 1 else inputs[0]
    proto = fg.onnx.export(model, sample, path, **kwargs)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    got = run_onnx(path, inputs, kwargs.get("input_names"))
    want = flowgraph_outputs(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)
    return proto, got
