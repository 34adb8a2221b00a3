"""``fg.onnx.export(model, sample, path)``: write a flowgraph model as an ONNX file.

How a model becomes ONNX:

- the model runs once on ``sample`` in eval mode, on the CPU, without gradients;
- a module with a direct ONNX form (``modules.py``: Linear, Conv, BatchNorm, LayerNorm, GRU/LSTM/RNN, pooling,
  Embedding, activations ...) is emitted as that operator;
- any other module (your own ``forward``) is traced: every backend primitive it calls becomes ONNX node(s)
  (``trace.py``);
- a ``Graph`` is walked node by node: ``through``/``also``/``split``-``merge``/``tag``-``using``/``gate`` are
  traced, loops become ONNX ``Loop`` (``for_n`` with a trip count, ``while``/``until`` with a condition output
  and per-row halting masks), ``switch`` runs every branch and picks rows with ``Where``, and ``map(...).each()``
  / ``.over(tag)`` becomes a ``Loop`` over the rows with a scan output.

Forward references (``.using(tag)`` before ``.tag(tag)``) carry state between calls; the exported model is
one call from a reset state (zeros or the tag's ``init``), so it matches ``graph.reset_state(); graph(x)``.
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..autograd.grad_mode import no_grad
from ..backends import get_backend
from ..builder.graph import Graph
from ..builder.nodes import AlsoNode, LoopNode, MapNode, Node, SwitchNode, _halt_mask, _row_view, call_with_refs
from ..errors import FlowError
from ..nn.module import Module
from ..tensor import Tensor, int64, ones, where
from .modules import converter_for
from .trace import Recorder, recording

MIN_OPSET = 17
# An export patches the CPU backend's primitives and Module.__call__ while the model runs: one at a time.
_EXPORT_LOCK = threading.Lock()


def _require_onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise FlowError("fg.onnx.export needs the onnx package: pip install 'flowgraph[onnx]' "
                        "(onnx, and onnxruntime to run the result)") from exc
    return onnx


def _flatten(value: Any, what: str) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        out: list[Tensor] = []
        for v in value:
            out.extend(_flatten(v, what))
        return out
    if value is None:
        return []
    raise FlowError(f"fg.onnx.export: the {what} must be Tensors (or tuples of them), got {type(value).__name__}")


def _on_cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value if value.device == "cpu" else value.to("cpu")
    if isinstance(value, (tuple, list)):
        return type(value)(_on_cpu(v) for v in value)
    return value


class _Exporter:
    """Runs the model once with the recorder on; Module calls and Graph nodes are routed through here."""

    def __init__(self, rec: Recorder, model: Module):
        self.rec = rec
        self.paths = {id(m): name for name, m in model.named_modules()}
        self.original_call = Module.__call__

    # ------------------------------------------------------------------ modules
    def call(self, module: Module, args: tuple, kwargs: dict) -> Any:
        rec = self.rec
        if not rec.recording:
            return self.original_call(module, *args, **kwargs)
        name = self.paths.get(id(module), type(module).__name__)
        with rec.at(name, module=True):
            if isinstance(module, Graph):  # walked here, so its loops, switches and maps keep their form
                for hook in list(module._forward_pre_hooks.values()):
                    result = hook(module, args)
                    if result is not None:
                        args = result if isinstance(result, tuple) else (result,)
                out = self.run_graph(module, args, kwargs)
                for hook in list(module._forward_hooks.values()):
                    result = hook(module, args, out)
                    if result is not None:
                        out = result
                return out
            convert = converter_for(module)
            if convert is not None and not kwargs and all(isinstance(a, Tensor) for a in args):
                names = [rec.value(a._data) for a in args]
                mark = len(rec.scope.nodes)
                with rec.paused():  # a converter reads parameters on the host: not the model's forward
                    out_names = convert(rec, module, names, args)
                if out_names is not None:
                    with rec.paused():
                        out = self.original_call(module, *args)
                    outs = _flatten(out, "module outputs")
                    if len(outs) != len(out_names):  # pragma: no cover - a converter bug
                        raise rec.fail(f"{type(module).__name__}'s ONNX form gave {len(out_names)} outputs for "
                                       f"{len(outs)}")
                    for t, n in zip(outs, out_names):
                        rec.bind(t._data, n)
                    return out
                del rec.scope.nodes[mark:]  # no direct form for this configuration: trace it
            return self.original_call(module, *args, **kwargs)

    # ------------------------------------------------------------------ graphs
    def run_graph(self, graph: Graph, inputs: tuple, named: dict) -> Any:
        """``Graph.forward``'s walk, with the nodes that need ONNX control flow emitted here."""
        values = graph._bind_inputs(inputs, named)
        for stream in range(len(graph.input_names) + 1):
            graph._store_tags(stream, values[stream])
        for node in graph._nodes:
            with self.rec.at(node.name):
                out = self.node(graph, node, values)
            values[node.output] = out
            graph._store_tags(node.output, out)
        return values[graph._output]

    def node(self, graph: Graph, node: Node, values: dict) -> Any:
        if isinstance(node, LoopNode):
            return self.loop(graph, node, values)
        if isinstance(node, SwitchNode):
            return self.switch(graph, node, values)
        if isinstance(node, MapNode) and node.mode != "slices" and not node.batched:
            return self.map_rows(graph, node, values)
        if isinstance(node, AlsoNode):  # every module called, so each gets its ONNX form (no fused LayerNorm)
            return node.run_modules(graph, values)
        return node.run(graph, values)

    def _real(self, graph: Graph, node: Node, values: dict, name: str) -> Tensor:
        """Run ``node`` for its true value (not recorded) and give that value the traced output's name."""
        with self.rec.paused():
            real = node.run(graph, values)
        if not isinstance(real, Tensor):
            raise self.rec.fail(f"returned {type(real).__name__}; only Tensor outputs can be exported")
        self.rec.bind(real._data, name)
        return real

    def loop(self, graph: Graph, node: LoopNode, values: dict) -> Tensor:
        rec = self.rec
        state = values[node.inputs[0]]
        if not isinstance(state, Tensor):
            raise rec.fail("the loop state must be a Tensor")
        refs = graph._resolve_refs(node, state, values)
        halting = node.mode != "for_n"
        batch = state.shape[0] if state.ndim else 1
        state_outer = rec.value(state._data)
        with rec.paused():
            active0 = ones(batch, dtype=_bool(), device="cpu")
        with rec.sub_scope(f"{node.name}_body") as body:
            it, cond_in, state_in = rec.fresh("iter"), rec.fresh("cond_in"), rec.fresh("state_in")
            body.inputs += [rec.helper.make_tensor_value_info(it, _onnx_type(rec, np.int64), []),
                            rec.helper.make_tensor_value_info(cond_in, _onnx_type(rec, np.bool_), []),
                            rec.value_info(state_in, state._data)]
            rec.bind(state._data, state_in)
            if not halting:
                new = call_with_refs(node.body, state, refs)
                if not isinstance(new, Tensor) or new.shape != state.shape or new.dtype != state.dtype:
                    raise rec.fail("an exported for_n loop body must keep the state's shape and dtype "
                                   f"{tuple(state.shape)} (ONNX Loop carries one fixed-type state)")
                outs = [rec.op("Identity", cond_in), rec.op("Identity", rec.value(new._data))]
                body.outputs += [rec.value_info(outs[0], np.asarray(True)), rec.value_info(outs[1], new._data)]
            else:
                active_in = rec.fresh("active_in")
                body.inputs.append(rec.value_info(active_in, active0._data))
                rec.bind(active0._data, active_in)
                active = active0
                if node.mode == "while":
                    active = active & ~_halt_mask(node.cond(state), batch, node.call)
                new = call_with_refs(node.body, state, refs)
                if not isinstance(new, Tensor) or new.shape != state.shape:
                    raise rec.fail(f"the loop body must keep the state's shape {tuple(state.shape)}")
                state_new = where(_row_view(active, state), new, state)
                if node.mode == "until":
                    active = active & ~_halt_mask(node.cond(state_new), batch, node.call)
                go = active.any()
                outs = [rec.op("Identity", rec.value(go._data)), rec.op("Identity", rec.value(state_new._data)),
                        rec.op("Identity", rec.value(active._data))]
                body.outputs += [rec.value_info(outs[0], np.asarray(True)),
                                 rec.value_info(outs[1], state_new._data), rec.value_info(outs[2], active._data)]
        body_graph = rec.helper.make_graph(body.nodes, body.name, body.inputs, body.outputs)
        trips = rec.const(np.asarray(node.count if not halting else node.max_iter, dtype=np.int64))
        loop_inputs = [trips, rec.const(np.asarray(True)), state_outer]
        if halting:  # every row active at first: True expanded to the state's rows (a free batch size)
            rows = rec.op("Slice", rec.op("Shape", state_outer), rec.ints([0]), rec.ints([1]))
            loop_inputs.append(rec.op("Expand", rec.const(np.asarray(True)), rows))
        outs = rec.node("Loop", loop_inputs, 2 if halting else 1, body=body_graph)
        return self._real(graph, node, values, outs[0])

    def switch(self, graph: Graph, node: SwitchNode, values: dict) -> Tensor:
        rec = self.rec
        x = values[node.inputs[0]]
        idx = call_with_refs(node.selector, x, graph._resolve_refs(node, x, values))
        if not isinstance(idx, Tensor):
            raise rec.fail(f"the selector returned {type(idx).__name__}; expected a Tensor")
        if idx.dtype.is_floating_point:
            idx = idx.floor()
        flat = idx.reshape(-1).to(int64)
        outs = [b(x) for b in node.branches]  # every branch runs; Where picks each row's
        if any(not isinstance(o, Tensor) or o.shape != outs[0].shape for o in outs):
            raise rec.fail("the switch's branches return different shapes "
                           f"{[tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__ for o in outs]}; "
                           "the exported switch runs every branch and selects with Where, which needs one shape")
        result = outs[-1]
        for b in range(len(outs) - 2, -1, -1):
            pick = flat == b
            if result.ndim:
                pick = pick.reshape((pick.shape[0],) + (1,) * (result.ndim - 1))
            result = where(pick, outs[b], result)
        return self._real(graph, node, values, rec.value(result._data))

    def map_rows(self, graph: Graph, node: MapNode, values: dict) -> Tensor:
        rec = self.rec
        x = values[node.inputs[0]]
        if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[0] == 0:
            raise rec.fail("map(...).each() exports over a tensor with at least one row")
        x_outer = rec.value(x._data)
        with rec.paused():
            row = x[0:1]
        with rec.sub_scope(f"{node.name}_rows") as body:
            it, cond_in = rec.fresh("iter"), rec.fresh("cond_in")
            body.inputs += [rec.helper.make_tensor_value_info(it, _onnx_type(rec, np.int64), []),
                            rec.helper.make_tensor_value_info(cond_in, _onnx_type(rec, np.bool_), [])]
            row_name = rec.op("Unsqueeze", rec.op("Gather", x_outer, it, axis=0), rec.ints([0]))
            rec.bind(row._data, row_name)
            y = node.body(row)
            if not isinstance(y, Tensor) or y.ndim == 0:
                raise rec.fail("the map body must return a Tensor with a row dim")
            outs = [rec.op("Identity", cond_in), rec.op("Identity", rec.value(y._data))]
            body.outputs += [rec.value_info(outs[0], np.asarray(True)), rec.value_info(outs[1], y._data)]
        body_graph = rec.helper.make_graph(body.nodes, body.name, body.inputs, body.outputs)
        n_rows = rec.op("Gather", rec.op("Shape", x_outer), rec.const(np.asarray(0, dtype=np.int64)), axis=0)
        scan = rec.node("Loop", [n_rows, rec.const(np.asarray(True))], 1, body=body_graph)[0]
        out = rec.op("Reshape", scan, rec.ints([-1] + list(y.shape[1:])))
        return self._real(graph, node, values, out)


def _bool() -> Any:
    from ..tensor import bool_

    return bool_


def _onnx_type(rec: Recorder, dtype: Any) -> int:
    return rec.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@contextmanager
def _routing_module_calls(exporter: _Exporter) -> Iterator[None]:
    original = Module.__call__

    def call(module: Module, *args: Any, **kwargs: Any) -> Any:
        return exporter.call(module, args, kwargs)

    Module.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        Module.__call__ = original  # type: ignore[method-assign]


def _snapshot(model: Module) -> list:
    modes = [(m, m.training) for m in model.modules()]
    states = [(m, dict(m._state)) for m in model.modules() if isinstance(m, Graph)]
    return [modes, states]


def _restore(snapshot: list) -> None:
    modes, states = snapshot
    for m, mode in modes:
        object.__setattr__(m, "training", mode)
    for m, state in states:
        m._state = state


def export(model: Module, sample: Any, path: str | os.PathLike | None, opset_version: int = 17,
           input_names: list[str] | None = None, output_names: list[str] | None = None,
           dynamic_axes: dict[str, Any] | None = None) -> Any:
    """Write ``model`` (a ``Graph`` or any ``nn.Module``) as an ONNX file; returns the ``onnx.ModelProto``.

    ``sample`` is the input (a Tensor, or a tuple for several inputs, e.g. a graph's ``.input()`` names): the
    model runs once on it in eval mode, and the file computes what ``model.eval(); model(*sample)`` does. The
    model is checked with ``onnx.checker.check_model`` before it is written (``path=None``: not written).

    ``input_names`` / ``output_names`` name the ONNX graph's inputs and outputs (default ``input_0``, ...,
    ``output_0``, ...); ``dynamic_axes`` maps a name to the dims that may vary, ``{"input_0": {0: "batch"}}``
    or ``{"input_0": [0]}`` (traced reshapes keep the batch dim free; tensors a forward creates with a
    batch-sized shape fix it). Needs ``pip install 'flowgraph[onnx]'``.

    While it runs, the CPU backend's primitives and ``Module.__call__`` are routed through the exporter
    (restored afterwards); exports are serialised, and other threads should not run CPU models meanwhile.

        fg.onnx.export(model, fg.randn(4, 8), "model.onnx")
        # onnxruntime.InferenceSession("model.onnx").run(None, {"input_0": x.numpy()})
    """
    onnx = _require_onnx()
    if not isinstance(model, Module):
        raise FlowError(f"fg.onnx.export: model must be an nn.Module (a Graph or a layer), got "
                        f"{type(model).__name__}")
    if not isinstance(opset_version, int) or opset_version < MIN_OPSET:
        raise FlowError(f"fg.onnx.export: opset_version must be an int >= {MIN_OPSET} (LayerNormalization), "
                        f"got {opset_version!r}")
    samples = list(sample) if isinstance(sample, (tuple, list)) else [sample]
    if not samples or not all(isinstance(s, Tensor) for s in samples):
        raise FlowError("fg.onnx.export: sample must be a Tensor or a tuple of Tensors (the model's inputs), got "
                        f"{type(sample).__name__}")
    if any(p.device != "cpu" for p in model.parameters()) or any(b.device != "cpu" for b in model.buffers()):
        model = copy.deepcopy(model).to("cpu")
    samples = [_on_cpu(s).detach() for s in samples]
    in_names = list(input_names) if input_names is not None else [f"input_{i}" for i in range(len(samples))]
    if len(in_names) != len(samples) or len(set(in_names)) != len(in_names):
        raise FlowError(f"fg.onnx.export: input_names must be {len(samples)} distinct names (one per sample "
                        f"tensor), got {input_names!r}")

    params = {}
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        params.setdefault(id(p._data), (name, p._data))
    rec = Recorder(opset_version, params)
    dims = _dynamic_dims(dynamic_axes)
    rec.dynamic_batch = any(0 in d for d in dims.values())
    for name, s in zip(in_names, samples):
        rec.main.inputs.append(rec.value_info(name, s._data, _shape(s, dims.get(name))))
        rec.bind(s._data, name)

    snapshot = _snapshot(model)
    exporter = _Exporter(rec, model)
    try:
        model.eval()
        for m in model.modules():
            if isinstance(m, Graph):
                m._state.clear()
        with _EXPORT_LOCK, no_grad(), recording(get_backend("cpu"), rec), _routing_module_calls(exporter):
            out = model(*samples)
    finally:
        _restore(snapshot)
    if rec.host_reads:
        warnings.warn(
            f"fg.onnx.export: {', '.join(sorted(rec.host_reads))} read tensor values on the host (.item(), "
            ".tolist(), .numpy()) while traced; Python control flow that depends on them is fixed to this "
            "sample's values in the ONNX file (write it with tensor ops, e.g. fg.where, to keep it general)",
            RuntimeWarning, stacklevel=2)
    outs = _flatten(out, "model outputs")
    out_names = list(output_names) if output_names is not None else [f"output_{i}" for i in range(len(outs))]
    if len(out_names) != len(outs):
        raise FlowError(f"fg.onnx.export: output_names must be {len(outs)} names (one per output tensor), got "
                        f"{output_names!r}")
    unknown = set(dims) - set(in_names) - set(out_names)
    if unknown:
        raise FlowError(f"fg.onnx.export: dynamic_axes names {sorted(unknown)} are neither inputs {in_names} nor "
                        f"outputs {out_names}")
    for name, t in zip(out_names, outs):
        rec.main.nodes.append(rec.helper.make_node("Identity", [rec.value(t._data)], [name],
                                                   name=rec.fresh("n_output")))
        rec.main.outputs.append(rec.value_info(name, t._data, _shape(t, dims.get(name))))
    graph = rec.helper.make_graph(rec.main.nodes, type(model).__name__, rec.main.inputs, rec.main.outputs,
                                  rec.main.initializers)
    proto = rec.helper.make_model(graph, opset_imports=[rec.helper.make_opsetid("", opset_version)],
                                  producer_name="flowgraph")
    if opset_version <= 17:  # IR 8 is what opset 17 came with: runtimes of that era load the file too
        proto.ir_version = min(proto.ir_version, 8)
    onnx.checker.check_model(proto, full_check=True)
    if path is not None:
        onnx.save(proto, os.fspath(path))
    return proto


def _dynamic_dims(dynamic_axes: Any) -> dict[str, dict[int, str]]:
    if dynamic_axes is None:
        return {}
    if not isinstance(dynamic_axes, dict):
        raise FlowError(f"fg.onnx.export: dynamic_axes must be a dict name -> {{dim: 'name'}} or [dims], got "
                        f"{type(dynamic_axes).__name__}")
    out = {}
    for name, axes in dynamic_axes.items():
        if isinstance(axes, dict):
            out[name] = {int(k): str(v) for k, v in axes.items()}
        elif isinstance(axes, (list, tuple)):
            out[name] = {int(k): f"{name}_dim{k}" for k in axes}
        else:
            raise FlowError(f"fg.onnx.export: dynamic_axes[{name!r}] must be a dict or a list of dims, got "
                            f"{axes!r}")
    return out


def _shape(t: Tensor, dims: dict[int, str] | None) -> list:
    shape: list = list(t.shape)
    for k, label in (dims or {}).items():
        if not -len(shape) <= k < len(shape):
            raise FlowError(f"fg.onnx.export: dynamic axis {k} is out of range for a tensor of shape {tuple(t.shape)}")
        shape[k] = label
    return shape
