"""Neural-network modules with PyTorch's names and semantics: ``nn.Module``, layers, activations, losses,
``nn.init`` and ``nn.functional``.

Each file holds one family; its ``__all__`` lists the module classes exported here and its
``__functional__`` the functions exported by ``nn.functional``.
"""

# ruff: noqa: F401 - this module re-exports the families' classes

from . import functional, init, utils  # noqa: E402,I001 - after the layers it re-exports
from .activation import *  # noqa: F403
from .attention import *  # noqa: F403
from .containers import Identity, ModuleDict, ModuleList, ParameterList, Sequential
from .conv import *  # noqa: F403
from .dropout import *  # noqa: F403
from .linear import Bilinear, Linear
from .loss import *  # noqa: F403
from .module import IncompatibleKeys, Module, Parameter
from .normalization import *  # noqa: F403
from .pooling import *  # noqa: F403
from .reshape import *  # noqa: F403
from .rnn import *  # noqa: F403
from .routing import *  # noqa: F403
from .sparse import *  # noqa: F403
