"""Utilities above the core, under PyTorch's ``torch.utils`` names: ``flowgraph.utils.checkpoint`` (activation
checkpointing), ``flowgraph.utils.data`` (datasets and loaders).

This package imports none of them itself: ``import flowgraph.utils.checkpoint`` loads one, and attribute
access (``fg.utils.checkpoint``) loads it on first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    """Load the submodule ``name`` on first access (PEP 562), so ``fg.utils.checkpoint`` works unimported."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
