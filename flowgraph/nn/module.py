"""``nn.Module`` and ``nn.Parameter`` with PyTorch's names and semantics.

Submodules, parameters and buffers assigned as attributes are registered in insertion order, so
``named_parameters()`` and ``state_dict()`` keys are deterministic (``"0.weight"``, ``"encoder.scan.weight"``).
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator
from typing import Any

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor
from ..tensor.tensor import _wrap


class Parameter(Tensor):
    """A tensor that a ``Module`` registers as a learnable parameter (``requires_grad=True`` by default)."""

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        from ..tensor import zeros

        if data is None:
            data = zeros(0)
        if not isinstance(data, Tensor):
            from ..tensor import tensor

            data = tensor(data)
        p = object.__new__(cls)
        p._data = data._data
        p._backend = data._backend
        p.requires_grad = bool(requires_grad)
        p.grad = None
        p._grad_fn = None
        p._vc = None
        p._hooks = None
        p._oi = 0
        p._acc = None
        p._view = None
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True):
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + Tensor.__repr__(self)


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
IncompatibleKeys.__doc__ = "What ``load_state_dict`` could not match: ``(missing_keys, unexpected_keys)``."


#: Counts every change to any module's parameter or buffer registry (``_Registry``): fg.jit's guards compare it
#: with the count at their last check and re-read each module's entries only when it moved.
STRUCTURE_VERSION = [0]


class _Registry(OrderedDict):
    """A module's ``_parameters`` or ``_buffers``: an ordered dict whose every change bumps ``STRUCTURE_VERSION``."""

    def __setitem__(self, key: str, value: Any) -> None:
        STRUCTURE_VERSION[0] += 1
        OrderedDict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        STRUCTURE_VERSION[0] += 1
        OrderedDict.__delitem__(self, key)

    def pop(self, *args: Any) -> Any:
        """As ``dict.pop`` (counted as a change)."""
        STRUCTURE_VERSION[0] += 1
        return OrderedDict.pop(self, *args)

    def popitem(self, last: bool = True) -> Any:
        """As ``OrderedDict.popitem`` (counted as a change)."""
        STRUCTURE_VERSION[0] += 1
        return OrderedDict.popitem(self, last)

    def clear(self) -> None:
        """As ``dict.clear`` (counted as a change)."""
        STRUCTURE_VERSION[0] += 1
        OrderedDict.clear(self)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """As ``dict.setdefault`` (counted as a change)."""
        STRUCTURE_VERSION[0] += 1
        return OrderedDict.setdefault(self, key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """As ``dict.update`` (counted as a change)."""
        STRUCTURE_VERSION[0] += 1
        for key, value in OrderedDict(*args, **kwargs).items():
            OrderedDict.__setitem__(self, key, value)


class Module:
    """Base class of every layer and model. Subclasses set attributes in ``__init__`` and define ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", _Registry())
        object.__setattr__(self, "_buffers", _Registry())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise FlowError(
                f"cannot assign {name!r} before Module.__init__() ran; call super().__init__() first in "
                f"{type(self).__name__}.__init__"
            )
        params, modules, buffers = self._parameters, self._modules, self._buffers
        # PyTorch's rules: a Parameter or Module takes the name over from any other kind; a registered name
        # only accepts its own kind (or None), so a plain tensor can never silently replace a parameter.
        if isinstance(value, Parameter):
            self.__dict__.pop(name, None)
            modules.pop(name, None)
            buffers.pop(name, None)
            self._non_persistent.discard(name)
            params[name] = value
        elif name in params:
            if value is not None:
                raise FlowError(
                    f"cannot assign a {type(value).__name__} as parameter {name!r} of {type(self).__name__}: "
                    f"an nn.Parameter or None is expected (wrap it: nn.Parameter(value), or copy into the "
                    f"parameter under fg.no_grad())"
                )
            params[name] = None
        elif isinstance(value, Module):
            self.__dict__.pop(name, None)
            params.pop(name, None)
            buffers.pop(name, None)
            self._non_persistent.discard(name)
            modules[name] = value
        elif name in modules:
            if value is not None:
                raise FlowError(
                    f"cannot assign a {type(value).__name__} as child module {name!r} of {type(self).__name__}: "
                    "an nn.Module or None is expected"
                )
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise FlowError(
                    f"cannot assign a {type(value).__name__} as buffer {name!r} of {type(self).__name__}: "
                    "a Tensor or None is expected"
                )
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (or ``None``) under ``name``."""
        if "." in name or not name:
            raise FlowError(f"parameter name {name!r} must be non-empty and contain no '.'")
        if param is not None and not isinstance(param, Parameter):
            raise FlowError(
                f"register_parameter({name!r}): got a {type(param).__name__}, an nn.Parameter or None is "
                "expected (wrap a tensor: nn.Parameter(t))"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register a non-learnable tensor (saved in ``state_dict`` unless ``persistent=False``)."""
        if "." in name or not name:
            raise FlowError(f"buffer name {name!r} must be non-empty and contain no '.'")
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Register a child module under ``name``."""
        if "." in name or not name:
            raise FlowError(f"module name {name!r} must be non-empty and contain no '.'")
        if module is not None and not isinstance(module, Module):
            raise FlowError(f"add_module({name!r}): {type(module).__name__} is not a Module")
        self._modules[name] = module

    register_module = add_module

    # ------------------------------------------------------------------ calling
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Define the computation; called by ``module(...)``."""
        raise FlowError(f"{type(self).__name__} has no forward(); define forward(self, ...) in the subclass")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward_pre_hooks:
            for hook in list(self._forward_pre_hooks.values()):
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        try:
            out = self.forward(*args, **kwargs)
        except AttributeError:
            foreign = next((a for a in args if not isinstance(a, Tensor) and hasattr(a, "__dlpack__")), None)
            if foreign is None:
                raise
            cls = type(foreign)
            raise FlowError(
                f"{type(self).__name__}: got a {cls.__module__.split('.')[0]}.{cls.__name__} input, expected a "
                "flowgraph Tensor; convert it with fg.from_dlpack(t) (zero-copy) or fg.tensor(t.numpy())"
            ) from None
        if self._forward_hooks:
            for hook in list(self._forward_hooks.values()):
                result = hook(self, args, out)
                if result is not None:
                    out = result
        return out

    def register_forward_hook(self, hook: Callable) -> Any:
        """``hook(module, args, output)`` after each forward; returns a handle with ``remove()``."""
        return _add_hook(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook: Callable) -> Any:
        """``hook(module, args)`` before each forward; returns a handle with ``remove()``."""
        return _add_hook(self._forward_pre_hooks, hook)

    # ------------------------------------------------------------------ traversal
    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
                      ) -> Iterator[tuple[str, Module]]:
        """``(name, module)`` for this module and every descendant, depth first."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        """This module and every descendant."""
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Direct children with their names."""
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        """Direct children."""
        for _, m in self.named_children():
            yield m

    def _named_members(self, store: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, store).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, Parameter]]:
        """``(dotted name, parameter)`` pairs; shared parameters appear once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter (each shared one once)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                      ) -> Iterator[tuple[str, Tensor]]:
        """``(dotted name, buffer)`` pairs."""
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Every buffer."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> Module:
        """The descendant at dotted path ``target`` (``""`` is this module)."""
        mod: Module = self
        if not target:
            return mod
        walked = []
        for part in target.split("."):
            child = mod._modules.get(part)
            if child is None:
                where = ".".join(walked) or "<root>"
                raise FlowError(
                    f"get_submodule({target!r}): {type(mod).__name__} at {where!r} has no child {part!r}; "
                    f"children: {list(mod._modules)}"
                )
            walked.append(part)
            mod = child
        return mod

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path ``target``."""
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        p = mod._parameters.get(name)
        if p is None:
            raise FlowError(f"get_parameter({target!r}): no parameter {name!r} in {type(mod).__name__}")
        return p

    # ------------------------------------------------------------------ state
    def state_dict(self, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
                   ) -> OrderedDict:
        """Parameters and persistent buffers by dotted name (detached unless ``keep_vars``)."""
        out = OrderedDict() if destination is None else destination
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                out[prefix + name] = b if keep_vars else b.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(out, prefix + name + ".", keep_vars)
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values into parameters and buffers by name.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``; with ``strict=True`` (default) any of
        either, or any shape mismatch, raises ``FlowError`` listing them.
        """
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise FlowError(
                f"load_state_dict into {type(self).__name__}: missing keys {missing}, unexpected keys {unexpected}; "
                "pass strict=False to load the keys that match"
            )
        from ..tensor import tensor as make_tensor

        with no_grad():
            for key, target in own.items():
                if key not in state_dict:
                    continue
                value = state_dict[key]
                if not isinstance(value, Tensor):
                    value = make_tensor(_to_numpy(value))
                if tuple(value.shape) != tuple(target.shape):
                    raise ShapeError(
                        f"load_state_dict: {key!r} has shape {tuple(value.shape)} in the state dict but "
                        f"{tuple(target.shape)} in the model"
                    )
                value = value.to(target.device, target.dtype)
                target._data = target._backend.assign(target._data, value._data)
                target._bump_version()
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ modes and conversion
    def train(self, mode: bool = True) -> Module:
        """Set training mode (dropout active, batch-norm statistics updating) on this module and below."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        """Set evaluation mode (``train(False)``)."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset parameter gradients (to ``None`` by default, as PyTorch does)."""
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad = p.grad.detach() * 0

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every descendant, then on this module (PyTorch's order)."""
        if not callable(fn):
            raise FlowError(f"Module.apply: fn must be callable (called with each module), got "
                            f"{type(fn).__name__} {fn!r:.40}")
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def _apply_tensors(self, fn: Callable[[Tensor], Tensor], floating_only: bool = False) -> Module:
        """Replace every parameter's and buffer's storage by ``fn(t)``, keeping the Python objects."""
        for m in self.modules():
            for store in (m._parameters, m._buffers):
                for t in store.values():
                    if t is None or (floating_only and not t.dtype.is_floating_point):
                        continue
                    new = fn(t.detach())
                    t._data, t._backend = new._data, new._backend
                    t._bump_version()
                    if t.grad is not None:
                        g = fn(t.grad)
                        t.grad = _wrap(g._data, g._backend)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move parameters and buffers to a device and/or cast floating ones: ``model.to("cuda")``."""
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        from ..tensor.dtype import DType

        for arg in args:
            if isinstance(arg, DType):
                dtype = arg
            elif isinstance(arg, Tensor):
                device, dtype = arg.device, arg.dtype
            else:
                device = arg
        if device is not None:
            self._apply_tensors(lambda t: t.to(device))
        if dtype is not None:
            self._apply_tensors(lambda t: t.to(dtype), floating_only=True)
        return self

    def cpu(self) -> Module:
        """Move to the CPU."""
        return self.to("cpu")

    def cuda(self, index: int | None = None) -> Module:
        """Move to ``cuda:index``; without an index to the current CUDA device (``fg.cuda.set_device``)."""
        return self.to("cuda" if index is None else f"cuda:{index}")

    def float(self) -> Module:
        """Cast floating parameters and buffers to float32."""
        from ..tensor import float32

        return self.to(float32)

    def double(self) -> Module:
        """Cast floating parameters and buffers to float64."""
        from ..tensor import float64

        return self.to(float64)

    def half(self) -> Module:
        """Cast floating parameters and buffers to float16."""
        from ..tensor import float16

        return self.to(float16)

    def bfloat16(self) -> Module:
        """Cast floating parameters and buffers to bfloat16."""
        from ..tensor import bfloat16

        return self.to(bfloat16)

    # ------------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {child_repr}")
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def __dir__(self):
        return list(super().__dir__()) + list(self._parameters) + list(self._modules) + list(self._buffers)



def _to_numpy(value: Any):
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


class _HookHandle:
    """Removes a registered hook."""

    _next = 0

    def __init__(self, store: dict):
        self.store = store
        self.id = _HookHandle._next
        _HookHandle._next += 1

    def remove(self) -> None:
        """Unregister the hook."""
        self.store.pop(self.id, None)


def _add_hook(store: dict, hook: Callable) -> _HookHandle:
    if not callable(hook):
        raise FlowError(f"register hook: hook must be callable, got {type(hook).__name__} {hook!r:.40}")
    handle = _HookHandle(store)
    store[handle.id] = hook
    return handle
