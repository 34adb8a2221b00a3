"""Dotted paths through a tree of graphs, and what hangs off them: parameters, freezing, training mode.

A path is dot-separated names from the root graph: every part but the last is the label of a nested
graph; the last is a label (``PathKind.SUBGRAPH``) or a tag (``PathKind.TAG``) of the graph reached.
Tags beginning with ``_`` are internal to their graph: a parent cannot address them.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterator

from ..errors import FlowError, PathError
from ..nn import Module, Parameter


class PathKind(enum.Enum):
    """What a dotted path names."""

    SUBGRAPH = "subgraph"
    TAG = "tag"


def _subgraphs(graph: Module) -> dict[str, Module]:
    fn = getattr(graph, "subgraphs", None)
    return dict(fn()) if callable(fn) else {}


def _tags(graph: Module, internal: bool) -> dict[str, str | None]:
    tags = dict(getattr(graph, "tags", {}) or {})
    return tags if internal else {k: v for k, v in tags.items() if not k.startswith("_")}


def _fail(path: str, walked: list[str], part: str, graph: Module, internal: bool) -> PathError:
    choices = list(_subgraphs(graph)) + list(_tags(graph, internal))
    where = ".".join(walked) if walked else "the root graph"
    close = difflib.get_close_matches(part, choices, n=1)
    hint = f" did you mean {'.'.join([*walked, close[0]])!r}?" if close else ""
    hidden = ""
    if part.startswith("_") and part in _tags(graph, True):
        hidden = f" ({part!r} is an internal tag of {where}: names starting with '_' are hidden from parents)"
    return PathError(
        f"path {path!r}: {where} has no subgraph or tag {part!r}{hidden};{hint} valid here: {sorted(choices)}"
    )


def resolve(root: Module, path: str) -> tuple[PathKind, Module, str]:
    """Resolve ``path`` to ``(kind, graph holding the last part, last part)``; PathError if it breaks."""
    if not isinstance(path, str):
        raise PathError(f"invalid path {path!r}: a path must be a str of dot-separated labels/tags like "
                        f"'encoder.scan.hidden', got {type(path).__name__}")
    if not path or path.startswith(".") or path.endswith(".") or ".." in path:
        raise PathError(f"invalid path {path!r}: expected dot-separated labels/tags like 'encoder.scan.hidden'")
    parts = path.split(".")
    graph = root
    walked: list[str] = []
    for i, part in enumerate(parts):
        internal = i == 0  # a graph sees its own internal tags; parents do not
        subs = _subgraphs(graph)
        last = i == len(parts) - 1
        if part in subs:
            if last:
                return PathKind.SUBGRAPH, graph, part
            graph = subs[part]
            walked.append(part)
            continue
        if last and part in _tags(graph, internal):
            return PathKind.TAG, graph, part
        raise _fail(path, walked, part, graph, internal)
    raise PathError(f"invalid path {path!r}")  # unreachable: the loop returns or raises


def validate_path(root: Module, path: str) -> PathKind:
    """``PathKind.SUBGRAPH`` or ``PathKind.TAG`` for a valid path; ``fg.PathError`` with a suggestion otherwise."""
    return resolve(root, path)[0]


def subgraph_at(root: Module, path: str) -> Module:
    """The nested graph at ``path`` (which must name a subgraph, not a tag)."""
    kind, graph, name = resolve(root, path)
    if kind is not PathKind.SUBGRAPH:
        raise PathError(f"path {path!r} names a tag, not a subgraph; a checkpoint or subtree needs a labelled graph")
    return _subgraphs(graph)[name]


def module_at(root: Module, path: str) -> Module | None:
    """The module a path addresses: the subgraph itself, or the module whose output the tag names
    (``None`` for a tag on a stream no module produced, such as a merge)."""
    kind, graph, name = resolve(root, path)
    if kind is PathKind.SUBGRAPH:
        return _subgraphs(graph)[name]
    child = _tags(graph, True).get(name)
    return None if child is None else graph._modules.get(child)


def _prefix_of(root: Module, target: Module) -> str:
    for name, m in root.named_modules():
        if m is target:
            return name
    raise FlowError("internal: module not found in its own tree")


def named_parameters_at(root: Module, path: str) -> Iterator[tuple[str, Parameter]]:
    """``(full dotted name, parameter)`` for every parameter under ``path``."""
    target = module_at(root, path)
    if target is None:
        return iter(())
    prefix = _prefix_of(root, target)
    return target.named_parameters(prefix=prefix)


def parameters_at(root: Module, path: str) -> list[Parameter]:
    """Every parameter under ``path`` (for optimizer param groups)."""
    return [p for _, p in named_parameters_at(root, path)]


def _params_or_fail(root: Module, path: str, verb: str) -> list[Parameter]:
    params = parameters_at(root, path)
    if not params:
        raise FlowError(
            f"{verb}({path!r}): nothing to {verb} there (no parameters under that path; a tag on a merge or "
            "on a parameter-free module has none): name the subgraph or the tagged layer that owns the weights"
        )
    return params


def freeze(root: Module, path: str) -> None:
    """Stop gradients for every parameter under ``path`` (``requires_grad = False``)."""
    for p in _params_or_fail(root, path, "freeze"):
        p.requires_grad = False
        p.grad = None


def thaw(root: Module, path: str) -> None:
    """Make every parameter under ``path`` trainable again."""
    for p in _params_or_fail(root, path, "thaw"):
        p.requires_grad = True


def is_frozen(root: Module, path: str) -> bool:
    """True when every parameter under ``path`` is frozen."""
    return all(not p.requires_grad for p in _params_or_fail(root, path, "is_frozen"))


def trainable_parameters(root: Module) -> list[Parameter]:
    """Parameters that require grad (frozen ones left out)."""
    return [p for p in root.parameters() if p.requires_grad]


def set_training_at(root: Module, path: str, mode: bool) -> None:
    """Training (``True``) or evaluation mode for the subtree at ``path`` only (e.g. freeze BatchNorm stats)."""
    if not isinstance(mode, bool):
        raise FlowError(f"set_training_at({path!r}, mode={mode!r}): mode must be a bool (True: training, "
                        "False: evaluation)")
    target = module_at(root, path)
    if target is None:
        raise FlowError(f"set_training_at({path!r}): the tag names a stream with no module")
    target.train(mode)
