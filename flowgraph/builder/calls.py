"""Builder call records: every fluent call is kept, so build errors can name it ("call #4 .using('h')")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class Call:
    """One fluent call: its 1-based position, verb, arguments and (for loop/map) its finishing verb."""

    index: int
    verb: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    finish: str | None = None
    finish_args: tuple = ()

    def describe(self) -> str:
        """``"call #4 .using('encoded')"``: how error messages name this call."""
        if self.verb == "FlowBuilder":
            text = "FlowBuilder()"
        elif self.verb == "from_":
            text = f"FlowBuilder.from_({_args_text(self.args, self.kwargs)})"
        elif self.verb == "map":
            text = f".map({_args_text(self.args, {})})"
            if self.kwargs.get("batched") and self.finish != "batched":
                text += ".batched()"
        else:
            text = f".{self.verb}({_args_text(self.args, self.kwargs)})"
        if self.finish is not None:
            text += f".{self.finish}({_args_text(self.finish_args, {})})"
        return f"call #{self.index} {text}"


def _arg_text(value: Any) -> str:
    from ..nn.module import Module

    if isinstance(value, Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, Module):
        label = getattr(value, "label", None)
        name = type(value).__name__
        return f"{name} {label!r}" if isinstance(label, str) and name == "Graph" else name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_arg_text(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)
    return getattr(value, "__name__", type(value).__name__)


def _args_text(args: tuple, kwargs: dict) -> str:
    parts = [_arg_text(a) for a in args] + [f"{k}={_arg_text(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'encoded'?"`` when a close candidate exists, else a list of the known names."""
    candidates = sorted(set(candidates))
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    if candidates:
        return f"; known tags: {candidates}"
    return "; no tags are defined yet"
