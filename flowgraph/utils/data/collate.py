"""``default_collate`` and ``default_convert`` (``torch.utils.data``'s rules), and the conversions between
batches of flowgraph tensors and the NumPy form that worker processes send back.

The dtype rules are PyTorch's: Python floats become ``float64``, ints ``int64`` and bools ``bool``; NumPy arrays
and NumPy scalars keep their dtype; tensors are stacked with ``fg.stack``; strings stay lists of strings; dicts,
namedtuples, tuples and lists are collated field by field (a tuple of samples becomes a list, as in PyTorch).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from ...errors import FlowError, ShapeError
from ...tensor import Tensor, from_numpy, stack

__all__ = ["default_collate", "default_convert"]

_COLLATE_ERROR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _numpy_to_tensor(arr: np.ndarray) -> Tensor:
    return from_numpy(np.ascontiguousarray(arr))


def _rebuild_mapping(elem: Mapping, values: dict) -> Mapping:
    """A mapping of ``elem``'s type holding ``values`` (a plain dict where the type cannot be rebuilt)."""
    if isinstance(elem, MutableMapping):
        clone = copy.copy(elem)
        clone.update(values)
        return clone
    try:
        return type(elem)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def _rebuild_sequence(elem: Sequence, values: list) -> Any:
    if _is_namedtuple(elem):
        return type(elem)(*values)
    if isinstance(elem, tuple):
        return values  # PyTorch: a tuple collates to a list
    try:
        return type(elem)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def default_convert(data: Any) -> Any:
    """Turn NumPy arrays and NumPy scalars (anywhere in dicts, lists, namedtuples) into flowgraph tensors,
    leaving everything else as it is: the ``collate_fn`` of a ``DataLoader`` with ``batch_size=None``."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, np.ndarray):
        return data if data.dtype.kind in "SaUO" else _numpy_to_tensor(data)
    if isinstance(data, np.generic):
        return data if data.dtype.kind in "SaUO" else from_numpy(np.array(data))
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: default_convert(v) for k, v in data.items()})
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def default_collate(batch: Sequence[Any]) -> Any:
    """Stack a list of samples into a batch, as ``torch.utils.data.default_collate``.

        default_collate([(np.ones(3), 1), (np.zeros(3), 0)])   # [tensor of shape (2, 3) float64, tensor([1, 0])]
        default_collate([{"x": 1.5}, {"x": 2.5}])               # {"x": tensor([1.5, 2.5], dtype=float64)}
    """
    if not isinstance(batch, Sequence) or len(batch) == 0:
        raise FlowError(f"default_collate: batch must be a non-empty list of samples, got {batch!r:.80}")
    elem = batch[0]
    if isinstance(elem, Tensor):
        shapes = {tuple(t.shape) for t in batch}
        if len(shapes) != 1:
            raise ShapeError(f"default_collate: stack expects each tensor to be equal size, got shapes "
                             f"{sorted(shapes)}")
        return stack(list(batch), 0)
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, (np.ndarray, np.generic)):
        if elem.dtype.kind in "SaUO":
            raise FlowError(_COLLATE_ERROR.format(elem.dtype))
        if isinstance(elem, np.ndarray):
            shapes = {a.shape for a in batch}
            if len(shapes) != 1:
                raise ShapeError(f"default_collate: stack expects each array to be equal size, got shapes "
                                 f"{sorted(shapes)}")
            return from_numpy(np.stack(batch))
        return from_numpy(np.array(batch, dtype=elem.dtype))
    if isinstance(elem, bool):
        return from_numpy(np.array(batch, dtype=np.bool_))
    if isinstance(elem, int):
        try:
            return from_numpy(np.array(batch, dtype=np.int64))
        except OverflowError:
            raise FlowError("default_collate: an integer in the batch does not fit in 64 bits") from None
    if isinstance(elem, float):
        return from_numpy(np.array(batch, dtype=np.float64))
    if isinstance(elem, Mapping):
        return _rebuild_mapping(elem, {key: default_collate([d[key] for d in batch]) for key in elem})
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(samples) for samples in zip(*batch)))
    if isinstance(elem, Sequence):
        if len({len(e) for e in batch}) != 1:
            raise ShapeError("default_collate: each element in list of batch should be of equal size, got lengths "
                             f"{[len(e) for e in batch]}")
        return _rebuild_sequence(elem, [default_collate(list(samples)) for samples in zip(*batch)])
    raise FlowError(_COLLATE_ERROR.format(type(elem)))


# ---------------------------------------------------------------------- worker transfer and device moves
class HostTensor:
    """A flowgraph tensor on its way from a worker process: its values as a NumPy array. The main process turns
    it back into a tensor (on the loader's device), so workers never pickle tensors."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self):
        return (HostTensor, (self.array,))


def _map_structure(obj: Any, leaf) -> Any:
    """``obj`` with ``leaf`` applied to every element of dicts, lists, tuples and namedtuples (types kept)."""
    if isinstance(obj, (Tensor, HostTensor)):
        return leaf(obj)
    if isinstance(obj, Mapping):
        return _rebuild_mapping(obj, {k: _map_structure(v, leaf) for k, v in obj.items()})
    if _is_namedtuple(obj):
        return type(obj)(*(_map_structure(v, leaf) for v in obj))
    if isinstance(obj, (list, tuple)):
        values = [_map_structure(v, leaf) for v in obj]
        return values if type(obj) is list else (tuple(values) if type(obj) is tuple else _try_type(obj, values))
    return obj


def _try_type(obj: Any, values: list) -> Any:
    try:
        return type(obj)(values)
    except TypeError:
        return values


def to_host(batch: Any) -> Any:
    """Every flowgraph tensor in ``batch`` replaced by a :class:`HostTensor` (run in a worker)."""
    return _map_structure(batch, lambda t: HostTensor(t.detach().numpy()) if isinstance(t, Tensor) else t)


def from_host(batch: Any, device: str | None) -> Any:
    """Every :class:`HostTensor` in ``batch`` as a flowgraph tensor on ``device`` (CPU when None)."""

    def leaf(x):
        if isinstance(x, HostTensor):
            t = _numpy_to_tensor(x.array)
            return t if device is None or device == "cpu" else t.to(device)
        return x if device is None or x.device == device else x.to(device)

    return _map_structure(batch, leaf)


def to_device(batch: Any, device: str) -> Any:
    """Every flowgraph tensor in ``batch`` moved to ``device`` (those already there are kept)."""
    return _map_structure(batch, lambda t: t if t.device == device else t.to(device))
