"""Backends: the primitive protocol (``base.Backend``), the NumPy/CuPy array backend, OpenCL, the registry."""

from .base import Backend
from .registry import available_devices, get_backend, parse_device, register_backend, seed_all

__all__ = ["Backend", "available_devices", "get_backend", "parse_device", "register_backend", "seed_all"]
