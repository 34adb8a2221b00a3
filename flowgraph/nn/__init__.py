"""Neural-network modules with PyTorch's names and semantics: ``nn.Module``, layers, activations, losses,
``nn.init`` and ``nn.functional``."""

from . import functional, init
from .containers import Identity, ModuleDict, ModuleList, ParameterList, Sequential
from .linear import Linear
from .module import IncompatibleKeys, Module, Parameter

__all__ = [
    "Identity", "IncompatibleKeys", "Linear", "Module", "ModuleDict", "ModuleList", "Parameter", "ParameterList",
    "Sequential", "functional", "init",
]
