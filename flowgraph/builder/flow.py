"""``FlowBuilder``: compose modules into a ``Graph`` by describing the data flow.

    model = (FlowBuilder.from_(nn.Linear(2, 16))
             .through(nn.GELU())
             .also(nn.Linear(16, 16))          # residual: x + m(x)
             .through(nn.Linear(16, 2))
             .build())

Every call returns a new builder (a builder is an immutable record of calls), so a prefix can be shared:
``base = FlowBuilder.from_(enc)``; ``a = base.through(h1).build()``; ``b = base.through(h2).build()``
(both graphs share ``enc``'s weights). Nothing is checked until ``build()``, which validates the whole flow
and names the offending call in every error ("call #4 .using('encodd'): ...; did you mean 'encoded'?").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import FlowError
from ..tensor import Tensor
from .calls import Call
from .compile import compile_calls
from .graph import Graph
from .merge import MergeOp


class FlowBuilder:
    """Fluent graph builder (floDl's verbs). ``FlowBuilder()`` starts with an identity entry."""

    def __init__(self, _calls: tuple[Call, ...] | None = None):
        self._calls = _calls if _calls is not None else (Call(1, "FlowBuilder"),)

    @classmethod
    def from_(cls, module: Any) -> FlowBuilder:
        """Start a flow whose entry module is fed the graph's (first) input."""
        return cls((Call(1, "from_", (module,)),))

    def _add(self, verb: str, *args: Any, finish: str | None = None, finish_args: tuple = (), **kwargs: Any
             ) -> FlowBuilder:
        call = Call(len(self._calls) + 1, verb, args, kwargs, finish, finish_args)
        return FlowBuilder(self._calls + (call,))

    # ------------------------------------------------------------------ verbs
    def through(self, module: Any) -> FlowBuilder:
        """Chain a module: ``stream -> module(stream)``."""
        return self._add("through", module)

    def also(self, module: Any) -> FlowBuilder:
        """Residual: ``stream -> stream + module(stream)`` (the module must keep the shape)."""
        return self._add("also", module)

    def fork(self, module: Any) -> FlowBuilder:
        """Side branch: run ``module`` on the stream; the next ``.tag(name)`` names its output.

        The main stream continues unchanged.
        """
        return self._add("fork", module)

    def split(self, *modules: Any) -> FlowBuilder:
        """Parallel branches on the same input, one per module: ``split(a, b)`` or ``split([a, b])``."""
        if len(modules) == 1 and isinstance(modules[0], (list, tuple)):
            modules = tuple(modules[0])
        return self._add("split", *modules)

    def merge(self, op: MergeOp | Callable[[list[Tensor]], Tensor] = MergeOp.ADD) -> FlowBuilder:
        """Combine the open branches: ``MergeOp.ADD`` (default), ``MEAN``, ``CAT``, ``MUL``, ``MAX``...

        ...or a callable taking the list of branch outputs.
        """
        return self._add("merge", op)

    def tag(self, name: str, init: Tensor | Callable[[Tensor], Tensor] | None = None) -> FlowBuilder:
        """Name the current stream (or the output of the ``.fork`` just before).

        ``init`` is what a forward reference to this tag sees on the first call (or after ``reset_state()``):
        a tensor, or a function of the consumer's input; by default zeros shaped like the consumer's input.
        """
        return self._add("tag", name, **({"init": init} if init is not None else {}))

    def using(self, *names: str) -> FlowBuilder:
        """Feed tagged streams to the previous module as keyword arguments: ``m(x, name=value)``.

        A tag defined earlier gives this call's value; a tag defined later (a forward reference) gives the
        value from the previous call. After ``.split`` every branch receives them; after ``.gate``/``.switch``
        the router/selector; after a loop its body; after ``.merge(callable)`` the callable.
        """
        return self._add("using", *names)

    def loop_body(self, body: Any) -> LoopBuilder:
        """Start a loop; finish with ``.for_n(n)``, ``.while_cond(c, max_iter)`` or ``.until_cond(...)``."""
        return LoopBuilder(self, body)

    def gate(self, router: Any, experts: Sequence[Any]) -> FlowBuilder:
        """Soft routing: every expert runs; outputs weighted by ``router(x)`` along its last dim, summed."""
        return self._add("gate", router, list(experts) if isinstance(experts, (list, tuple)) else experts)

    def switch(self, selector: Any, branches: Sequence[Any]) -> FlowBuilder:
        """Hard routing: ``selector(x)`` gives one branch index for the batch (shape ``()``) or per row."""
        return self._add("switch", selector,
                         list(branches) if isinstance(branches, (list, tuple)) else branches)

    def map(self, body: Any) -> MapBuilder:
        """Start a map; finish with ``.each()``, ``.batched()``, ``.over(tag)`` or ``.slices(n)``."""
        return MapBuilder(self, body)

    def input(self, *names: str) -> FlowBuilder:
        """Declare extra graph inputs, usable as tags anywhere: ``graph(x, a, b)`` or ``graph(x, a=a)``."""
        return self._add("input", *names)

    def label(self, name: str) -> FlowBuilder:
        """Name the graph: a labelled graph inside another is an addressable subgraph named so."""
        return self._add("label", name)

    def build(self, sample: Any = None) -> Graph:
        """Validate the flow and return the ``Graph``; with ``sample`` (a tensor, or a tuple for several
        inputs) also dry-run it and report the first shape mismatch by node and shapes."""
        if sample is not None and not isinstance(sample, (Tensor, tuple, list, dict)):
            raise FlowError(f"build(sample=...): sample must be a Tensor, a tuple of tensors (one per graph "
                            f"input) or a dict name -> tensor; got {type(sample).__name__} {sample!r:.40}")
        graph = compile_calls(self._calls)
        if sample is not None:
            if isinstance(sample, dict):
                graph.dry_run(**sample)
            elif isinstance(sample, (tuple, list)):
                graph.dry_run(*sample)
            else:
                graph.dry_run(sample)
        return graph

    def __repr__(self) -> str:
        return "FlowBuilder(" + " ".join(c.describe().split(" ", 2)[2] for c in self._calls) + ")"


class _Pending:
    """A half-finished loop/map: using it as a builder is an error that says how to finish it."""

    _finishers = ""

    def __getattr__(self, name: str) -> Any:
        from ..errors import FlowError

        if name.startswith("__"):
            raise AttributeError(name)
        raise FlowError(
            f".{self._what}(...) must be finished with {self._finishers} before .{name}(); "
            f"e.g. .{self._what}(m){self._example}"
        )


class LoopBuilder(_Pending):
    """The pending ``.loop_body(b)``; one of ``for_n``, ``while_cond``, ``until_cond`` finishes it."""

    _what = "loop_body"
    _finishers = ".for_n(n), .while_cond(cond, max_iter) or .until_cond(cond, max_iter)"
    _example = ".for_n(3)"

    def __init__(self, fb: FlowBuilder, body: Any):
        self._fb, self._body = fb, body

    def for_n(self, n: int) -> FlowBuilder:
        """Run the body exactly ``n`` times."""
        return self._fb._add("loop_body", self._body, finish="for_n", finish_args=(n,))

    def while_cond(self, cond: Any, max_iter: int) -> FlowBuilder:
        """Test ``cond`` before each pass (0..max_iter passes); a row stops where ``cond`` is > 0."""
        return self._fb._add("loop_body", self._body, finish="while_cond", finish_args=(cond, max_iter))

    def until_cond(self, cond: Any, max_iter: int) -> FlowBuilder:
        """Test ``cond`` after each pass (1..max_iter passes); a row stops where ``cond`` is > 0."""
        return self._fb._add("loop_body", self._body, finish="until_cond", finish_args=(cond, max_iter))


class MapBuilder(_Pending):
    """The pending ``.map(body)``; ``each``, ``batched``, ``over`` or ``slices`` finishes it.

    ``.batched()`` applies the body once to the whole tensor; it may also precede another finisher
    (``.map(b).batched().over("tag")``, ``.map(b).batched().slices(4)``) to make that one batched.
    """

    _what = "map"
    _finishers = ".each(), .batched(), .over(tag) or .slices(n)"
    _example = ".each()"

    def __init__(self, fb: FlowBuilder, body: Any, batched: bool = False):
        self._fb, self._body, self._batched = fb, body, batched

    def _finish(self, mode: str, *args: Any) -> FlowBuilder:
        return self._fb._add("map", self._body, finish=mode, finish_args=args, batched=self._batched)

    def each(self) -> FlowBuilder:
        """Apply the body to each row (dim 0, kept as a batch of 1) and concatenate the results."""
        return self._finish("each")

    def batched(self) -> BatchedMap:
        """Apply the body once to the whole tensor (or make the following ``over``/``slices`` batched)."""
        return BatchedMap(self._fb, self._body)

    def over(self, tag: str) -> FlowBuilder:
        """Map over the rows of a tagged tensor (defined earlier) instead of the current stream."""
        return self._finish("over", tag)

    def slices(self, n: int) -> FlowBuilder:
        """Apply the body to each of ``n`` equal slices of the last dim and concatenate along it."""
        return self._finish("slices", n)


class BatchedMap(FlowBuilder):
    """``.map(b).batched()``: a finished batched map that can still be refined with ``.over``/``.slices``."""

    def __init__(self, fb: FlowBuilder, body: Any):
        super().__init__(fb._add("map", body, finish="batched", batched=True)._calls)
        self._fb, self._body = fb, body

    def each(self) -> FlowBuilder:
        """The same batched map (the body sees the whole tensor)."""
        return FlowBuilder(self._calls)

    def over(self, tag: str) -> FlowBuilder:
        """Apply the body once to the whole tagged tensor."""
        return self._fb._add("map", self._body, finish="over", finish_args=(tag,), batched=True)

    def slices(self, n: int) -> FlowBuilder:
        """Apply the body once to all ``n`` slices stacked along the rows."""
        return self._fb._add("map", self._body, finish="slices", finish_args=(n,), batched=True)
