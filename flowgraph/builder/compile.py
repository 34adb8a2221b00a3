"""Turn a builder's call record into a ``Graph``: validate every call, wire streams and refs, name children.

Errors are ``FlowError``s naming the call ("call #4 .using('encodd')") and saying what would be right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FlowError
from ..nn.module import Module
from ..tensor import Tensor
from .calls import Call, did_you_mean
from .graph import Graph
from .merge import MergeOp
from .nodes import (
    AlsoNode,
    EntryNode,
    GateNode,
    LoopNode,
    MapNode,
    MergeNode,
    ModuleNode,
    Node,
    Ref,
    SwitchNode,
    accepts_keyword,
)


@dataclass
class _Tag:
    stream: int
    node: Node | None
    call: Call


def _fail(call: Call, message: str) -> FlowError:
    return FlowError(f"{call.describe()}: {message}")


def _check_module(call: Call, value: Any, what: str = "module") -> Module:
    if isinstance(value, type) and issubclass(value, Module):
        raise _fail(call, f"the {what} is the class {value.__name__}, not a module; pass an instance, "
                          f"e.g. {value.__name__}(...)")
    if not isinstance(value, Module):
        raise _fail(call, f"the {what} must be an nn.Module, got {type(value).__name__}; "
                          "wrap a plain function in a Module subclass with a forward()")
    return value


def _check_name(call: Call, name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        article = "an" if what[0] in "aeiou" else "a"
        raise _fail(call, f"{article} {what} must be a non-empty string, got {name!r}")
    if "." in name:
        raise _fail(call, f"{what} {name!r} contains '.', which separates graph-tree paths; "
                          f"use {name.replace('.', '_')!r}")
    if not name.isidentifier():
        raise _fail(call, f"{what} {name!r} must be a Python identifier (letters, digits, '_'), since it "
                          "names a keyword argument and a path element")
    return name


def _check_count(call: Call, value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(call, f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


class _Compiler:
    """Walks the calls once, keeping the open streams, the tags and the nodes that ``.using`` would feed."""

    def __init__(self, calls: tuple[Call, ...]):
        self.calls = calls
        self.nodes: list[Node] = []
        self.next_stream = 1
        self.tags: dict[str, _Tag] = {}
        self.tag_inits: dict[str, Any] = {}
        self.input_names: list[str] = []
        self.pending: dict[str, list[tuple[Node, Call]]] = {}
        self.forward_tags: set[str] = set()
        self.label: str | None = None
        self.label_call: Call | None = None
        self.current: list[int] = []
        self.split_call: Call | None = None
        self.targets: list[Node] = []
        self.target_call: Call | None = None
        self.fork: Node | None = None
        self.producer: dict[int, Node] = {}
        self.split_count = 0
        self.all_tags = {c.args[0] for c in calls
                         if c.verb == "tag" and c.args and isinstance(c.args[0], str)}
        self.all_tags |= {a for c in calls if c.verb == "input" for a in c.args if isinstance(a, str)}

    def stream(self) -> int:
        s = self.next_stream
        self.next_stream += 1
        return s

    def add(self, node: Node, call: Call) -> Node:
        self.nodes.append(node)
        self.producer[node.output] = node
        self.targets = [node]
        self.target_call = call
        return node

    def single(self, call: Call) -> int:
        if len(self.current) != 1:
            raise _fail(call, f"needs a single stream, but {self.split_call.describe()} left "
                              f"{len(self.current)} open branches; call .merge(op) first")
        return self.current[0]

    # ------------------------------------------------------------------ driver
    def run(self) -> Graph:
        calls = self.calls
        for call in calls:  # inputs are graph arguments: available as tags from the start
            if call.verb == "input":
                self.do_input(call)
        first = calls[0]
        if first.verb == "from_":
            module = _check_module(first, first.args[0], "entry module")
            self.current = [0]
            self.add(EntryNode(first, module, self.stream()), first)
            self.current = [self.nodes[-1].output]
        else:
            self.current = [0]
        for call in calls[1:]:
            if self.fork is not None and call.verb not in ("tag", "using"):
                raise _fail(self.fork.call, "the fork's output is never tagged; follow .fork(m) with "
                                            ".tag(name) (optionally after .using(...))")
            handler = getattr(self, "do_" + call.verb, None)
            if handler is None or call.verb in ("FlowBuilder", "from_"):
                raise _fail(call, "FlowBuilder() / FlowBuilder.from_(m) can only start a flow")
            if call.verb != "input":
                handler(call)
        return self.finish()

    def finish(self) -> Graph:
        if self.fork is not None:
            raise _fail(self.fork.call, "the fork's output is never tagged; follow .fork(m) with .tag(name)")
        if len(self.current) != 1:
            raise _fail(self.split_call, f"left {len(self.current)} open streams at build(); "
                                         "combine them with .merge(op) (MergeOp.ADD, MEAN, CAT, MUL, MAX)")
        for name, users in self.pending.items():
            if name not in self.tags:
                node, call = users[0]
                hint = did_you_mean(name, self.tags)
                raise _fail(call, f"tag {name!r} is never defined (unresolved){hint}")
        tags = self.name_children()
        return Graph(self.nodes, self.input_names, self.current[0],
                     {n: t.stream for n, t in self.tags.items()}, self.tag_inits, self.forward_tags,
                     self.label, tags)

    # ------------------------------------------------------------------ verbs
    def do_input(self, call: Call) -> None:
        if not call.args:
            raise _fail(call, "give at least one input name: .input('context')")
        for name in call.args:
            _check_name(call, name, "input name")
            if name in self.tags:
                raise _fail(call, f"input {name!r} is already defined by {self.tags[name].call.describe()}")
            stream = self.stream()
            self.tags[name] = _Tag(stream, None, call)
            self.input_names.append(name)

    def do_through(self, call: Call) -> None:
        module = _check_module(call, call.args[0])
        node = self.add(ModuleNode("through", call, module, self.single(call), self.stream()), call)
        self.current = [node.output]

    def do_also(self, call: Call) -> None:
        module = _check_module(call, call.args[0])
        node = self.add(AlsoNode(call, module, self.single(call), self.stream()), call)
        self.current = [node.output]

    def do_fork(self, call: Call) -> None:
        module = _check_module(call, call.args[0])
        self.fork = self.add(ModuleNode("fork", call, module, self.single(call), self.stream()), call)

    def do_split(self, call: Call) -> None:
        source = self.single(call)
        if len(call.args) < 2:
            raise _fail(call, f"split needs at least 2 branch modules, got {len(call.args)}; "
                              "use .through(m) for a single one")
        k = self.split_count
        self.split_count += 1
        branches = []
        for i, module in enumerate(call.args):
            _check_module(call, module, f"branch {i}")
            node = ModuleNode("split", call, module, source, self.stream(), role=f"split_{k}_{i}")
            self.nodes.append(node)
            self.producer[node.output] = node
            branches.append(node)
        self.current = [b.output for b in branches]
        self.targets = branches
        self.target_call = call
        self.split_call = call

    def do_merge(self, call: Call) -> None:
        op = call.args[0]
        if not isinstance(op, MergeOp) and not callable(op):
            raise _fail(call, f"merge op must be a MergeOp (ADD, MEAN, CAT, MUL, MAX) or a callable taking "
                              f"the list of branch outputs, got {type(op).__name__}")
        if len(self.current) < 2:
            raise _fail(call, "there is only one stream to merge; .merge(op) combines the branches of a "
                              "preceding .split(m1, m2, ...)")
        node = self.add(MergeNode(call, op, list(self.current), self.stream()), call)
        self.current = [node.output]

    def do_tag(self, call: Call) -> None:
        name = _check_name(call, call.args[0], "tag")
        if name in self.tags:
            where = self.tags[name].call
            if where.verb == "input":
                raise _fail(call, f"tag {name!r} is already defined by {where.describe()} (graph inputs are "
                                  "tags from the start); choose another name")
            raise _fail(call, f"tag {name!r} is already defined by {where.describe()}; "
                              "each tag names one stream, choose another name")
        if self.fork is not None:
            node, self.fork = self.fork, None
            stream = node.output
        else:
            stream = self.single(call)
            node = self.producer.get(stream)
        if node is not None:
            node.tags.append(name)
        self.tags[name] = _Tag(stream, node, call)
        if "init" in call.kwargs:
            init = call.kwargs["init"]
            if not isinstance(init, Tensor) and not callable(init):
                raise _fail(call, f"init must be a Tensor or a function of the consumer's input, got "
                                  f"{type(init).__name__}")
            self.tag_inits[name] = init
        if name in self.pending:
            self.forward_tags.add(name)

    def do_using(self, call: Call) -> None:
        if not call.args:
            raise _fail(call, "give at least one tag name: .using('hidden')")
        if not self.targets:
            raise _fail(call, "there is no module before it to receive the refs; .using(...) follows "
                              ".through/.also/.fork/.split/.merge/.gate/.switch/a loop, or "
                              "FlowBuilder.from_(m)")
        for name in call.args:
            if not isinstance(name, str):
                raise _fail(call, f"tag names are strings, got {name!r}")
            for node in self.targets:
                self.wire_ref(call, node, name)

    def wire_ref(self, call: Call, node: Node, name: str) -> None:
        if name not in self.tags and name not in self.all_tags:
            raise _fail(call, f"unknown tag {name!r}: no .tag() or .input() defines it"
                              f"{did_you_mean(name, self.all_tags)}")
        receiver = node.ref_receiver()
        what = f"{node.call.describe()}"
        if receiver is None:
            raise _fail(call, f"{what} cannot take refs (a built-in merge op or a map body); put the module "
                              "that needs them after it: .through(m).using(...)")
        if name in node.refs:
            raise _fail(call, f"{what} already receives {name!r}")
        if not accepts_keyword(receiver, name):
            if isinstance(receiver, Module):
                rname = type(receiver).__name__
            else:
                rname = getattr(receiver, "__name__", "it")
            if isinstance(receiver, Graph):
                hint = f"declare it in that graph with .input({name!r})"
                have = f"its inputs are {receiver.input_names}"
            else:
                hint = f"add a {name!r} parameter (or **kwargs) to {rname}.forward"
                have = "its forward does not accept that keyword"
            raise _fail(call, f"{rname} (from {what}) cannot take the ref {name!r}: {have}; {hint}")
        tag = self.tags.get(name)
        if tag is not None:
            if tag.stream == node.output:
                raise _fail(call, f"{name!r} is the output of the module receiving it ({what}): a cycle; "
                                  f"to feed the previous call's value, call .using({name!r}) before "
                                  f".tag({name!r})")
            node.refs[name] = Ref(name, tag.stream, call)
        else:
            node.refs[name] = Ref(name, None, call)
            self.pending.setdefault(name, []).append((node, call))

    def do_loop_body(self, call: Call) -> None:
        body = _check_module(call, call.args[0], "loop body")
        source = self.single(call)
        mode = call.finish
        cond = None
        count = max_iter = None
        if mode == "for_n":
            count = _check_count(call, call.finish_args[0], "for_n(n): n")
        else:
            cond = _check_module(call, call.finish_args[0], "loop condition")
            max_iter = _check_count(call, call.finish_args[1], f"{mode}(cond, max_iter): max_iter")
        kind = {"for_n": "for_n", "while_cond": "while", "until_cond": "until"}[mode]
        node = self.add(LoopNode(call, body, kind, count, cond, max_iter, source, self.stream()), call)
        self.current = [node.output]

    def do_gate(self, call: Call) -> None:
        router = _check_module(call, call.args[0], "router")
        experts = self.module_list(call, call.args[1], "experts", "expert")
        node = self.add(GateNode(call, router, experts, self.single(call), self.stream()), call)
        self.current = [node.output]

    def do_switch(self, call: Call) -> None:
        selector = _check_module(call, call.args[0], "selector")
        branches = self.module_list(call, call.args[1], "branches", "branch")
        node = self.add(SwitchNode(call, selector, branches, self.single(call), self.stream()), call)
        self.current = [node.output]

    def module_list(self, call: Call, value: Any, what: str, one: str) -> list[Module]:
        if not isinstance(value, list):
            raise _fail(call, f"{what} must be a list of modules, got {type(value).__name__}")
        if len(value) < 2:
            raise _fail(call, f"needs at least 2 {what}, got {len(value)}; use .through(m) for a single one")
        return [_check_module(call, m, f"{one} {i}") for i, m in enumerate(value)]

    def do_map(self, call: Call) -> None:
        body = _check_module(call, call.args[0], "map body")
        mode = call.finish
        batched = bool(call.kwargs.get("batched"))
        source = self.single(call)
        slices = over = None
        if mode == "over":
            over = call.finish_args[0]
            if not isinstance(over, str):
                raise _fail(call, f"over(tag) takes a tag name, got {over!r}")
            tag = self.tags.get(over)
            if tag is None:
                later = next((c for c in self.calls if c.verb == "tag" and c.args and c.args[0] == over
                              and c.index > call.index), None)
                if later is not None:
                    raise _fail(call, f"maps over tag {over!r}, which {later.describe()} defines later: "
                                      "a cycle within one pass; tag the tensor before the map")
                raise _fail(call, f"unknown tag {over!r}{did_you_mean(over, self.tags)}")
            source = tag.stream
        elif mode == "slices":
            slices = _check_count(call, call.finish_args[0], "slices(n): n")
        mode = "each" if mode == "batched" else mode
        node = self.add(MapNode(call, body, mode, batched, source, self.stream(), slices, over), call)
        self.current = [node.output]

    def do_label(self, call: Call) -> None:
        name = _check_name(call, call.args[0], "label")
        if self.label_call is not None:
            raise _fail(call, f"the graph is already labelled {self.label!r} by {self.label_call.describe()}")
        self.label, self.label_call = name, call

    # ------------------------------------------------------------------ naming
    def name_children(self) -> dict[str, str | None]:
        """Give each node its name and each module its child name; returns the ``tags`` map."""
        counters: dict[str, int] = {}
        owner: dict[str, tuple[Module, Call]] = {}

        def claim(name: str, module: Module, call: Call) -> None:
            prev = owner.get(name)
            if prev is not None and prev[0] is not module:
                if isinstance(module, Graph) and isinstance(prev[0], Graph) and module.label == name:
                    raise _fail(call, f"duplicate label {name!r}: {prev[1].describe()} already holds a "
                                      "subgraph labelled so; give each subgraph its own .label()")
                raise _fail(call, f"child name {name!r} is used twice (also by {prev[1].describe()}); rename "
                                  "the tag or label")
            owner[name] = (module, call)

        for node in self.nodes:
            roles = node.roles()
            single = len(roles) == 1 and roles[0][0] in ("", node_role(node))
            labelled = single and _label_of(roles[0][1]) is not None
            if node.tags:
                base = node.tags[0]
            elif labelled:
                base = _label_of(roles[0][1])
            elif node.kind == "split":
                base = node.role
            else:
                k = counters.get(node.kind, 0)
                counters[node.kind] = k + 1
                base = f"{node.kind}_{k}"
            node.name = base
            for suffix, module in roles:
                label = _label_of(module)
                if label is not None:
                    child = label
                else:
                    child = base if suffix in ("", node_role(node)) else base + suffix
                claim(child, module, node.call)
                node.children[child] = module
            if single and labelled:
                node.name = next(iter(node.children))
        tags: dict[str, str | None] = {}
        for name, tag in self.tags.items():
            tags[name] = tag.node.main_module_name() if tag.node is not None else None
        return tags


def node_role(node: Node) -> str:
    """The node's role inside a compound verb (``"router"``, ``"expert"`` ...), or ``""``."""
    return getattr(node, "role", "")


def _label_of(module: Any) -> str | None:
    return module.label if isinstance(module, Graph) and module.label else None


def compile_calls(calls: tuple[Call, ...]) -> Graph:
    """Validate ``calls`` and build the ``Graph`` they describe."""
    return _Compiler(calls).run()
