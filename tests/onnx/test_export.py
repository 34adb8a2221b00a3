"""``fg.onnx.export`` per builder verb and layer type, on every backend; errors name the node's path."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder, MergeOp

from .helpers import export_and_compare, flowgraph_outputs, run_onnx


class Scale(nn.Module):
    """A custom forward (traced primitive by primitive) that takes a ref."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, ctx=None):
        y = self.lin(x).sigmoid() * 2 - x.abs().sqrt()
        return y if ctx is None else y + ctx.mean(-1, keepdim=True)


class Step(nn.Module):
    def forward(self, x):
        return x + 0.25


def _ops(proto) -> set[str]:
    return {n.op_type for n in proto.graph.node}


def test_chain_split_merge_tag_using(device, tmp_path):
    fg.manual_seed(0)
    for op in (MergeOp.ADD, MergeOp.MEAN, MergeOp.CAT, MergeOp.MUL, MergeOp.MAX):
        model = (FlowBuilder.from_(nn.Linear(6, 8)).tag("first").through(nn.GELU())
                 .also(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
                 .split(nn.Linear(8, 8), Scale(8), nn.LayerNorm(8)).merge(op)
                 .through(Scale(24 if op is MergeOp.CAT else 8)).using("ctx")
                 .input("ctx").build().to(device))
        x, ctx = fg.randn(5, 6, device=device), fg.randn(5, 3, device=device)
        proto, _ = export_and_compare(model, (x, ctx), tmp_path / "m.onnx")
        assert "Gemm" in _ops(proto)


def test_forward_reference_starts_from_the_reset_state(device, tmp_path):
    fg.manual_seed(0)
    model = (FlowBuilder.from_(nn.Linear(4, 4)).through(nn.StateAdd()).using("memory")
             .through(nn.Tanh()).tag("memory").build().to(device))
    x = fg.randn(3, 4, device=device)
    with fg.no_grad():
        model(x)  # the state now holds this call's value
    export_and_compare(model, (x,), tmp_path / "m.onnx")
    assert "memory" in model._state  # export leaves the carried state as it was


def test_gate_and_switch_per_row_and_whole_batch(device, tmp_path):
    fg.manual_seed(1)
    gate = FlowBuilder.from_(nn.Linear(6, 8)).gate(nn.SoftmaxRouter(8, 3), [nn.Linear(8, 8), nn.GELU(),
                                                                            Scale(8)]).build().to(device)
    export_and_compare(gate, (fg.randn(7, 6, device=device),), tmp_path / "gate.onnx")
    switch = (FlowBuilder.from_(nn.Linear(6, 8))
              .switch(nn.ArgmaxSelector(8, 3), [nn.Linear(8, 4), nn.Linear(8, 4), nn.Linear(8, 4)])
              .build().to(device))
    x = fg.randn(64, 6, device=device)
    with fg.no_grad():
        chosen = switch._modules["switch_0_selector"](switch._modules["from_0"](x)).to("cpu").numpy()
    assert len(set(chosen.tolist())) >= 2  # rows really go to different branches
    proto, _ = export_and_compare(switch, (x,), tmp_path / "switch.onnx")
    assert "Where" in _ops(proto)
    whole = (FlowBuilder.from_(nn.Linear(6, 8)).switch(nn.FixedSelector(1), [nn.Linear(8, 2), nn.Linear(8, 2)])
             .build().to(device))
    export_and_compare(whole, (x,), tmp_path / "whole.onnx")


def test_for_n_is_an_onnx_loop(device, tmp_path):
    fg.manual_seed(0)
    body = FlowBuilder().also(nn.Sequential(nn.Linear(8, 8), nn.Tanh())).build()
    model = FlowBuilder.from_(nn.Linear(6, 8)).loop_body(body).for_n(4).through(nn.Linear(8, 2)).build().to(device)
    proto, _ = export_and_compare(model, (fg.randn(5, 6, device=device),), tmp_path / "m.onnx")
    loops = [n for n in proto.graph.node if n.op_type == "Loop"]
    assert len(loops) == 1
    # a body that reads a ref: the Loop body graph uses the outer value
    with_ref = (FlowBuilder.from_(nn.Linear(6, 8)).tag("first").loop_body(Scale(8)).for_n(3).using("ctx")
                .input("ctx").build().to(device))
    export_and_compare(with_ref, (fg.randn(5, 6, device=device), fg.randn(5, 2, device=device)),
                       tmp_path / "ref.onnx")


def test_halting_loop_with_a_free_batch_size(tmp_path):
    model = FlowBuilder().loop_body(Step()).while_cond(nn.ThresholdHalt(1.0), 6).build()
    fg.onnx.export(model, fg.randn(4, 2), tmp_path / "m.onnx", input_names=["x"], output_names=["y"],
                   dynamic_axes={"x": [0], "y": [0]})
    x = fg.tensor([[0.9, 0.0], [0.1, 0.2], [-0.6, 0.0], [-3.0, -2.0], [0.2, 0.3], [5.0, 0.0], [0.0, 0.0]])
    (got,) = run_onnx(tmp_path / "m.onnx", (x,), ["x"])
    np.testing.assert_allclose(got, flowgraph_outputs(model, (x,))[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["while_cond", "until_cond"])
def test_halting_loops_stop_rows_at_different_passes(device, mode, tmp_path):
    model = getattr(FlowBuilder().loop_body(Step()), mode)(nn.ThresholdHalt(1.0), 6).build().to(device)
    x = fg.tensor([[0.9, 0.0], [0.1, 0.2], [-0.6, 0.0], [-3.0, -2.0]], device=device)
    proto, got = export_and_compare(model, (x,), tmp_path / "m.onnx")
    with fg.no_grad():
        model(x)
    rows = model.loop_info()["loop_0"].row_iterations.to("cpu").numpy()
    assert len(set(rows.tolist())) >= 3  # halting differed per row, and ONNX agreed
    assert "Loop" in _ops(proto)


def test_learned_halt_until(device, tmp_path):
    fg.manual_seed(3)
    model = (FlowBuilder.from_(nn.Linear(4, 8)).loop_body(Scale(8)).until_cond(nn.LearnedHalt(8), 5)
             .build().to(device))
    export_and_compare(model, (fg.randn(9, 4, device=device),), tmp_path / "m.onnx")


def test_map_each_over_and_slices(device, tmp_path):
    fg.manual_seed(0)
    each = FlowBuilder.from_(nn.Linear(6, 8)).map(Scale(8)).each().build().to(device)
    proto, _ = export_and_compare(each, (fg.randn(5, 6, device=device),), tmp_path / "each.onnx")
    assert "Loop" in _ops(proto)
    over = (FlowBuilder.from_(nn.Linear(6, 8)).tag("h").through(nn.Linear(8, 8)).map(nn.Linear(8, 3)).over("h")
            .build().to(device))
    export_and_compare(over, (fg.randn(5, 6, device=device),), tmp_path / "over.onnx")
    for batched in (False, True):
        mapped = FlowBuilder.from_(nn.Linear(6, 8)).map(nn.Linear(2, 3))
        m = (mapped.batched().slices(4) if batched else mapped.slices(4)).build().to(device)
        export_and_compare(m, (fg.randn(5, 6, device=device),), tmp_path / "slices.onnx")


LAYERS = {
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU(), nn.MaxPool1d(2),
                                     nn.Conv1d(4, 2, 3, padding="same", dilation=2), nn.AvgPool1d(2),
                                     nn.Flatten()), (2, 3, 16)),
    "conv2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Sigmoid(), nn.AvgPool2d(2),
                                     nn.Conv2d(4, 4, 1, groups=2), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                                     nn.Dropout(0.5), nn.Linear(4, 3), nn.Softmax(-1)), (2, 3, 16, 16)),
    "conv_transpose": (lambda: nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
                                             nn.ConvTranspose2d(4, 2, 2, groups=2, dilation=2)), (1, 3, 5, 5)),
    "conv3d": (lambda: nn.Sequential(nn.Conv3d(2, 3, 3, padding=1), nn.ConvTranspose3d(3, 2, 2, stride=2)),
               (1, 2, 4, 4, 4)),
    "transformer": (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), (2, 5, 16)),
    "norms": (lambda: nn.Sequential(nn.GroupNorm(2, 4), nn.InstanceNorm2d(4), nn.Upsample(scale_factor=2),
                                    nn.MaxPool2d(3, 2, ceil_mode=True)), (2, 4, 6, 6)),
    "activations": (lambda: nn.Sequential(nn.Linear(5, 6), nn.LeakyReLU(0.1), nn.ELU(), nn.SiLU(), nn.LayerNorm(6)),
                    (2, 3, 5)),
    "gru": (lambda: nn.GRU(5, 7, num_layers=2, batch_first=True), (2, 6, 5)),
    "lstm": (lambda: nn.LSTM(5, 7, bidirectional=True), (6, 2, 5)),
    "rnn": (lambda: nn.RNN(5, 7, nonlinearity="relu"), (6, 2, 5)),
    "attention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), None),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers(device, name, tmp_path):
    fg.manual_seed(0)
    make, shape = LAYERS[name]
    model = make().to(device)
    if shape is None:  # self-attention: query = key = value
        q = fg.randn(2, 5, 8, device=device)
        export_and_compare(model, (q, q, q), tmp_path / "m.onnx")
    else:
        export_and_compare(model, (fg.randn(*shape, device=device),), tmp_path / "m.onnx")


def test_rnn_layers_use_onnx_recurrent_operators(tmp_path):
    fg.manual_seed(0)
    for cls, op in ((nn.GRU, "GRU"), (nn.LSTM, "LSTM"), (nn.RNN, "RNN")):
        proto = fg.onnx.export(cls(3, 4), fg.randn(5, 2, 3), tmp_path / "m.onnx")
        assert op in _ops(proto)


def test_embedding(device, tmp_path):
    fg.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten()).to(device)
    idx = fg.tensor([[1, 2, 3], [9, 0, 4]], device=device)
    proto, _ = export_and_compare(model, (idx,), tmp_path / "m.onnx")
    assert "Gather" in _ops(proto)


def test_dynamic_batch(tmp_path):
    fg.manual_seed(0)
    model = (FlowBuilder.from_(nn.Linear(6, 8)).through(nn.GELU()).map(nn.Linear(2, 2)).slices(4)
             .gate(nn.SoftmaxRouter(8, 2), [nn.Linear(8, 8), nn.Linear(8, 8)])
             .switch(nn.ArgmaxSelector(8, 2), [nn.Linear(8, 8), nn.Linear(8, 8)]).map(nn.Linear(8, 8)).each()
             .loop_body(nn.Tanh()).until_cond(nn.LearnedHalt(8), 3)
             .split(nn.Linear(8, 4), nn.Linear(8, 4)).merge(MergeOp.CAT)
             .through(nn.Linear(8, 2)).build())
    fg.onnx.export(model, fg.randn(4, 6), tmp_path / "m.onnx", input_names=["x"], output_names=["y"],
                   dynamic_axes={"x": {0: "batch"}, "y": [0]})
    x = fg.randn(11, 6)
    (got,) = run_onnx(tmp_path / "m.onnx", (x,), ["x"])
    np.testing.assert_allclose(got, flowgraph_outputs(model, (x,))[0], rtol=1e-5, atol=1e-5)


def test_export_restores_modes_and_does_not_need_a_path():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.2))
    model.train()
    proto = fg.onnx.export(model, fg.randn(3, 2), None)
    assert model.training and model[1].training
    assert proto.graph.output[0].name == "output_0"


class Sorts(nn.Module):
    def forward(self, x):
        return x.sort(-1)[0]


class Writes(nn.Module):
    def forward(self, x):
        y = x * 1
        y[:, 0] = 0.0
        return y


def test_unexportable_constructs_name_the_node_path(tmp_path):
    inner = FlowBuilder.from_(nn.Linear(4, 4)).through(Sorts()).tag("sorted").label("encoder").build()
    model = FlowBuilder.from_(inner).through(nn.Linear(4, 2)).build()
    with pytest.raises(fg.FlowError, match=r"encoder\.sorted.*argsort"):
        fg.onnx.export(model, fg.randn(3, 4), tmp_path / "m.onnx")
    writes = FlowBuilder.from_(nn.Linear(4, 4)).through(Writes()).tag("writer").build()
    with pytest.raises(fg.FlowError, match=r"writer.*in-place"):
        fg.onnx.export(writes, fg.randn(3, 4), tmp_path / "m.onnx")
    shapes = FlowBuilder.from_(nn.Linear(4, 4)).switch(nn.FixedSelector(0), [nn.Linear(4, 2), nn.Linear(4, 3)])
    with pytest.raises(fg.FlowError, match=r"switch_0.*different shapes"):
        fg.onnx.export(shapes.build(), fg.randn(3, 4), tmp_path / "m.onnx")


class DataDependent(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum().item() > 0 else x * 3  # Python control flow on a value: fixed by tracing


def test_host_reads_in_a_traced_forward_warn_with_the_path(tmp_path):
    model = FlowBuilder.from_(nn.Linear(4, 4)).through(DataDependent()).tag("branchy").build()
    with pytest.warns(RuntimeWarning, match=r"branchy read tensor values on the host"):
        fg.onnx.export(model, fg.randn(3, 4), tmp_path / "m.onnx")


def test_graph_hooks_run_and_loops_keep_their_form(tmp_path):
    calls = []
    model = FlowBuilder.from_(nn.Linear(4, 4)).loop_body(Step()).while_cond(nn.ThresholdHalt(1.0), 4).build()
    model.register_forward_hook(lambda m, args, out: calls.append(tuple(out.shape)))
    proto = fg.onnx.export(model, fg.randn(3, 4), tmp_path / "m.onnx")
    assert "Loop" in _ops(proto) and calls[0] == (3, 4)


def test_without_the_onnx_package_the_error_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    with pytest.raises(fg.FlowError, match=r"pip install 'flowgraph\[onnx\]'"):
        fg.onnx.export(nn.Linear(2, 2), fg.randn(1, 2), None)


def test_bad_arguments():
    model = nn.Linear(2, 2)
    with pytest.raises(fg.FlowError, match="opset_version"):
        fg.onnx.export(model, fg.randn(1, 2), None, opset_version=13)
    with pytest.raises(fg.FlowError, match="sample must be a Tensor"):
        fg.onnx.export(model, [[1.0, 2.0]], None)
    with pytest.raises(fg.FlowError, match="input_names must be 1"):
        fg.onnx.export(model, fg.randn(1, 2), None, input_names=["a", "b"])
    with pytest.raises(fg.FlowError, match="output_names must be 1"):
        fg.onnx.export(model, fg.randn(1, 2), None, output_names=[])
    with pytest.raises(fg.FlowError, match="dynamic_axes names"):
        fg.onnx.export(model, fg.randn(1, 2), None, dynamic_axes={"nope": [0]})
    with pytest.raises(fg.FlowError, match="model must be an nn.Module"):
        fg.onnx.export(lambda x: x, fg.randn(1, 2), None)
