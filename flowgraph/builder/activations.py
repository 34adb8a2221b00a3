"""Activation checkpointing by path: ``graph.checkpoint_activations("encoder")``.

The module a path names (a labelled subgraph, or the module whose output a tag names) gets a stand-in for
its ``forward`` that runs the real one through ``flowgraph.utils.checkpoint``: the subtree keeps only its
inputs in forward and is recomputed in backward. Its parameters are the checkpoint node's inputs, so they get
their gradients through the engine as usual. The recompute leaves no trace: running statistics (BatchNorm)
and the graphs' stored tag values, forward-reference state, loop records and profile are put back as the
forward left them, so a checkpointed step updates them exactly once, as an unchecked one does; and the
recompute reads the forward-reference values the forward read (the previous call's), not those it left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, PathError
from ..nn.module import Module
from ..tree.paths import PathKind, module_at, resolve
from ..utils.checkpoint import run_checkpointed


class CheckpointedForward:
    """Stands in for a module's ``forward`` (an instance attribute) while checkpointing is on for it.

    It holds the module, not a bound method, so ``copy.deepcopy`` of the model gives the copy its own.
    """

    def __init__(self, module: Module):
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .graph import Graph

        module = self.module
        forward = type(module).forward.__get__(module)
        params = [p for p in module.parameters() if p.requires_grad]
        # The forward-reference values this call reads: the recompute must read them again, not the values
        # this call leaves for the next one.
        refs = [(g, dict(g._state)) for g in module.modules() if isinstance(g, Graph) and g._forward_tags]

        def on_recompute() -> Callable[[], None]:
            restore = _snapshot(module)
            for g, state in refs:
                g._state = dict(state)
            return restore

        return run_checkpointed(forward, args, kwargs, params, True, on_recompute)


def _snapshot(module: Module) -> Callable[[], None]:
    """Remember what a forward of ``module`` changed besides its outputs; return the function restoring it."""
    from .graph import Graph

    buffers = []
    for m in module.modules():
        for name, buf in m._buffers.items():
            if buf is not None:
                buffers.append((m, name, buf, buf.clone()))
    graphs = [(g, dict(g._state), dict(g.tag_values), dict(g._loop_info), dict(g._profile))
              for g in module.modules() if isinstance(g, Graph)]

    def restore() -> None:
        with no_grad():
            for m, name, buf, copy in buffers:
                if m._buffers.get(name) is not buf:
                    m._buffers[name] = buf  # the recompute rebound the buffer: the forward's object comes back
                else:
                    buf.copy_(copy)  # the recompute wrote into it
        for g, state, tags, loops, profile in graphs:
            g._state, g.tag_values, g._loop_info, g._profile = state, tags, loops, profile

    return restore


def checkpoint_activations(root: Module, path: str, enabled: bool = True, *, keep_tag_values: bool = True) -> None:
    """Recompute the subtree at ``path`` in backward instead of keeping its activations (``enabled=False``
    turns it off again). ``path`` names a labelled subgraph or a tag on one module's output.
    ``keep_tag_values=False`` leaves the part's tag values (the tag ``path`` names and every tag inside the
    part) out of the graphs' ``tag_values`` while checkpointing is on, so they are freed with the activations."""
    for name, value in (("enabled", enabled), ("keep_tag_values", keep_tag_values)):
        if not isinstance(value, bool):
            raise FlowError(f"checkpoint_activations({path!r}, {name}=...): expected True or False, got {value!r}")
    target = module_at(root, path)  # PathError with a suggestion for a bad path
    if target is None:
        raise PathError(
            f"checkpoint_activations({path!r}): the tag names a stream no single module produced (a merge, a "
            "split or a loop's output); name the labelled subgraph or a tag on the module to recompute"
        )
    current = target.__dict__.get("forward")
    if enabled and not isinstance(current, CheckpointedForward):
        object.__setattr__(target, "forward", CheckpointedForward(target))
    elif not enabled and isinstance(current, CheckpointedForward):
        del target.__dict__["forward"]
    _keep_tag_values(root, path, target, keep_tag_values or not enabled)


def _keep_tag_values(root: Module, path: str, target: Module, keep: bool) -> None:
    """Record (``keep``) or leave out of ``tag_values`` the tag ``path`` names and every tag inside ``target``."""
    from .graph import Graph

    kind, holder, name = resolve(root, path)
    owners: list[tuple[Graph, set[str]]] = []
    if kind is PathKind.TAG and isinstance(holder, Graph):
        owners.append((holder, {name}))
    for g in target.modules():
        if isinstance(g, Graph):
            owners.append((g, set(g._tag_streams)))
    for g, tags in owners:
        if keep:
            g._unkept_tags -= tags
        else:
            g._unkept_tags |= tags
            for tag in tags:
                g.tag_values.pop(tag, None)
