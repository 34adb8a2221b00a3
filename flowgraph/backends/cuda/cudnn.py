"""cuDNN for the CUDA backend, through NVIDIA's Python frontend (``nvidia-cudnn-frontend``, the ``cuda`` extra).

CuPy 14 dropped its cuDNN bindings; NVIDIA ships ``cudnn`` (the graph API frontend) over the cuDNN 9 libraries of
the ``nvidia-cudnn-cu13`` wheel (or torch's ``nvidia.cudnn`` package). Using it rather than writing convolution
and attention kernels of our own: cuDNN's are the ones PyTorch runs, tuned per architecture, bit-identical to
PyTorch's results on the same engine.

What runs here:

* convolutions: forward (``conv_fprop``), input gradient (``conv_dgrad``, also a transposed convolution's forward)
  and weight gradient (``conv_wgrad``), 1-d to 3-d (1-d as 2-d with a unit height), groups, stride, dilation,
  symmetric zero padding, float16 / bfloat16 / float32 / float64;
* scaled dot-product attention forward and backward (cuDNN's flash-style fused kernels: O(L) memory), float16 and
  bfloat16, with a causal mask or an additive bias.

Each distinct problem (op, shapes, dtype, geometry, TF32 choice) builds one cuDNN graph once: validated, lowered,
planned with heuristics A then FALLBACK; one workspace from CuPy's pool, grown to the largest need, serves
every plan. Executing binds device
pointers and runs on CuPy's current stream, so it is recorded by CUDA-graph capture like any other kernel (the
graph and its workspace must exist before capture: ``fg.jit``'s first call is eager and builds them).

Precision follows PyTorch: ``fg.backends.cudnn.allow_tf32`` (default True) lets float32 convolutions use TF32
tensor cores; when False, engines with cuDNN's ``TENSOR_CORE`` numerical note are deselected for float32, as
PyTorch does. ``fg.backends.cudnn.enabled = False`` turns the whole path off (the im2col path runs instead).

The libraries are found in the ``nvidia.cudnn`` package and loaded with ``RTLD_GLOBAL`` before ``import cudnn``
(the frontend resolves cuDNN's symbols from the process). Without them, :func:`unavailable_reason` says why and
what to install; nothing else changes.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Any

import numpy as np

from ...errors import BackendError

_LOAD: dict[str, Any] = {}
_LOCK = threading.Lock()

#: What a missing cuDNN costs, printed once (see :func:`note_once`).
INSTALL_HINT = ("convolutions and attention run on flowgraph's own CUDA kernels (im2col + cuBLAS, attention with "
                "the L x L matrix), several times slower than cuDNN; install the 'cuda' extra "
                "(pip install 'flowgraph[cuda]': nvidia-cudnn-frontend and nvidia-cudnn-cu13) to use cuDNN")


def _load() -> Any:
    """The ``cudnn`` frontend module, or None (the reason kept in ``_LOAD['reason']``)."""
    with _LOCK:
        if "module" in _LOAD:
            return _LOAD["module"]
        module, reason = None, None
        try:
            import nvidia.cudnn as libs  # the cuDNN 9 libraries (nvidia-cudnn-cu13 or torch's dependency)

            roots = [p for p in getattr(libs, "__path__", [])]
            paths = sorted({f for r in roots for f in glob.glob(os.path.join(r, "lib", "libcudnn*.so*"))},
                           key=lambda f: (not os.path.basename(f).startswith("libcudnn.so"), f))
            if not paths:
                raise ImportError(f"no libcudnn*.so in {roots}")
            for path in paths:  # the dispatcher library last would miss its engines: load every one
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
            import cudnn as module  # noqa: F811 - nvidia-cudnn-frontend
            module.backend_version()
        except Exception as exc:  # noqa: BLE001 - any failure means: no cuDNN, say why
            module, reason = None, f"{type(exc).__name__}: {exc}"
        _LOAD["module"], _LOAD["reason"] = module, reason
        return module


def unavailable_reason() -> str | None:
    """None when cuDNN can be used; otherwise why not (the import or library error)."""
    _load()
    return _LOAD["reason"]


def is_available() -> bool:
    """Whether the cuDNN frontend and libraries load in this process."""
    return _load() is not None


def note_once() -> None:
    """Print, once per process, what runs slower without cuDNN and how to install it."""
    if _LOAD.get("noted") or is_available():
        return
    _LOAD["noted"] = True
    import sys

    print(f"flowgraph: cuDNN is not available ({unavailable_reason()}): {INSTALL_HINT}", file=sys.stderr)


def _data_type(cudnn: Any, dtype: np.dtype) -> Any:
    import ml_dtypes

    table = {np.dtype(np.float16): cudnn.data_type.HALF, np.dtype(ml_dtypes.bfloat16): cudnn.data_type.BFLOAT16,
             np.dtype(np.float32): cudnn.data_type.FLOAT, np.dtype(np.float64): cudnn.data_type.DOUBLE}
    if dtype not in table:
        raise BackendError(f"cuDNN: no {dtype} support (float16, bfloat16, float32, float64)")
    return table[dtype]


def _packed(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


class _Plan:
    """One built cuDNN graph, its tensors by role and their uids, the workspace bytes it needs, and the
    frontend's native execute for it (None: the public ``execute`` runs it, see :func:`_native_execute`)."""

    __slots__ = ("graph", "tensors", "uids", "workspace", "native")

    def __init__(self, graph: Any, tensors: dict[str, Any], workspace: int, native: Any):
        self.graph, self.tensors, self.workspace, self.native = graph, tensors, workspace, native
        self.uids = {role: t.get_uid() for role, t in tensors.items()}


def _native_execute(graph: Any, handle: Any) -> Any:
    """A call ``(pack, workspace_ptr)`` running ``graph``'s selected plan through the frontend's own C++ entry
    point, with ``pack`` ``{uid: device pointer}``; None where that entry point is not there.

    Why not ``graph.execute``: it re-normalises the variant pack in Python on every call (a description of each
    buffer, a span and device check per pointer), ~30 us of host time per call on an H200 host (a 128x64x32x32
    fprop: 53-75 -> 23 us a call, ``.probe``-style timing in docs/cuda.md). An eager convolution layer
    executes three plans a step (fprop, dgrad, wgrad), so this is a tenth of an eager convnet step.

    The names used are the frontend's internals of 1.32 (``_lowered_graph._execute_plan_at_index``, the walk's
    ``cpp_index``): the same call its ``execute`` ends in for a backend plan with no overrides. A frontend that
    lacks them, a plan served by one of its Python engines, or a graph binding inputs of its own gets None, and
    the public ``execute`` runs as before."""
    try:
        if graph.selected_engine is not None or graph._data_bindings:
            return None
        index = graph._materialize_backend_plan(graph._plan_index).cpp_index
        call = graph._lowered_graph._execute_plan_at_index
        backend = handle.backend_handle
    except AttributeError:
        return None
    if index is None or backend is None:
        return None

    def run(pack: dict[int, int], workspace: int) -> None:
        call(pack, workspace, index, backend, None, None, None)

    return run


class Cudnn:
    """cuDNN on one device: a handle bound to CuPy's current stream and the built graphs, by problem."""

    def __init__(self, cupy: Any, capturing: Any = lambda: False):
        self.cudnn = _load()
        self._capturing = capturing
        if self.cudnn is None:
            raise BackendError(f"cuDNN is not available: {unavailable_reason()}")
        self.cupy = cupy
        self.handle = self.cudnn.create_handle()
        self.plans: dict[tuple, _Plan] = {}
        self._conv_plans: dict[tuple, _Plan] = {}  # ``conv``'s plans by the call's own sizes
        # One workspace for every plan (all run in order on one stream), grown to the largest need. Once a CUDA
        # graph has recorded a plan, a grown-out buffer is kept, not freed: the graph still points at it.
        self._workspace: Any = None
        self._retired: list[Any] = []
        self._recorded = False

    # ------------------------------------------------------------------ building and running graphs
    def _build(self, key: tuple, dtype: np.dtype, make: Any, fp32_tf32: bool) -> _Plan:
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        c = self.cudnn
        compute = c.data_type.DOUBLE if dtype == np.float64 else c.data_type.FLOAT
        graph = c.pygraph(io_data_type=_data_type(c, dtype), intermediate_data_type=compute,
                          compute_data_type=compute, handle=self.handle)
        tensors = make(graph, compute)
        try:
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
            if dtype == np.float32 and not fp32_tf32:
                graph.deselect_numeric_notes([c.numerical_note.TENSOR_CORE])
            graph.check_support()
            graph.build_plans()
        except Exception as exc:  # noqa: BLE001 - cuDNN refuses a problem: report it as ours
            raise BackendError(f"cuDNN cannot run {key[0]} for {key[1:]}: {exc}") from exc
        plan = self.plans[key] = _Plan(graph, tensors, int(graph.get_workspace_size()),
                                       _native_execute(graph, self.handle))
        self._reserve(plan.workspace)
        return plan

    def _reserve(self, size: int) -> Any:
        """The shared workspace, grown to at least ``size`` bytes (growing only outside graph capture: the first,
        eager call of a jitted step builds every plan it needs)."""
        if self._workspace is None or self._workspace.nbytes < size:
            if self._workspace is not None and self._recorded:
                self._retired.append(self._workspace)
            self._workspace = self.cupy.empty(max(size, 1), dtype=self.cupy.uint8)
        return self._workspace

    def _execute(self, plan: _Plan, pointers: dict[str, int]) -> None:
        if self._capturing():
            self._recorded = True
        self.cudnn.set_stream(self.handle, self.cupy.cuda.get_current_stream().ptr)
        workspace = self._reserve(plan.workspace)
        if plan.native is not None:
            plan.native({plan.uids[role]: ptr for role, ptr in pointers.items()}, workspace.data.ptr)
            return
        plan.graph.execute({plan.tensors[role]: ptr for role, ptr in pointers.items()}, workspace, handle=self.handle)

    # ------------------------------------------------------------------ convolutions
    @staticmethod
    def _as_2d(shape: tuple[int, ...], stride, padding, dilation) -> tuple:
        """A 1-d problem as 2-d with a unit height (cuDNN's convolutions are 2-d and 3-d)."""
        if len(shape) == 3:
            return (shape[0], shape[1], 1, shape[2]), (1,) + tuple(stride), (0,) + tuple(padding), \
                (1,) + tuple(dilation)
        return tuple(shape), tuple(stride), tuple(padding), tuple(dilation)

    def conv(self, op: str, a: Any, b: Any, out_shape: tuple[int, ...], stride, padding, dilation,
             fp32_tf32: bool, bias: Any = None) -> Any:
        """``op`` one of ``"fprop"`` (``a`` image, ``b`` weight), ``"dgrad"`` (``a`` output gradient, ``b``
        weight) or ``"wgrad"`` (``a`` image, ``b`` output gradient); contiguous CuPy arrays of one dtype, the
        result a new contiguous array of ``out_shape``. A ``bias`` (``(C_out,)``, with ``"fprop"``) is added to
        each output channel in the same graph (cuDNN's runtime fusion: the convolution's result is never
        written before it)."""
        dtype = np.dtype(a.dtype)
        biased = bias is not None and op == "fprop"
        out = self.cupy.ndarray(out_shape, dtype=dtype)  # cupy.empty without its Python
        if out.size == 0:
            return out
        if a.size == 0 or b.size == 0:
            out.fill(0)
            if biased:
                out += bias.reshape((1, -1) + (1,) * (out.ndim - 2))
            return out
        # the built plan by the call's own sizes (a training step's convolutions repeat theirs at every call)
        try:
            given = (op, a.shape, b.shape, tuple(out_shape), dtype, stride, padding, dilation, fp32_tf32, biased)
            plan = self._conv_plans.get(given)
        except TypeError:  # sizes given as lists: no memo
            given, plan = None, None
        if plan is None:
            plan = self._conv_plan(op, a, b, out_shape, dtype, stride, padding, dilation, fp32_tf32, biased)
            if given is not None:
                if len(self._conv_plans) >= 1024:
                    self._conv_plans.clear()
                self._conv_plans[given] = plan
        pointers = {"a": a.data.ptr, "b": b.data.ptr, "y": out.data.ptr}
        if biased:
            pointers["bias"] = bias.data.ptr
        self._execute(plan, pointers)
        return out

    def _conv_plan(self, op: str, a: Any, b: Any, out_shape: tuple[int, ...], dtype: np.dtype, stride: Any,
                   padding: Any, dilation: Any, fp32_tf32: bool, biased: bool) -> _Plan:
        """The built graph of ``conv``'s problem (a 1-d one as 2-d)."""
        sa, st, pd, dl = self._as_2d(tuple(a.shape), stride, padding, dilation)
        sb = self._as_2d(tuple(b.shape), stride, padding, dilation)[0]
        so = self._as_2d(tuple(out_shape), stride, padding, dilation)[0]
        key = (op, sa, sb, so, str(dtype), st, pd, dl, bool(fp32_tf32 and dtype == np.float32), biased)

        def make(graph: Any, compute: Any) -> dict[str, Any]:
            io = _data_type(self.cudnn, dtype)
            ta = graph.tensor(name="a", dim=list(sa), stride=_packed(sa), data_type=io)
            tb = graph.tensor(name="b", dim=list(sb), stride=_packed(sb), data_type=io)
            geometry = dict(padding=list(pd), stride=list(st), dilation=list(dl), compute_data_type=compute)
            if op == "fprop":
                y = graph.conv_fprop(image=ta, weight=tb, **geometry)
            elif op == "dgrad":
                y = graph.conv_dgrad(loss=ta, filter=tb, **geometry)
            else:
                y = graph.conv_wgrad(image=ta, loss=tb, **geometry)
            tensors = {"a": ta, "b": tb}
            if biased:
                per_channel = (1, so[1]) + (1,) * (len(so) - 2)
                tensors["bias"] = graph.tensor(name="bias", dim=list(per_channel), stride=_packed(per_channel),
                                               data_type=io)
                y = graph.bias(name="bias_add", input=y, bias=tensors["bias"])
            y.set_output(True).set_dim(list(so)).set_stride(_packed(so)).set_data_type(io)
            tensors["y"] = y
            return tensors

        return self._build(key, dtype, make, fp32_tf32)

    # ------------------------------------------------------------------ attention
    def _sdpa_key(self, q: Any, k: Any, v: Any, bias: Any, scale: float, causal: bool) -> tuple:
        return (tuple(q.shape), tuple(k.shape), tuple(v.shape), None if bias is None else tuple(bias.shape),
                str(q.dtype), float(scale), bool(causal))

    def _sdpa_tensors(self, graph: Any, q: Any, k: Any, v: Any, bias: Any) -> dict[str, Any]:
        dt = _data_type(self.cudnn, np.dtype(q.dtype))
        t = {name: graph.tensor(name=name, dim=list(a.shape), stride=_packed(tuple(a.shape)), data_type=dt)
             for name, a in (("q", q), ("k", k), ("v", v))}
        if bias is not None:
            t["bias"] = graph.tensor(name="bias", dim=list(bias.shape), stride=_packed(tuple(bias.shape)),
                                     data_type=dt)
        return t

    def sdpa_forward(self, q: Any, k: Any, v: Any, bias: Any, scale: float, causal: bool) -> tuple[Any, Any]:
        """``softmax(q k^T * scale + bias, causal) v`` for ``(B, H, L, D)`` arrays (``k``/``v`` ``(B, H, S,
        D)``); returns the output and the softmax statistics ``(B, H, L, 1)`` float32 the backward reads."""
        c = self.cudnn
        b_, h, length, _ = q.shape
        o = self.cupy.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        stats = self.cupy.empty((b_, h, length, 1), dtype=self.cupy.float32)

        def make(graph: Any, compute: Any) -> dict[str, Any]:
            t = self._sdpa_tensors(graph, q, k, v, bias)
            extra = {"bias": t["bias"]} if bias is not None else {}
            out, st = graph.sdpa(name="sdpa", q=t["q"], k=t["k"], v=t["v"], generate_stats=True,
                                 attn_scale=float(scale), use_causal_mask=bool(causal), **extra)
            out.set_output(True).set_dim(list(o.shape)).set_stride(_packed(tuple(o.shape)))
            st.set_output(True).set_data_type(c.data_type.FLOAT).set_dim(list(stats.shape)).set_stride(
                _packed(tuple(stats.shape)))
            t.update(o=out, stats=st)
            return t

        plan = self._build(("sdpa_fwd",) + self._sdpa_key(q, k, v, bias, scale, causal), np.dtype(q.dtype), make,
                           True)
        ptrs = {"q": q.data.ptr, "k": k.data.ptr, "v": v.data.ptr, "o": o.data.ptr, "stats": stats.data.ptr}
        if bias is not None:
            ptrs["bias"] = bias.data.ptr
        self._execute(plan, ptrs)
        return o, stats

    def sdpa_backward(self, q: Any, k: Any, v: Any, o: Any, do: Any, stats: Any, bias: Any, scale: float,
                      causal: bool) -> tuple[Any, Any, Any]:
        """The gradients ``(dq, dk, dv)`` of :meth:`sdpa_forward` from its output ``o``, statistics and ``do``."""
        c = self.cudnn
        dq, dk, dv = (self.cupy.empty(a.shape, dtype=a.dtype) for a in (q, k, v))

        def make(graph: Any, compute: Any) -> dict[str, Any]:
            t = self._sdpa_tensors(graph, q, k, v, bias)
            dt = _data_type(c, np.dtype(q.dtype))
            t["o"] = graph.tensor(name="o", dim=list(o.shape), stride=_packed(tuple(o.shape)), data_type=dt)
            t["do"] = graph.tensor(name="do", dim=list(do.shape), stride=_packed(tuple(do.shape)), data_type=dt)
            t["stats"] = graph.tensor(name="stats", dim=list(stats.shape), stride=_packed(tuple(stats.shape)),
                                      data_type=c.data_type.FLOAT)
            extra = {"bias": t["bias"]} if bias is not None else {}
            gq, gk, gv = graph.sdpa_backward(name="sdpa_bwd", q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["do"],
                                             stats=t["stats"], attn_scale=float(scale),
                                             use_causal_mask=bool(causal), **extra)
            for g, a in ((gq, q), (gk, k), (gv, v)):
                g.set_output(True).set_dim(list(a.shape)).set_stride(_packed(tuple(a.shape)))
            t.update(dq=gq, dk=gk, dv=gv)
            return t

        plan = self._build(("sdpa_bwd",) + self._sdpa_key(q, k, v, bias, scale, causal), np.dtype(q.dtype), make,
                           True)
        ptrs = {"q": q.data.ptr, "k": k.data.ptr, "v": v.data.ptr, "o": o.data.ptr, "do": do.data.ptr,
                "stats": stats.data.ptr, "dq": dq.data.ptr, "dk": dk.data.ptr, "dv": dv.data.ptr}
        if bias is not None:
            ptrs["bias"] = bias.data.ptr
        self._execute(plan, ptrs)
        return dq, dk, dv
