"""Bad values at every public entry point that takes a shape, a dtype, a device, an index, a path, a module or
a callable give a flowgraph error (or the documented Python exception flowgraph's errors derive from) whose
message names the argument.

Each row: (id, call, expected exception, words the message must contain). Tensor rows run on every backend;
the others do not touch a device. ``tests/tensor/test_bad_input.py`` holds the numeric cases (overflow,
division by zero, in-place on views).
"""

from __future__ import annotations

import os

import pytest

import flowgraph as fg
from flowgraph import distributed as dist
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder, MergeOp
from flowgraph.monitor import Monitor

L = nn.Linear


def _x(d):
    return fg.arange(6, dtype=fg.float32, device=d).reshape(2, 3)


def _setitem(d, index, value):
    x = _x(d)
    x[index] = value
    return x


# -- tensors: creation, conversion, shapes, indexing (run on every backend) ----------------------------------

DEVICE_CASES = [
    ("zeros negative size", lambda d: fg.zeros(2, -3, device=d), fg.ShapeError, ["size", "-3", ">= 0"]),
    ("ones float size", lambda d: fg.ones(2.5, device=d), fg.FlowError, ["size", "2.5", "int"]),
    ("zeros string size", lambda d: fg.zeros("3", device=d), fg.FlowError, ["size", "'3'"]),
    ("zeros nested tuple size", lambda d: fg.zeros((2, (3,)), device=d), fg.FlowError, ["size", "(3,)"]),
    ("zeros bool size", lambda d: fg.zeros(True, device=d), fg.FlowError, ["size", "True"]),
    ("full negative size", lambda d: fg.full((-1, 2), 1.0, device=d), fg.ShapeError, ["size", "-1"]),
    ("rand float size", lambda d: fg.rand(2, 1.5, device=d), fg.FlowError, ["size", "1.5"]),
    ("randn negative size", lambda d: fg.randn(-4, device=d), fg.ShapeError, ["size", "-4"]),
    ("empty negative size", lambda d: fg.empty(3, -1, device=d), fg.ShapeError, ["size", "-1"]),
    ("unknown dtype string", lambda d: fg.zeros(2, dtype="float33", device=d), fg.FlowError,
     ["dtype", "'float33'"]),
    ("dtype not a dtype", lambda d: fg.zeros(2, dtype=5, device=d), fg.FlowError, ["dtype", "5"]),
    ("dtype a Python class", lambda d: fg.ones(2, dtype=dict, device=d), fg.FlowError, ["dtype", "dict"]),
    ("tensor unknown dtype", lambda d: fg.tensor([1.0], dtype="int128", device=d), fg.FlowError,
     ["dtype", "'int128'"]),
    ("tensor ragged nested list", lambda d: fg.tensor([[1.0, 2.0], [3.0]], device=d), fg.FlowError,
     ["data", "ragged"]),
    ("tensor of a string", lambda d: fg.tensor("abc", device=d), fg.FlowError, ["data", "'abc'"]),
    ("tensor of a dict", lambda d: fg.tensor({"a": 1}, device=d), fg.FlowError, ["data", "dict"]),
    ("arange zero step", lambda d: fg.arange(0, 5, 0, device=d), fg.FlowError, ["step", "0"]),
    ("arange wrong direction", lambda d: fg.arange(5, 0, 1, device=d), fg.FlowError, ["step", "end"]),
    ("linspace negative steps", lambda d: fg.linspace(0, 1, -1, device=d), fg.FlowError, ["steps", "-1"]),
    ("linspace float steps", lambda d: fg.linspace(0, 1, 2.5, device=d), fg.FlowError, ["steps", "2.5"]),
    ("eye negative n", lambda d: fg.eye(-2, device=d), fg.FlowError, ["n", "-2"]),
    ("randint empty range", lambda d: fg.randint(5, 2, (3,), device=d), fg.FlowError, ["high", "low"]),
    ("rand integer dtype", lambda d: fg.rand(2, dtype=fg.int64, device=d), fg.FlowError, ["dtype", "int64"]),
    ("requires_grad on integers", lambda d: fg.zeros(2, dtype=fg.int64, requires_grad=True, device=d),
     fg.FlowError, ["requires_grad", "floating"]),
    ("to unknown device", lambda d: _x(d).to("tpu"), fg.BackendError, ["device", "'tpu'"]),
    ("to unknown dtype", lambda d: _x(d).to(dtype="float99"), fg.FlowError, ["dtype", "'float99'"]),
    ("zeros_like of a list", lambda d: fg.zeros_like([1, 2]), fg.FlowError, ["input", "list"]),
    ("reshape two -1", lambda d: _x(d).reshape(-1, -1), fg.ShapeError, ["shape", "-1"]),
    ("reshape float", lambda d: _x(d).reshape(2.5), fg.FlowError, ["shape", "2.5"]),
    ("reshape wrong count", lambda d: _x(d).reshape(4, 2), fg.ShapeError, ["shape", "6"]),
    ("view wrong count", lambda d: _x(d).view(7), fg.ShapeError, ["7", "6"]),
    ("permute not a permutation", lambda d: _x(d).permute(0, 0), fg.ShapeError, ["dims", "(0, 0)", "repeat"]),
    ("sum dim out of range", lambda d: _x(d).sum(dim=5), fg.IndexOutOfRangeError, ["dim", "5"]),
    ("transpose dim out of range", lambda d: _x(d).transpose(0, 3), fg.IndexOutOfRangeError, ["dim", "3"]),
    ("index with a string", lambda d: _x(d)["a"], fg.FlowError, ["index", "'a'"]),
    ("index with a float", lambda d: _x(d)[1.5], fg.FlowError, ["index", "1.5"]),
    ("index with a dict", lambda d: _x(d)[{"a": 1}], fg.FlowError, ["index", "dict"]),
    ("too many indices", lambda d: _x(d)[0, 0, 0], IndexError, ["too many indices", "2"]),
    ("two ellipses", lambda d: _x(d)[..., 0, ...], fg.FlowError, ["ellipsis", "single"]),
    ("slice step zero", lambda d: _x(d)[0:2:0], fg.FlowError, ["step", "0"]),
    ("slice with a float bound", lambda d: _x(d)[0:1.5], fg.FlowError, ["slice", "1.5"]),
    ("bool mask shape mismatch", lambda d: _x(d)[fg.tensor([True, False, True], device=d)], fg.ShapeError,
     ["mask", "(3,)", "(2,)"]),
    ("float tensor index", lambda d: _x(d)[fg.tensor([0.5], device=d)], fg.FlowError,
     ["index", "float32", "integer"]),
    ("list index with a float", lambda d: _x(d)[[0, 1.5]], fg.FlowError, ["index", "1.5"]),
    ("negative index past the start", lambda d: _x(d)[-3], IndexError, ["-3", "out of bounds"]),
    ("setitem value of the wrong shape", lambda d: _setitem(d, 0, fg.ones(5, device=d)), fg.ShapeError,
     ["(5,)", "(3,)"]),
    ("setitem string value", lambda d: _setitem(d, 0, "x"), fg.FlowError, ["value", "'x'"]),
    ("nn.Linear negative features", lambda d: L(-1, 3), fg.FlowError, ["in_features", "-1"]),
    ("nn.Linear float features", lambda d: L(2, 2.5), fg.FlowError, ["out_features", "2.5"]),
    ("module to an unknown device", lambda d: L(2, 2).to("cuda:abc"), fg.BackendError, ["device", "'cuda:abc'"]),
]


@pytest.mark.parametrize("case", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_bad_tensor_input(device, case):
    _, call, error, words = case
    with pytest.raises(error) as info:
        call(device)
    _check(info.value, words)


# -- devices, builder verbs, tree paths, checkpoints, monitor (no device involved) ---------------------------


def _graph():
    inner = FlowBuilder.from_(L(2, 2)).label("encoder").build()
    return FlowBuilder.from_(inner).through(L(2, 2)).tag("head").build()


def _saved(tmp):
    path = tmp / "model.safetensors"
    _graph().save_checkpoint(path)
    return path


def _text_file(tmp):
    path = tmp / "notes.safetensors"
    path.write_text("not a checkpoint")
    return path


def _fifo(tmp):
    path = tmp / "pipe.safetensors"
    os.mkfifo(path)
    return path


def _monitor():
    return Monitor(3, quiet=True)


def _serve(**kwargs):
    mon = _monitor()
    try:
        return mon.serve(**kwargs)
    finally:
        mon.close()


HOST_CASES = [
    ("device malformed cuda index", lambda tmp: fg.zeros(2, device="cuda:abc"), fg.BackendError,
     ["device", "'cuda:abc'"]),
    ("device unknown kind", lambda tmp: fg.zeros(2, device="tpu"), fg.BackendError, ["device", "'tpu'", "cpu"]),
    ("device index out of range", lambda tmp: fg.zeros(2, device="cpu:7"), fg.BackendError, ["device", "'cpu:7'"]),
    ("device negative index", lambda tmp: fg.zeros(2, device="opencl:-1"), fg.BackendError,
     ["device", "'opencl:-1'"]),
    ("device opencl index past the last", lambda tmp: fg.zeros(2, device="opencl:99"), fg.BackendError,
     ["opencl:99", "available"]),
    ("device not a string", lambda tmp: fg.zeros(2, device=3.5), fg.BackendError, ["device", "3.5"]),
    ("device empty string", lambda tmp: fg.zeros(2, device=""), fg.BackendError, ["device", "''"]),
    # builder verbs
    ("from_ a number", lambda tmp: FlowBuilder.from_(5).build(), fg.FlowError, [".from_(", "nn.Module"]),
    ("through a string", lambda tmp: FlowBuilder.from_(L(2, 2)).through("linear").build(), fg.FlowError,
     [".through(", "nn.Module"]),
    ("through a module class", lambda tmp: FlowBuilder.from_(L(2, 2)).through(nn.ReLU).build(), fg.FlowError,
     [".through(", "class ReLU", "ReLU(...)"]),
    ("also a function", lambda tmp: FlowBuilder.from_(L(2, 2)).also(abs).build(), fg.FlowError,
     [".also(", "nn.Module"]),
    ("split a None branch", lambda tmp: FlowBuilder().split(L(2, 2), None).merge(MergeOp.ADD).build(),
     fg.FlowError, [".split(", "nn.Module"]),
    ("split one branch", lambda tmp: FlowBuilder().split(L(2, 2)).merge(MergeOp.ADD).build(), fg.FlowError,
     [".split(", "at least 2"]),
    ("merge unknown op name", lambda tmp: FlowBuilder().split(L(2, 2), L(2, 2)).merge("concat").build(),
     fg.FlowError, [".merge('concat')", "MergeOp"]),
    ("merge a number", lambda tmp: FlowBuilder().split(L(2, 2), L(2, 2)).merge(5).build(), fg.FlowError,
     [".merge(5)", "MergeOp"]),
    ("using an unknown tag", lambda tmp: FlowBuilder().tag("a").through(nn.StateAdd()).using("b").build(),
     fg.FlowError, [".using('b')", "unknown tag"]),
    ("using a non-string", lambda tmp: FlowBuilder().tag("a").through(nn.StateAdd()).using(3).build(),
     fg.FlowError, [".using(3)", "tag name"]),
    ("tag not a string", lambda tmp: FlowBuilder().tag(5).build(), fg.FlowError, [".tag(5)", "string"]),
    ("tag empty", lambda tmp: FlowBuilder().tag("").build(), fg.FlowError, [".tag('')", "non-empty string"]),
    ("label not a string", lambda tmp: FlowBuilder().label(7).build(), fg.FlowError, [".label(7)", "string"]),
    ("input not a string", lambda tmp: FlowBuilder().input(7).build(), fg.FlowError,
     [".input(7)", "an input name", "string"]),
    ("for_n negative", lambda tmp: FlowBuilder().loop_body(L(2, 2)).for_n(-1).build(), fg.FlowError,
     [".for_n(-1)", ">= 1"]),
    ("for_n float", lambda tmp: FlowBuilder().loop_body(L(2, 2)).for_n(1.5).build(), fg.FlowError,
     [".for_n(1.5)", "integer"]),
    ("for_n bool", lambda tmp: FlowBuilder().loop_body(L(2, 2)).for_n(True).build(), fg.FlowError,
     [".for_n(True)", "integer"]),
    ("until max_iter float", lambda tmp: FlowBuilder().loop_body(L(2, 2)).until_cond(nn.ThresholdHalt(0), 2.5)
     .build(), fg.FlowError, ["until_cond(", "max_iter"]),
    ("while condition not a module", lambda tmp: FlowBuilder().loop_body(L(2, 2)).while_cond(lambda x: x, 3)
     .build(), fg.FlowError, ["while_cond(", "nn.Module"]),
    ("loop body not a module", lambda tmp: FlowBuilder().loop_body("body").for_n(2).build(), fg.FlowError,
     [".loop_body(", "nn.Module"]),
    ("gate with no experts", lambda tmp: FlowBuilder().gate(nn.SoftmaxRouter(2, 2), []).build(), fg.FlowError,
     [".gate(", "at least 2 experts"]),
    ("gate router not a module", lambda tmp: FlowBuilder().gate(None, [L(2, 2), L(2, 2)]).build(),
     fg.FlowError, [".gate(", "nn.Module"]),
    ("switch with no branches", lambda tmp: FlowBuilder().switch(nn.FixedSelector(0), []).build(),
     fg.FlowError, [".switch(", "branches"]),
    ("map slices zero", lambda tmp: FlowBuilder().map(L(2, 2)).slices(0).build(), fg.FlowError,
     [".slices(0)", ">= 1"]),
    ("switch selector not a module", lambda tmp: FlowBuilder().switch(0, [L(2, 2), L(2, 2)]).build(),
     fg.FlowError, [".switch(", "nn.Module"]),
    ("build sample not a tensor", lambda tmp: FlowBuilder.from_(L(2, 2)).build(sample="x"), fg.FlowError,
     ["sample", "'x'"]),
    # graph-tree paths
    ("freeze unknown path", lambda tmp: _graph().freeze("no.such.path"), fg.PathError, ["'no.such.path'"]),
    ("freeze a number", lambda tmp: _graph().freeze(5), fg.PathError, ["path", "5", "int"]),
    ("freeze None", lambda tmp: _graph().freeze(None), fg.PathError, ["path", "None"]),
    ("thaw unknown path", lambda tmp: _graph().thaw("encodr"), fg.PathError, ["'encodr'", "encoder"]),
    ("is_frozen empty path", lambda tmp: _graph().is_frozen(""), fg.PathError, ["path", "''"]),
    ("parameters_at unknown", lambda tmp: _graph().parameters_at("decoder"), fg.PathError, ["'decoder'"]),
    ("validate_path a list", lambda tmp: _graph().validate_path(["encoder"]), fg.PathError, ["path", "list"]),
    ("set_training_at non-bool", lambda tmp: _graph().set_training_at("encoder", "yes"), fg.FlowError,
     ["mode", "'yes'", "bool"]),
    ("record a string value", lambda tmp: _graph().record("loss", "high"), fg.FlowError, ["value", "'high'"]),
    ("record a non-string name", lambda tmp: _graph().record(5, 1.0), fg.FlowError, ["name", "5"]),
    ("collect bad reduce", lambda tmp: _graph().collect("head", reduce="median"), fg.FlowError,
     ["reduce", "'median'"]),
    ("trend of an unknown metric", lambda tmp: _graph().trend("los"), fg.FlowError, ["'los'"]),
    # checkpoints
    ("save to a directory", lambda tmp: _graph().save_checkpoint(tmp), fg.CheckpointError,
     ["path", "directory"]),
    ("save under a regular file", lambda tmp: _graph().save_checkpoint(_text_file(tmp) / "m.safetensors"),
     fg.CheckpointError, ["path", "Not a directory"]),
    ("save to a path of wrong type", lambda tmp: _graph().save_checkpoint(5), fg.CheckpointError,
     ["path", "5"]),
    ("save over a FIFO", lambda tmp: _graph().save_checkpoint(_fifo(tmp)), fg.CheckpointError,
     ["path", "not a regular file"]),
    ("load a missing file", lambda tmp: _graph().load_checkpoint(tmp / "missing.safetensors"),
     fg.CheckpointError, ["missing.safetensors", "No such file"]),
    ("load a directory", lambda tmp: _graph().load_checkpoint(tmp), fg.CheckpointError, ["regular file"]),
    ("load a text file", lambda tmp: _graph().load_checkpoint(_text_file(tmp)), fg.CheckpointError,
     ["notes.safetensors", "safetensors"]),
    ("load a path of wrong type", lambda tmp: _graph().load_checkpoint(None), fg.CheckpointError,
     ["path", "None"]),
    ("load_subgraph at an unknown path", lambda tmp: _graph().load_subgraph_checkpoint("dec", _saved(tmp)),
     fg.PathError, ["'dec'"]),
    ("migrate from a missing file", lambda tmp: fg.migrate_checkpoint(tmp / "a.safetensors",
                                                                      tmp / "b.safetensors", _graph()),
     fg.CheckpointError, ["a.safetensors", "No such file"]),
    # monitor
    ("monitor zero epochs", lambda tmp: Monitor(0), fg.FlowError, ["total_epochs", "0"]),
    ("monitor negative epochs", lambda tmp: Monitor(-5), fg.FlowError, ["total_epochs", "-5"]),
    ("monitor float epochs", lambda tmp: Monitor(2.5), fg.FlowError, ["total_epochs", "2.5"]),
    ("monitor eta_window zero", lambda tmp: Monitor(3, eta_window=0), fg.FlowError, ["eta_window", "0"]),
    ("monitor csv_path in a missing folder", lambda tmp: Monitor(3, csv_path=tmp / "no" / "run.csv"),
     fg.FlowError, ["csv_path", "does not exist"]),
    ("monitor report_path in a missing folder", lambda tmp: Monitor(3, report_path=tmp / "no" / "r.html"),
     fg.FlowError, ["report_path", "does not exist"]),
    ("monitor csv_path a directory", lambda tmp: Monitor(3, csv_path=tmp), fg.FlowError,
     ["csv_path", "directory"]),
    ("serve negative port", lambda tmp: _serve(port=-1), fg.FlowError, ["port", "-1"]),
    ("serve port too large", lambda tmp: _serve(port=70000), fg.FlowError, ["port", "70000"]),
    ("serve port a string", lambda tmp: _serve(port="3000"), fg.FlowError, ["port", "'3000'"]),
    ("serve unknown host", lambda tmp: _serve(port=0, host="no-such-host.invalid"), fg.FlowError,
     ["host", "no-such-host.invalid"]),
    ("log epoch past total", lambda tmp: _monitor().log(3, 0.1, {"loss": 1.0}), fg.FlowError, ["epoch", "3"]),
    ("log negative seconds", lambda tmp: _monitor().log(0, -1.0, {"loss": 1.0}), fg.FlowError,
     ["seconds", "-1.0"]),
    ("log seconds a string", lambda tmp: _monitor().log(0, "fast", {"loss": 1.0}), fg.FlowError,
     ["seconds", "'fast'"]),
    ("log metric value a string", lambda tmp: _monitor().log(0, 0.1, {"loss": "low"}), fg.FlowError,
     ["loss", "'low'"]),
    ("log metric value a list", lambda tmp: _monitor().log(0, 0.1, {"loss": [1.0, 2.0]}), fg.FlowError,
     ["loss", "list"]),
    ("log metric name not a string", lambda tmp: _monitor().log(0, 0.1, {5: 1.0}), fg.FlowError,
     ["metric name", "5"]),
    ("log metrics not a mapping", lambda tmp: _monitor().log(0, 0.1, 5), fg.FlowError, ["metric", "got int"]),
    ("finish unknown status", lambda tmp: _monitor().finish("done"), fg.FlowError, ["status", "'done'"]),
    ("progress negative step", lambda tmp: _monitor().progress(-1), fg.FlowError, ["step", "-1"]),
    # module constructors: sizes, windows and counts
    ("Conv2d kernel_size 0", lambda tmp: nn.Conv2d(3, 4, 0), fg.FlowError, ["kernel_size", ">= 1"]),
    ("Conv2d stride 0", lambda tmp: nn.Conv2d(3, 4, 3, stride=0), fg.FlowError, ["stride", ">= 1"]),
    ("Conv2d negative padding", lambda tmp: nn.Conv2d(3, 4, 3, padding=-1), fg.FlowError, ["padding", ">= 0"]),
    ("Conv1d unknown padding string", lambda tmp: nn.Conv1d(3, 4, 3, padding="big"), fg.FlowError,
     ["padding", "'big'"]),
    ("Conv2d channels not divisible by groups", lambda tmp: nn.Conv2d(3, 4, 3, groups=2), fg.FlowError,
     ["in_channels", "groups"]),
    ("MaxPool2d kernel_size 0", lambda tmp: nn.MaxPool2d(0), fg.FlowError, ["MaxPool2d", "kernel_size"]),
    ("AvgPool2d negative kernel_size", lambda tmp: nn.AvgPool2d(-2), fg.FlowError, ["AvgPool2d", "kernel_size"]),
    ("Embedding negative num_embeddings", lambda tmp: nn.Embedding(-3, 2), fg.FlowError,
     ["num_embeddings", "-3"]),
    ("LayerNorm negative normalized_shape", lambda tmp: nn.LayerNorm(-4), fg.FlowError,
     ["normalized_shape", "-4"]),
    ("RMSNorm string normalized_shape", lambda tmp: nn.RMSNorm("4"), fg.FlowError, ["normalized_shape", "'4'"]),
    ("GroupNorm channels not divisible", lambda tmp: nn.GroupNorm(3, 4), fg.FlowError,
     ["num_channels", "num_groups"]),
    ("LSTM zero layers", lambda tmp: nn.LSTM(4, 3, num_layers=0), fg.FlowError, ["num_layers", "0"]),
    ("Unflatten negative size", lambda tmp: nn.Unflatten(1, (2, -3)), fg.FlowError,
     ["unflattened_size", "(2, -3)"]),
    ("MultiheadAttention heads not dividing", lambda tmp: nn.MultiheadAttention(10, 3), fg.FlowError,
     ["embed_dim", "num_heads"]),
    ("SoftmaxRouter zero experts", lambda tmp: nn.SoftmaxRouter(4, 0), fg.FlowError, ["SoftmaxRouter", "n"]),
    ("ThresholdHalt string threshold", lambda tmp: nn.ThresholdHalt("x"), fg.FlowError, ["threshold", "'x'"]),
    ("Sequential with a number", lambda tmp: nn.Sequential(nn.ReLU(), 5), fg.FlowError, ["int", "Module"]),
    ("add_module dotted name", lambda tmp: nn.Module().add_module("a.b", nn.ReLU()), fg.FlowError,
     ["'a.b'", "'.'"]),
    # tensor functions taking counts or lists
    ("stack of numbers", lambda tmp: fg.stack([1, 2]), fg.FlowError, ["stack", "tensors", "int"]),
    ("chunk into 0", lambda tmp: fg.ones(4).chunk(0), fg.FlowError, ["chunks", "0"]),
    ("normal negative std", lambda tmp: fg.normal(0.0, -1.0, (3,)), fg.FlowError, ["std", "-1.0"]),
    ("manual_seed a string", lambda tmp: fg.manual_seed("abc"), fg.FlowError, ["seed", "'abc'"]),
    ("topk k past the size", lambda tmp: fg.ones(3).topk(5), fg.FlowError, ["k=5", "size 3"]),
    # user callables and numbers elsewhere
    ("gradcheck of a non-callable", lambda tmp: fg.gradcheck(5, (fg.ones(2, dtype=fg.float64),)), fg.FlowError,
     ["fn", "callable"]),
    ("module.apply a non-callable", lambda tmp: L(2, 2).apply("init"), fg.FlowError, ["fn", "'init'"]),
    ("optimizer negative lr", lambda tmp: optim.Adam(L(2, 2).parameters(), lr=-1.0), fg.FlowError,
     ["lr", "-1.0"]),
    ("Adam beta1 past 1", lambda tmp: optim.Adam(L(2, 2).parameters(), betas=(1.5, 0.9)), fg.FlowError,
     ["betas", "1.5"]),
    ("StepLR step_size 0", lambda tmp: optim.lr_scheduler.StepLR(optim.SGD(L(2, 2).parameters(), lr=0.1),
                                                                  step_size=0), fg.FlowError, ["step_size", "0"]),
    ("optimizer of a tensor", lambda tmp: optim.SGD(fg.ones(2), lr=0.1), fg.FlowError, ["params", "list"]),
    ("forward hook not callable", lambda tmp: L(2, 2).register_forward_hook(5), fg.FlowError,
     ["hook", "callable"]),
    ("tensor hook not callable", lambda tmp: fg.ones(2, requires_grad=True).register_hook("x"), fg.FlowError,
     ["hook", "callable", "'x'"]),
]


@pytest.mark.parametrize("case", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_bad_host_input(tmp_path, case):
    _, call, error, words = case
    with pytest.raises(error) as info:
        call(tmp_path)
    _check(info.value, words)


# -- distributed init: the environment the launcher sets -----------------------------------------------------

_GOOD_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}

DIST_CASES = [
    ("world size zero", {"WORLD_SIZE": "0"}, {}, ["WORLD_SIZE", "0"]),
    ("world size negative", {"WORLD_SIZE": "-2"}, {}, ["WORLD_SIZE", "-2"]),
    ("world size not a number", {"WORLD_SIZE": "two"}, {}, ["WORLD_SIZE", "'two'"]),
    ("rank negative", {"RANK": "-1"}, {}, ["RANK", "-1"]),
    ("rank equal to world size", {"RANK": "2", "WORLD_SIZE": "2"}, {}, ["RANK=2", "WORLD_SIZE=2"]),
    ("rank missing", {"RANK": None}, {}, ["RANK", "None"]),
    ("local rank negative", {"LOCAL_RANK": "-1"}, {}, ["LOCAL_RANK", "-1"]),
    ("master port not a number", {"MASTER_PORT": "29x"}, {}, ["MASTER_PORT", "'29x'"]),
    ("master port out of range", {"MASTER_PORT": "70000"}, {}, ["MASTER_PORT", "70000", "65535"]),
    ("master port zero", {"MASTER_PORT": "0"}, {}, ["MASTER_PORT", "0"]),
    ("master addr empty", {"MASTER_ADDR": ""}, {}, ["MASTER_ADDR", "''"]),
    ("unknown backend", {}, {"backend": "gloo"}, ["backend", "'gloo'"]),
    ("negative timeout", {}, {"backend": "local", "timeout": -1.0}, ["timeout", "-1.0"]),
    ("timeout a string", {}, {"backend": "local", "timeout": "5"}, ["timeout", "'5'"]),
]


@pytest.mark.parametrize("case", DIST_CASES, ids=[c[0] for c in DIST_CASES])
def test_bad_distributed_init(monkeypatch, case):
    _, env, kwargs, words = case
    for name, value in {**_GOOD_ENV, **env}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLOWGRAPH_STORE_SECRET", "x" * 32)
    with pytest.raises(fg.FlowError) as info:
        dist.init(**{"backend": "local", **kwargs})
    assert not dist.is_initialized()
    _check(info.value, words)


def _check(error: BaseException, words: list[str]) -> None:
    assert isinstance(error, fg.FlowError), f"{type(error).__name__} is not a flowgraph error: {error}"
    message = str(error)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_the_tables_hold_at_least_sixty_new_cases():
    assert len(DEVICE_CASES) + len(HOST_CASES) + len(DIST_CASES) >= 60

