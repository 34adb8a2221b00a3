"""DOT and SVG drawings of a ``Graph``: node shapes by verb, ref edges (dashed) and forward-ref edges
(dotted, from the previous call), labelled subgraphs as clusters, and optional per-node time heat colours."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import FlowError

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph

_SHAPES = {
    "input": "invhouse", "from": "box", "through": "box", "fork": "box", "split": "box", "also": "box",
    "merge": "circle", "loop": "doubleoctagon", "gate": "trapezium", "switch": "diamond",
    "map": "parallelogram", "output": "house",
}
_STYLES = {"fork": "dashed,rounded", "also": "rounded,bold", "split": "rounded"}


def _q(text: str) -> str:
    """A quoted DOT string (newlines become DOT line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _heat(fraction: float) -> str:
    """White (0) to red (1)."""
    level = max(0, min(255, int(round(255 * (1 - fraction)))))
    return f"#ff{level:02x}{level:02x}"


def _count(modules: list) -> tuple[int, int]:
    """``(parameters, trainable parameters)`` of ``modules`` (each parameter once)."""
    seen: set[int] = set()
    total = trainable = 0
    for module in modules:
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            total += n
            trainable += n if p.requires_grad else 0
    return total, trainable


def _frozen_state(total: int, trainable: int) -> str:
    if total == 0:
        return "no parameters"
    if trainable == 0:
        return "frozen"
    return "trainable" if trainable == total else "partly frozen"


class _Writer:
    def __init__(self, profile: dict[str, float] | None):
        self.lines: list[str] = []
        self.edges: list[str] = []  # edges are written at the top level so no node is pulled into a cluster
        self.profile = profile
        self.total = sum(profile.values()) if profile else 0.0
        self.details: list[dict] = []  # one entry per drawn node, keyed by its DOT id (see node_details)

    def _describe(self, nid: str, kind: str, name: str, modules: list, seconds: float | None) -> str:
        """Record the node's details; returns its tooltip (path, module, parameters, frozen state, time)."""
        total, trainable = _count(modules)
        entry = {
            "id": nid, "path": nid, "kind": kind, "name": name,
            "modules": [type(m).__name__ for m in modules],
            "parameters": total, "trainable": trainable, "frozen": _frozen_state(total, trainable),
        }
        lines = [nid]
        if modules:
            lines.append(", ".join(entry["modules"]))
            lines.append(f"{total:,} parameters ({entry['frozen']})" if total else "no parameters")
        if seconds is not None:
            entry["seconds"] = seconds
            entry["share"] = seconds / self.total if self.total > 0 else 0.0
            lines.append(f"{seconds * 1e3:.3f} ms ({entry['share']:.0%} of the forward)")
        self.details.append(entry)
        return "\n".join(lines)

    def emit(self, graph: Graph, prefix: str, indent: str, inputs: list[str] | None,
             profile: dict[str, float] | None = None) -> str:
        """Write ``graph``'s nodes (``inputs``: outer node ids feeding its inputs); returns its output id.

        ``profile``: this graph's seconds per node name (a subgraph's come from its own profile)."""
        from .graph import Graph

        if profile is None:
            profile = self.profile

        ids: dict[int, str] = {}
        names = ["x"] + graph.input_names
        for i, name in enumerate(names):
            if inputs is not None and i < len(inputs) and inputs[i] is not None:
                ids[i] = inputs[i]
            else:
                nid = f"{prefix}in_{name}"
                tip = self._describe(nid, "input", name, [], None)
                self.lines.append(f"{indent}{_q(nid)} [label={_q(name)}, shape=invhouse, id={_q('fg:' + nid)}, "
                                  f"tooltip={_q(tip)}];")
                ids[i] = nid
        forward: list[tuple[str, str, str]] = []
        for node in graph.nodes():
            nid = f"{prefix}{node.name}"
            sources = [ids.get(s) for s in node.inputs]
            modules = list(node.children.values())
            sub = None
            if len(modules) == 1 and isinstance(modules[0], Graph) and modules[0].label:
                sub = modules[0]
            if sub is not None and node.kind in ("from", "through", "fork", "split"):
                self.lines.append(f"{indent}subgraph {_q('cluster_' + nid)} {{")
                self.lines.append(f"{indent}  label={_q(sub.label)}; style=rounded; color=gray40;")
                inner: list[str | None] = [sources[0]]
                for name in sub.input_names:  # refs feed the subgraph's own inputs
                    ref = node.refs.get(name)
                    inner.append(ids.get(ref.stream) if ref is not None and ref.stream is not None else None)
                inner_profile = sub.profile() if self.profile is not None else None
                out = self.emit(sub, nid + ".", indent + "  ", inner, inner_profile)
                self.lines.append(f"{indent}}}")
                ids[node.output] = out
                for name, ref in node.refs.items():
                    if ref.stream is None:
                        forward.append((name, f"{nid}.in_{name}", node.name))
                continue
            label = self._label(node)
            attrs = [f"label={_q(label)}", f"shape={_SHAPES.get(node.kind, 'box')}"]
            style = _STYLES.get(node.kind, "")
            seconds = None
            if self.profile is not None:
                seconds = profile.get(node.name, 0.0) if profile is not None else 0.0
                frac = seconds / self.total if self.total > 0 else 0.0
                attrs.append(f"fillcolor={_q(_heat(frac))}")
                style = (style + ",filled").strip(",")
            attrs.append(f"id={_q('fg:' + nid)}")
            attrs.append(f"tooltip={_q(self._describe(nid, node.kind, node.name, modules, seconds))}")
            if style:
                attrs.append(f"style={_q(style)}")
            self.lines.append(f"{indent}{_q(nid)} [{', '.join(attrs)}];")
            for s in sources:
                if s is not None:
                    self.edges.append(f"  {_q(s)} -> {_q(nid)};")
            if node.kind == "also" and sources and sources[0]:
                self.edges.append(f"  {_q(sources[0])} -> {_q(nid)} [style=dashed, label=\"skip\"];")
            ids[node.output] = nid
            self._refs(node, ids, nid, forward)
        out = f"{prefix}out"
        tip = self._describe(out, "output", "output", [], None)
        self.lines.append(f"{indent}{_q(out)} [label=\"output\", shape=house, id={_q('fg:' + out)}, "
                          f"tooltip={_q(tip)}];")
        self.edges.append(f"  {_q(ids[graph._output])} -> {_q(out)};")
        for tag, target, _ in forward:
            stream = graph._tag_streams.get(tag)
            src = ids.get(stream)
            if src is not None:
                self.edges.append(
                    f"  {_q(src)} -> {_q(target)} [style=dotted, color=red, constraint=false, "
                    f"label={_q(tag + ' (previous call)')}];"
                )
        return out

    def _refs(self, node, ids, target, forward) -> None:
        for tag, ref in node.refs.items():
            if ref.stream is not None and ids.get(ref.stream) is not None:
                self.edges.append(
                    f"  {_q(ids[ref.stream])} -> {_q(target)} "
                    f"[style=dashed, color=blue, label={_q(tag)}];"
                )
            else:
                forward.append((tag, target, node.name))

    def _label(self, node) -> str:
        lines = [node.name]
        cfg = node.config()
        if node.kind == "merge":
            lines.append(str(cfg.get("op")))
        elif len(node.children) > 1:
            lines.extend(f"{c}: {type(m).__name__}" for c, m in node.children.items())
        elif node.children:
            lines.append(type(next(iter(node.children.values()))).__name__)
        if node.kind == "loop":
            if cfg["mode"] == "for_n":
                lines.append(f"x{cfg['n']}")
            else:
                lines.append(f"{cfg['mode']}, max {cfg['max_iter']}")
        elif node.kind == "map":
            lines.append(f"map {cfg['mode']}" + (" batched" if cfg["batched"] else ""))
        elif node.kind == "also":
            lines.append("x + m(x)")
        if node.tags:
            lines.append("#" + ", #".join(node.tags))
        return "\n".join(lines)


def to_dot(graph: Graph, profile: dict[str, float] | None = None) -> str:
    """DOT source for ``graph``; with ``profile`` (seconds per node) nodes are heat-coloured."""
    w = _Writer(profile)
    title = graph.label or "flowgraph"
    w.lines.append(f"digraph {_q(title)} {{")
    w.lines.append('  rankdir=TB; node [fontname="Helvetica", fontsize=10];')
    w.lines.append('  edge [fontname="Helvetica", fontsize=9];')
    w.emit(graph, "", "  ", None)
    w.lines.extend(w.edges)
    w.lines.append("}")
    return "\n".join(w.lines) + "\n"


def node_details(graph: Graph, profile: dict[str, float] | None = None) -> list[dict]:
    """One dict per node drawn by ``to_dot`` (same order): ``id`` (the DOT node name; the SVG element's id is
    ``"fg:" + id``), ``path``, ``kind``, ``name``, ``modules``, ``parameters``, ``trainable``, ``frozen``
    (``"trainable"``, ``"frozen"``, ``"partly frozen"`` or ``"no parameters"``) and, with ``profile``,
    ``seconds`` and ``share`` of the forward."""
    w = _Writer(profile)
    w.emit(graph, "", "  ", None)
    return w.details


def render_svg(dot: str, path: str | None = None) -> str:
    """SVG text for DOT source via the ``graphviz`` package; writes ``path`` when given."""
    try:
        import graphviz
    except ImportError as exc:  # pragma: no cover - graphviz is a dependency
        raise FlowError("SVG output needs the 'graphviz' Python package: pip install graphviz") from exc
    try:
        svg = graphviz.Source(dot).pipe(format="svg").decode("utf-8")
    except graphviz.ExecutableNotFound as exc:
        raise FlowError(
            "SVG output needs Graphviz's 'dot' program, which is not installed; install Graphviz "
            "(apt-get install graphviz, brew install graphviz, or https://graphviz.org/download/), "
            "or use graph.dot() for the DOT source"
        ) from exc
    if path is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(svg)
    return svg
