"""``fg.jit`` and ``fg.capture``: a training step recorded once and replayed, on every backend.

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    opt = optim.Adam(model.parameters(), lr=1e-3)

    @fg.jit
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for x, y in batches:
        loss = step(x, y)        # call 1: eager; call 2: recorded; then replayed

What each call does, per *signature* (the inputs' shapes, dtypes, devices and ``requires_grad``, the values of
non-tensor inputs, the grad mode and the autocast state):

1. **First call: one eager step.** It trains on its batch like any other step (no extra steps): kernels
   compile and the optimizer creates its state. On ``cuda`` optimizers run in their graph form from this call
   on (step counts and each group's ``lr`` as 0-d device tensors), so nothing of that is recorded later.
2. **Second call: the recording.** On ``cuda`` the step is recorded as a CUDA graph (nothing runs while
   recording) and the graph is launched once; on ``cpu`` and ``opencl`` the step runs for real while every
   backend call it makes is recorded: the primitive, which of its arguments are the step's inputs, results of
   earlier calls or state (parameters, gradients, optimizer buffers), and the constants. Optimizer steps and
   GradScaler's ``unscale_``/``step``/``update`` are recorded as *host units* (``Backend.host_call``): their
   Python runs again on every replay, so step counts, bias corrections, a scheduler's ``lr`` and the inf check
   are never frozen, and every optimizer works. Either way the call is again exactly one training step.
3. **Later calls: replays.** ``cuda`` copies the inputs into the graph's static inputs and launches the graph;
   ``cpu`` and ``opencl`` run the recorded calls again on the new inputs (no Tensor, autograd node or module
   code runs; intermediate arrays are dropped after their last reader). Tensors the step rebinds (new
   gradients, updated parameters) are pointed at the replay's results. The returned tensors are new, detached
   tensors on every call (eager and recorded calls too).

A replay checks the state the recording depended on; when it changed, the step is recorded again (a short
last batch, a freeze, ``model.eval()``, a replaced parameter, another momentum or weight decay): each
signature gets its own recording, up to ``cache_size`` of them (least recently used dropped). A change of
``group["lr"]`` (an LR scheduler) needs no new recording: host units read it on every replay, and on ``cuda``
the device ``lr`` is refreshed before each launch.

Rules a jitted step follows (flowgraph raises a :class:`~flowgraph.errors.FlowError` naming the line where it
can tell):

* No host reads inside the step (``.item()``, ``.numpy()``, ``print(t)``, ``if t > 0:``): a value read on the
  host could decide Python control flow, which a replay would not follow. Return the tensor and read it after
  the call. The error names the line of the read.
* Python runs at recording only: Python numbers computed inside the step are frozen into the recording.
  Pass what changes per step as an argument (a new value is a new signature) or keep it in a tensor.
* The step runs on one device; parameters, buffers and optimizer state are its state.

``fg.capture(step, *example_inputs)`` is the explicit fixed-signature form: the same engine, with the
signature taken from the example inputs (nothing runs at construction) and any other signature refused.
"""

from __future__ import annotations

import functools
import gc
import operator
import os
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .autograd.grad_mode import STATE
from .errors import FlowError
from .tensor.tensor import Tensor, _wrap

#: Refreshers of device learning rates (one per optimizer group and device), run before every replay.
_LR_HOOKS: list[Callable[[], None]] = []

#: Backend methods that read device data on the host: forbidden while a step is recorded.
_HOST_READS = frozenset({"to_host", "to_dlpack", "native", "from_dlpack", "dlpack_device"})
#: Backend methods that are not computations and are never recorded (``is_contiguous`` answers from the layout and
#: ``is_pending`` from the lazy engine's state, which a replay of the same calls reproduces; ``native_conv`` /
#: ``native_sdpa`` from the dtype and the flags, which the signature and a replay of the same calls keep;
#: ``replay_call`` is the recorder's own question to the backend).
_NOT_RECORDED = frozenset({"synchronize", "graph_session", "memory_stats", "list_devices", "is_available",
                           "is_contiguous", "is_pending", "native_conv", "native_sdpa", "cudnn", "replay_call"})

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_line(exc: BaseException | None = None) -> str:
    """``file:line: code`` of the innermost frame outside flowgraph: of the current stack, or of where ``exc``
    was raised (where a host read was asked for)."""
    frames = traceback.extract_tb(exc.__traceback__) if exc is not None else traceback.extract_stack()
    for frame in reversed(frames):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR + os.sep):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "<unknown line>"


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, Tensor)


def _tensors_in(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors_in(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors_in(x)]
    return []


def _live_tensors() -> list[Tensor]:
    """Every tensor alive now (a recording compares the tensors' arrays before and after the step)."""
    return [o for o in gc.get_objects() if issubclass(type(o), Tensor)]


# ---------------------------------------------------------------------------------------------- signatures
def _signature(args: tuple, kwargs: dict) -> tuple:
    """The cache key of a call: tensor metadata, constant values, grad mode and autocast."""
    return (_signature_of(args), _signature_of(kwargs), STATE.enabled, repr(STATE.autocast))


def _signature_of(x: Any) -> Any:
    if isinstance(x, Tensor):
        d = x._data
        # The dtype object, not its name: ``str(dtype)`` was a tenth of a replay's host time.
        return ("T", tuple(d.shape), d.dtype, x._backend.device, x.requires_grad)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(map(_signature_of, x)))
    if isinstance(x, dict):
        return ("dict", tuple((k, _signature_of(v)) for k, v in x.items()))
    if _is_array(x):
        return ("A", tuple(x.shape), x.dtype)
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return ("V", type(x).__name__, x)


def _flat_inputs(args: tuple, kwargs: dict) -> list[Tensor]:
    return _tensors_in(list(args)) + _tensors_in(kwargs)


# ---------------------------------------------------------------------------------------------- guards
class _Guards:
    """What a recording depended on besides its signature, checked before every replay."""

    def __init__(self, state: list[Tensor]):
        from .nn.module import STRUCTURE_VERSION, Module
        from .optim.optimizer import Optimizer

        self._structure = STRUCTURE_VERSION
        self.version = STRUCTURE_VERSION[0]
        ids = {id(t) for t in state}
        self.modules: list[tuple[Any, bool, tuple]] = []
        self.optimizers: list[tuple[Any, list]] = []
        for o in gc.get_objects():
            if issubclass(type(o), Module):
                owned = list(o._parameters.values()) + list(o._buffers.values())
                if any(id(p) in ids for p in owned if p is not None):
                    self.modules.append((o, o.training, self._params_of(o)))
            elif issubclass(type(o), Optimizer):
                if any(id(p) in ids for g in o.param_groups for p in g["params"]):
                    self.optimizers.append((o, self._hyper(o)))
        self.frozen = [(t, t.requires_grad) for t in state]

    @staticmethod
    def _params_of(m: Any) -> tuple:
        return tuple((k, id(v)) for k, v in m._parameters.items()) + tuple(
            (k, id(v)) for k, v in m._buffers.items())

    @staticmethod
    def _hyper(opt: Any) -> tuple:
        """Per group: its dict, the hyper-parameter names (all but ``params`` and ``lr``), their values, and the
        ids of its parameters. ``lr`` is read from the group on every replay (a device scalar refilled)."""
        out = []
        for g in opt.param_groups:
            keys = tuple(k for k in g if k not in ("params", "lr"))
            get = operator.itemgetter(*keys) if keys else (lambda _g: ())
            out.append((g, len(g), get, get(g), tuple(map(id, g["params"]))))
        return tuple(out)

    @staticmethod
    def _hyper_miss(opt: Any, hyper: tuple) -> bool:
        """Whether ``opt``'s groups differ from ``hyper`` (see :meth:`_hyper`): C-level gets and compares, since
        this runs before every replay."""
        groups = opt.param_groups
        if len(groups) != len(hyper):
            return True
        for g, (recorded, size, get, values, params) in zip(groups, hyper):
            if g is not recorded or len(g) != size:
                return True
            try:
                if get(g) != values:
                    return True
            except KeyError:
                return True
            if tuple(map(id, g["params"])) != params:
                return True
        return False

    def miss(self) -> str | None:
        """Why the recording no longer applies (None when it does).

        Each module's parameters and buffers are compared only when some module's registry changed since the
        last check (``nn.module.STRUCTURE_VERSION``): rebuilding those tuples was most of a replay's guard time.
        """
        version = self._structure[0]
        rebound = version != self.version
        for m, training, params in self.modules:
            if m.training != training:
                return f"{type(m).__name__}.training changed to {m.training}"
            if rebound and self._params_of(m) != params:
                return f"a parameter or buffer of {type(m).__name__} was replaced"
        for t, rg in self.frozen:
            if t.requires_grad != rg:
                return "the set of frozen parameters changed"
        for opt, hyper in self.optimizers:
            if self._hyper_miss(opt, hyper):
                return f"{type(opt).__name__}'s hyper-parameters or parameter groups changed"
        self.version = version  # every registry still holds what was recorded
        return None


# ---------------------------------------------------------------------------------------------- array-call recording
class _Ref:
    """A recorded argument that is an array: an index into the replay's environment."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


class _Seq:
    """A recorded list/tuple argument holding arrays."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: type, items: tuple):
        self.kind = kind
        self.items = items


class _Recorder:
    """Instruments one backend instance: every top-level primitive call is logged, nested ones are not.

    Arrays are known by identity; every array seen is kept alive until the recording ends so no identity
    is reused. An array the step did not make is an *external*: an input, state owned by a tensor, or a
    constant.
    """

    def __init__(self, backend: Any, inputs: list[Tensor]):
        self.backend = backend
        self.env_ids: dict[int, int] = {}
        self.sources: list[tuple[str, Any]] = []  # per env index: ("in", i) | ("ext", array) | ("out", None)
        self.keep: list[Any] = []
        self.calls: list[tuple[Callable, tuple, dict, Any]] = []
        self.depth = 0
        for i, t in enumerate(inputs):
            self._index(t._data, ("in", i))
        self.installed: list[tuple[str, Any]] = []

    def _index(self, a: Any, source: tuple[str, Any]) -> int:
        k = len(self.sources)
        self.env_ids[id(a)] = k
        self.sources.append(source)
        self.keep.append(a)
        return k

    def _encode(self, x: Any) -> Any:
        if _is_array(x):
            k = self.env_ids.get(id(x))
            if k is None:
                k = self._index(x, ("ext", x))
            return _Ref(k)
        if isinstance(x, (list, tuple)) and any(_is_array(i) or isinstance(i, (list, tuple)) for i in x):
            return _Seq(type(x), tuple(self._encode(i) for i in x))
        return x

    def _output(self, out: Any) -> Any:
        if _is_array(out):
            return self._index(out, ("out", None))
        if isinstance(out, (list, tuple)):
            return tuple(self._output(o) for o in out)
        if out is None:
            return None
        raise FlowError(
            f"jit: a backend call returned the host value {out!r} while the step was recorded (at "
            f"{_user_line()}); a jitted step must keep its values on the device")

    def _wrapper(self, name: str, method: Callable) -> Callable:
        recorder = self

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if recorder.depth:
                return method(*args, **kwargs)
            if name in _HOST_READS:
                raise FlowError(
                    f"jit: host read inside a jitted step at {_user_line()}: the value could decide Python "
                    "control flow, which a replay would not follow. Return the tensor from the step and read "
                    "it after the call (or run this step without fg.jit)")
            recorder.depth += 1
            try:
                out = method(*args, **kwargs)
            finally:
                recorder.depth -= 1
            targs = tuple(recorder._encode(a) for a in args)
            tkw = {k: recorder._encode(v) for k, v in kwargs.items()}
            # the backend may swap in a faster equivalent for replays (a mixed-layout product relaid first)
            fn = recorder.backend.replay_call(method, args, kwargs, out)
            recorder.calls.append((fn, targs, tkw, recorder._output(out)))
            return out

        return call

    def __enter__(self) -> _Recorder:
        bk = self.backend
        for name in dir(type(bk)):
            if name.startswith("_") or name in _NOT_RECORDED:
                continue
            attr = getattr(type(bk), name, None)
            if not callable(attr) or isinstance(attr, type):
                continue
            self.installed.append((name, bk.__dict__.get(name)))  # an instance attribute to restore, if any
            setattr(bk, name, self._wrapper(name, getattr(bk, name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, own in self.installed:
            if own is None:
                self.backend.__dict__.pop(name, None)
            else:
                self.backend.__dict__[name] = own


class _ArrayProgram:
    """A step recorded as backend calls (cpu, opencl) and replayed by calling them again."""

    def __init__(self, rec: _Recorder, inputs: list[Tensor], outputs: Any, before: dict[int, tuple],
                 after: list[Tensor]):
        self.backend = rec.backend
        self.n_env = len(rec.sources)
        self.n_inputs = len(inputs)
        calls = rec.calls
        owner_of: dict[int, Tensor] = {}
        for t, data, _grad in before.values():
            owner_of.setdefault(id(data), t)
        rebound: list[Tensor] = []
        for t, data, _grad in before.values():
            if t._data is not data:
                rebound.append(t)
                owner_of[id(data)] = t
        #: External arrays: (env index, owner tensor or None, the constant array).
        self.externals = []
        state: list[Tensor] = []
        for k, (kind, arr) in enumerate(rec.sources):
            if kind == "ext":
                owner = owner_of.get(id(arr))
                self.externals.append((k, owner, arr))
                if owner is not None:
                    state.append(owner)
        # Tensors left pointing at arrays the step made: rebind them to the replay's arrays.
        self.writeback: list[tuple[Tensor, int]] = []
        seen: set[int] = set()
        for t in rebound + after:
            k = rec.env_ids.get(id(t._data))
            if k is not None and rec.sources[k][0] == "out" and id(t) not in seen:
                seen.add(id(t))
                self.writeback.append((t, k))
        # Gradient attributes the step set or cleared, restored after each replay.
        self.grads = [(t, t.grad) for t, _data, grad in before.values() if t.grad is not grad]
        self.outputs = self._template(outputs, rec)
        self.guards = _Guards(state + [t for t, _ in self.writeback if t.requires_grad])
        # Liveness: a replay drops each intermediate array after its last reader, as eager code would
        # (keeping all of them made a replay hold the whole step's activations at once).
        keep = {k for _t, k in self.writeback} | set(_template_refs(self.outputs))
        last: dict[int, int] = {}
        for i, (_fn, targs, tkw, out) in enumerate(calls):
            for a in (*targs, *tkw.values()):
                for k in _arg_refs(a):
                    last[k] = i
            for k in _out_refs(out):
                last.setdefault(k, i)
        frees: list[list[int]] = [[] for _ in calls]
        for k, i in last.items():
            if k not in keep:
                frees[i].append(k)
        self.calls = [(fn, targs, tkw, out, tuple(f)) for (fn, targs, tkw, out), f in zip(calls, frees)]
        self._run = _compile_calls(self.calls, keep)

    def _template(self, obj: Any, rec: _Recorder) -> Any:
        if isinstance(obj, Tensor):
            k = rec.env_ids.get(id(obj._data))
            if k is None:  # an array the step did not make through the backend (a constant)
                return ("C", obj._data)
            return ("T", k)
        if isinstance(obj, (list, tuple)):
            return (type(obj), [self._template(o, rec) for o in obj])
        if isinstance(obj, dict):
            return (dict, {k: self._template(v, rec) for k, v in obj.items()})
        return ("V", obj)

    def _build(self, tmpl: Any, env: list) -> Any:
        kind = tmpl[0]
        if kind == "T":
            return _wrap(env[tmpl[1]], self.backend)
        if kind == "C":
            return _wrap(tmpl[1], self.backend)
        if kind == "V":
            return tmpl[1]
        if kind is dict:
            return {k: self._build(v, env) for k, v in tmpl[1].items()}
        return kind(self._build(o, env) for o in tmpl[1])

    def replay(self, inputs: list[Tensor]) -> Any:
        env: list[Any] = [None] * self.n_env
        for i, t in enumerate(inputs):
            env[i] = t._data
        for k, owner, arr in self.externals:
            env[k] = arr if owner is None else owner._data
        self._run(env)
        for t, k in self.writeback:
            t._data = env[k]
        for t, grad in self.grads:
            t.grad = grad
        return self._build(self.outputs, env)


def _compile_calls(calls: list[tuple], keep: set[int]) -> Callable[[list], None]:
    """The recorded calls as one generated straight-line Python function ``run(env)``: each array a local
    variable (``v<k>`` for environment slot ``k``, read from ``env`` once if the step did not make it), each
    call one line with its arguments written out, ``del`` after an array's last reader (the liveness
    ``_ArrayProgram`` computed), and the arrays in ``keep`` (written back or returned) that a call made stored
    into ``env`` at the end.

    The loop over the call list it replaces resolved every argument and output through the environment:
    1.1-1.5 us of interpreter time per call against 0.2 us here (iterative_refine's CPU step makes 200 calls,
    gru_seq's 1,016). The source is built once per recorded program (28 ms for gru_seq's), as
    ``collections.namedtuple`` builds its classes."""
    names: dict[str, Any] = {}

    def const(value: Any) -> str:
        name = f"c{len(names)}"
        names[name] = value
        return name

    lines: list[str] = []
    made: set[int] = set()  # slots a call writes
    read: set[int] = set()  # slots an argument reads

    def arg(x: Any) -> str:
        t = type(x)
        if t is _Ref:
            read.add(x.k)
            return f"v{x.k}"
        if t is _Seq:
            items = "".join(f"{arg(i)}, " for i in x.items)
            if x.kind is list:
                return f"[{items}]"
            return f"({items})" if x.kind is tuple else f"{const(x.kind)}(({items}))"
        return const(x)

    def unpack(out: Any, value: str, depth: int) -> None:
        if type(out) is int:
            lines.append(f"    v{out} = {value}")
            made.add(out)
        elif out is not None:
            tmp = f"t{depth}"
            lines.append(f"    {tmp} = {value}")
            for i, o in enumerate(out):
                unpack(o, f"{tmp}[{i}]", depth + 1)

    for fn, targs, tkw, out, frees in calls:
        call = f"{const(fn)}({''.join(f'{arg(a)}, ' for a in targs)}"
        call += "".join(f"{k}={arg(v)}, " for k, v in tkw.items()) + ")"
        if out is None:
            lines.append(f"    {call}")
        else:
            unpack(out, call, 0)
        if frees:
            lines.append(f"    del {', '.join(f'v{k}' for k in frees)}")
    body = ([f"    v{k} = env[{k}]" for k in sorted(read - made)] + lines
            + [f"    env[{k}] = v{k}" for k in sorted(keep & made)])
    source = "def run(env):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(compile(source, "<fg.jit replay>", "exec"), names)  # our own source; its names are the recorded calls
    return names["run"]


def _arg_refs(x: Any) -> list[int]:
    if type(x) is _Ref:
        return [x.k]
    if type(x) is _Seq:
        return [k for i in x.items for k in _arg_refs(i)]
    return []


def _out_refs(out: Any) -> list[int]:
    if type(out) is int:
        return [out]
    if out is None:
        return []
    return [k for o in out for k in _out_refs(o)]


def _template_refs(tmpl: Any) -> list[int]:
    kind = tmpl[0]
    if kind == "T":
        return [tmpl[1]]
    if kind in ("C", "V"):
        return []
    items = tmpl[1].values() if kind is dict else tmpl[1]
    return [k for o in items for k in _template_refs(o)]


# ---------------------------------------------------------------------------------------------- CUDA graphs
class _GraphProgram:
    """A step recorded as one CUDA graph: static inputs in, the same arrays rewritten on every launch."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, inputs: list[Tensor], session: Any):
        bk = inputs[0]._backend
        self.backend = bk
        self.session = session
        self.static = [_wrap(bk.assign(bk.full(t.shape, 0, t._data.dtype), t._data), bk) for t in inputs]
        for s, t in zip(self.static, inputs):
            if t.requires_grad:
                s.requires_grad_(True)
        before = {id(t): (t, t._data, t.grad) for t in _live_tensors()}
        s_args, s_kwargs = _substitute(args, kwargs, dict(zip(map(id, inputs), self.static)))
        bk.after_launch = []
        try:
            with session.capture():
                outputs = fn(*s_args, **s_kwargs)
                # Pending fused work of every tensor the step leaves behind (outputs, new gradients, state)
                # finishes inside the graph: a lazy array realized after the recording would read stale memory.
                gc.collect()
                for t in _live_tensors():
                    if id(t) not in before or t._data is not before[id(t)][1]:
                        t._data = bk.contiguous(t._data)
                # State the step rebound to new arrays is copied back into its own buffers inside the graph,
                # so every launch reads and writes the same addresses.
                state = []
                for t, data, _grad in before.values():
                    if t._data is not data:
                        bk.assign(data, t._data)
                        t._data = data
                    state.append(t)
        except Exception as exc:
            raise FlowError(
                f"jit: the step cannot be recorded as a CUDA graph at {_user_line(exc)}: {exc}"
                if isinstance(exc, FlowError) else
                f"jit: the step failed while its CUDA graph was recorded at {_user_line(exc)} "
                f"({type(exc).__name__}: {exc}); a jitted step must run on the device without host reads "
                "(see flowgraph.runtime)") from exc
        self.outputs = outputs
        #: Metric reads of the step (sink host calls), run after every launch.
        self.after_launch, bk.after_launch = bk.after_launch, []
        self.guards = _Guards([t for t in state if t.requires_grad])

    def replay(self, inputs: list[Tensor]) -> Any:
        session = self.session
        session.replay([(s._data, t._data) for s, t in zip(self.static, inputs) if t._data is not s._data])
        for fn, arrays in self.after_launch:
            fn(*arrays)
        bk = self.backend
        return _map_tensors(self.outputs, lambda t: _wrap(session.copy_out(t._data), bk))


def _map_tensors(obj: Any, f: Callable[[Tensor], Any]) -> Any:
    if isinstance(obj, Tensor):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, f) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, f) for k, v in obj.items()}
    return obj


def _substitute(args: tuple, kwargs: dict, table: dict[int, Tensor]) -> tuple[tuple, dict]:
    def sub(x: Any) -> Any:
        if isinstance(x, Tensor):
            return table.get(id(x), x)
        if isinstance(x, (list, tuple)):
            return type(x)(sub(i) for i in x)
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    try:
        return sub(args), sub(kwargs)
    finally:
        sub = None  # a self-calling closure is a reference cycle: without this the step's inputs outlive it


# ---------------------------------------------------------------------------------------------- the decorator
class _Entry:
    __slots__ = ("calls", "program", "session")

    def __init__(self) -> None:
        self.calls = 0
        self.program: Any = None
        self.session: Any = None


class JitFunction:
    """A step function run eagerly once, recorded on its next call and replayed after (see :func:`jit`)."""

    def __init__(self, fn: Callable[..., Any], cache_size: int = 8, fixed: tuple | None = None):
        if not callable(fn):
            raise FlowError(f"jit: expected a callable step function, got {type(fn).__name__}")
        if not isinstance(cache_size, int) or cache_size < 1:
            raise FlowError(f"jit: cache_size must be a positive int, got {cache_size!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.cache_size = cache_size
        self.fixed = fixed
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        #: How many times a step was recorded (re-recordings after a guard miss included).
        self.recordings = 0
        #: Why the last re-recording happened (None before any).
        self.last_miss: str | None = None

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = _flat_inputs(args, kwargs)
        if not inputs:
            raise FlowError(f"jit: {self.__name__} got no tensor argument; a jitted step takes its batch as "
                            "tensors (they fix the device and the shapes)")
        bk = inputs[0]._backend
        for t in inputs:
            if t._backend is not bk:
                raise FlowError(f"jit: inputs of {self.__name__} live on {bk.device} and {t.device}; "
                                "a jitted step runs on one device")
        key = _signature(args, kwargs)
        if self.fixed is not None and key != self.fixed:
            raise FlowError(
                f"captured step {self.__name__}: called with another signature than its example inputs "
                f"(shapes, dtypes, devices, requires_grad, constants); got {_describe(key)}, captured "
                f"{_describe(self.fixed)}. Use fg.jit for steps whose shapes change")
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = _Entry()
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        if entry.program is not None:
            miss = entry.program.guards.miss()
            if miss is None:
                for hook in _LR_HOOKS:
                    hook()
                return entry.program.replay(inputs)
            self.last_miss = miss
            entry.program = None
            entry.calls = 1
        if entry.calls == 0:
            entry.calls = 1
            return _map_tensors(self._eager(bk, entry, args, kwargs), Tensor.detach)
        return _map_tensors(self._record(bk, entry, args, kwargs, inputs), Tensor.detach)

    def _eager(self, bk: Any, entry: _Entry, args: tuple, kwargs: dict) -> Any:
        if not bk.supports_graph_capture:
            return self.fn(*args, **kwargs)
        previous = STATE.capture_hooks
        STATE.capture_hooks = _LR_HOOKS  # optimizers create their device step counts and lrs now
        try:
            entry.session = bk.graph_session()
            with entry.session.warmup():
                return self.fn(*args, **kwargs)
        finally:
            STATE.capture_hooks = previous

    def _record(self, bk: Any, entry: _Entry, args: tuple, kwargs: dict, inputs: list[Tensor]) -> Any:
        if bk.supports_graph_capture:
            previous = STATE.capture_hooks
            STATE.capture_hooks = _LR_HOOKS
            try:
                for hook in _LR_HOOKS:
                    hook()
                if entry.session is None:
                    entry.session = bk.graph_session()
                program: Any = _GraphProgram(self.fn, args, kwargs, inputs, entry.session)
                out = program.replay(inputs)
            finally:
                STATE.capture_hooks = previous
        else:
            before = {id(t): (t, t._data, t.grad) for t in _live_tensors()}
            STATE.host_units = True  # optimizer and GradScaler steps: host units, their Python replayed
            try:
                with _Recorder(bk, inputs) as rec:
                    outputs = self.fn(*args, **kwargs)
            finally:
                STATE.host_units = False
            gc.collect()  # cyclic garbage of the step (autograd graphs) is not state
            returned = {id(t) for t in _tensors_in(outputs)}
            created = [t for t in _live_tensors() if id(t) not in before and id(t) not in returned]
            program = _ArrayProgram(rec, inputs, outputs, before, created)
            out = outputs
        entry.program = program
        entry.calls = 2
        self.recordings += 1
        return out

    def __repr__(self) -> str:
        return f"<fg.jit {self.__name__}: {len(self._cache)} signature(s), {self.recordings} recording(s)>"


def _describe(key: tuple) -> str:
    return repr(key[0])[:300]


def jit(fn: Callable[..., Any] | None = None, *, cache_size: int = 8) -> Any:
    """Record a training step once per signature and replay it (CUDA graphs on cuda, recorded backend calls
    on cpu and opencl).

    Use as ``@fg.jit`` or ``@fg.jit(cache_size=4)``. The first call of a signature runs eagerly, the second is
    recorded (and still trains exactly one step), later ones replay; see :mod:`flowgraph.runtime` for the
    rules and what is guarded. ``step.recordings`` counts recordings; ``step.last_miss`` says why the last
    re-recording happened.
    """
    if fn is None:
        return lambda f: JitFunction(f, cache_size=cache_size)
    return JitFunction(fn, cache_size=cache_size)


def capture(step_fn: Callable[..., Any], *example_inputs: Any) -> JitFunction:
    """The fixed-signature form of :func:`jit`: ``step = fg.capture(step_fn, x0, y0)``.

    Nothing runs at construction (no warm-up steps on the example). ``step(x, y)`` with inputs of the
    example's shapes, dtypes and devices behaves as a jitted step (eager, recorded, then replayed); another
    signature raises a FlowError.
    """
    if not callable(step_fn):
        raise FlowError(f"capture: step_fn must be callable, got {type(step_fn).__name__}")
    if not _flat_inputs(example_inputs, {}):
        raise FlowError("capture: pass at least one example input tensor (it fixes the device and shapes)")
    devices = {t._backend.device for t in _flat_inputs(example_inputs, {})}
    if len(devices) > 1:
        raise FlowError(f"capture: example inputs live on {' and '.join(sorted(devices))}; put them on one device")
    return JitFunction(step_fn, cache_size=1, fixed=_signature(example_inputs, {}))


__all__ = ["JitFunction", "capture", "jit"]
