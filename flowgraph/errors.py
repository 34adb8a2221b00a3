"""flowgraph's exception types.

Every misuse raises one of these. A message says what was wrong, where, and what would be right.
They derive from the built-in exception a Python user would expect (``ShapeError`` is a ``ValueError``,
``PathError`` a ``KeyError``), so generic handlers keep working.
"""

from __future__ import annotations


class FlowError(Exception):
    """Base class of every flowgraph error; also raised for graph-builder misuse."""


class ShapeError(FlowError, ValueError):
    """Shapes that do not fit an operation (broadcasting, matmul, reshape, ...)."""


class BackendError(FlowError, RuntimeError):
    """A device or backend problem: unknown device, backend not installed, mixed devices, unsupported dtype."""


class PathError(FlowError, KeyError):
    """A dotted graph-tree path that does not resolve; the message suggests the nearest valid one."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class CheckpointError(FlowError, OSError):
    """A checkpoint that cannot be written or read: corrupt file, key, shape or structure mismatch."""


class GradcheckError(FlowError, AssertionError):
    """Analytic and numerical gradients disagree; the message names the op and the element."""


class AnomalyError(FlowError, RuntimeError):
    """A NaN or infinity appeared while anomaly detection was on; names the op that produced it."""


class IndexOutOfRangeError(FlowError, IndexError):
    """An index outside a dimension (``t[5]`` on 3 rows, a gather index past the end): an ``IndexError``, so
    ``for row in t`` and ``a, b = t`` stop where they should, as with PyTorch."""
