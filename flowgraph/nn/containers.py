"""Containers: ``Sequential``, ``ModuleList``, ``ModuleDict``, ``ParameterList``, and ``Identity``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import FlowError
from .module import Module, Parameter


class Identity(Module):
    """Returns its input unchanged (accepts and ignores extra arguments, as PyTorch's does)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x


class Sequential(Module):
    """Modules called in order: ``Sequential(nn.Linear(2, 4), nn.ReLU())`` or from an ``OrderedDict``."""

    def __init__(self, *modules: Module):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, idx: int | slice) -> Module:
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        try:
            return mods[idx]
        except IndexError:
            raise FlowError(f"Sequential index {idx} out of range for {len(mods)} modules") from None

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        """Add a module at the end."""
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    """A list of modules registered as children ``"0"``, ``"1"``, ..."""

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        """Add a module at the end."""
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Add several modules."""
        for m in modules:
            self.append(m)
        return self

    def _reindex(self, mods: list) -> None:
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before ``index`` (the keys are renumbered, as in PyTorch)."""
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._reindex(mods)

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index``."""
        mods = list(self._modules.values())
        try:
            out = mods.pop(index)
        except IndexError:
            raise FlowError(f"ModuleList.pop({index}): index out of range for {len(mods)} modules") from None
        self._reindex(mods)
        return out

    def __delitem__(self, idx: int | slice) -> None:
        mods = list(self._modules.values())
        del mods[idx]
        self._reindex(mods)

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(list(self) + list(other))

    def __getitem__(self, idx: int | slice):
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            return ModuleList(mods[idx])
        return mods[idx]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[idx]
        self._modules[key] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise FlowError("ModuleList is a container, not a layer: iterate over it in your forward()")

    def __repr__(self) -> str:
        """PyTorch's form: runs of identical children are folded, ``(0-2): 3 x Linear(...)``."""
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        runs: list[list] = []  # [start, end, text]
        for i, text in enumerate(reprs):
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        lines = []
        for start, end, text in runs:
            line = f"({start}): {text}" if start == end else f"({start}-{end}): {end - start + 1} x {text}"
            lines.append(line.replace("\n", "\n  "))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """A dict of modules registered as children by key (insertion order kept)."""

    def __init__(self, modules: dict[str, Module] | None = None):
        super().__init__()
        for k, m in (modules or {}).items():
            self.add_module(k, m)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self):
        """The keys."""
        return self._modules.keys()

    def values(self):
        """The modules."""
        return self._modules.values()

    def items(self):
        """``(key, module)`` pairs."""
        return self._modules.items()

    def pop(self, key: str) -> Module:
        """Remove and return the module under ``key``."""
        if key not in self._modules:
            raise FlowError(f"ModuleDict.pop({key!r}): no such key; keys: {list(self._modules)}")
        return self._modules.pop(key)

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()

    def update(self, modules) -> None:
        """Add or replace modules from a dict or an iterable of ``(key, module)`` pairs."""
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module

    def __delitem__(self, key: str) -> None:
        self.pop(key)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise FlowError("ModuleDict is a container, not a layer: index it in your forward()")


class ParameterList(Module):
    """A list of parameters registered as ``"0"``, ``"1"``, ..."""

    def __init__(self, parameters: Iterable[Parameter] | None = None):
        super().__init__()
        for p in parameters or ():
            self.append(p)

    def append(self, p: Parameter) -> ParameterList:
        """Add a parameter."""
        self.register_parameter(str(len(self._parameters)), p if isinstance(p, Parameter) else Parameter(p))
        return self

    def extend(self, parameters: Iterable[Parameter]) -> ParameterList:
        """Add several parameters."""
        for p in parameters:
            self.append(p)
        return self

    def __getitem__(self, idx: int) -> Parameter:
        return list(self._parameters.values())[idx]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._parameters.values())
