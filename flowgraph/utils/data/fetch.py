"""Reading one batch from a data set: what the main process does with ``num_workers=0`` and each worker does
otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import IndexOutOfRangeError
from ...tensor import Tensor, from_numpy, tensor
from .collate import default_collate
from .dataset import Subset, TensorDataset


def _take_rows(t: Tensor, index: list[int]) -> Tensor:
    """``stack([t[i] for i in index])`` as one gather."""
    if t.device == "cpu" and not t.requires_grad:
        host = t.numpy()
        idx = np.asarray(index, dtype=np.int64)
        n = host.shape[0]
        if idx.max() >= n or idx.min() < -n:
            bad = int(idx.max()) if idx.max() >= n else int(idx.min())
            raise IndexOutOfRangeError(f"TensorDataset: index {bad} is out of range for {n} samples")
        return from_numpy(host[idx])
    return t[tensor(index, device=t.device)]


def _tensor_rows(dataset: Any, index: list[int]) -> list[Tensor] | None:
    """The default-collated batch of a ``TensorDataset`` (possibly inside ``Subset``s) read directly, or None for
    any other data set: a list, as ``default_collate`` makes of tuples. Subclasses that change how samples are
    read are left to the general path."""
    while type(dataset).__getitem__ is Subset.__getitem__ and type(dataset).__getitems__ is Subset.__getitems__:
        index = [dataset.indices[i] for i in index]
        dataset = dataset.dataset
    if type(dataset).__getitem__ is TensorDataset.__getitem__ and getattr(type(dataset), "__getitems__", None) is None:
        return [_take_rows(t, index) for t in dataset.tensors]
    return None


def tensor_dataset_devices(dataset: Any) -> set[str]:
    """The devices of a ``TensorDataset``'s tensors (looking through ``Subset``s); empty for other data sets."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    if isinstance(dataset, TensorDataset):
        return {t.device for t in dataset.tensors}
    return set()


class MapFetcher:
    """Batches of a map-style data set: ``fetch(indices)`` (a list with auto-collation, one index without)."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, index: Any) -> Any:
        """One batch (or one converted sample without auto-collation)."""
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        if self.collate_fn is default_collate:
            rows = _tensor_rows(self.dataset, index)
            if rows is not None:
                return rows
        getitems = getattr(self.dataset, "__getitems__", None)
        data = getitems(index) if callable(getitems) else [self.dataset[i] for i in index]
        return self.collate_fn(data)


class IterableFetcher:
    """Batches of an iterable data set: ``fetch()`` raises ``StopIteration`` when the stream ends."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable, batch_size: int | None,
                 drop_last: bool) -> None:
        self.auto_collation, self.collate_fn = auto_collation, collate_fn
        self.batch_size, self.drop_last = batch_size, drop_last
        self.iterator = iter(dataset)

    def fetch(self) -> Any:
        """The next batch (or the next converted sample without auto-collation)."""
        if not self.auto_collation:
            return self.collate_fn(next(self.iterator))
        data = []
        for item in self.iterator:
            data.append(item)
            if len(data) == self.batch_size:
                break
        if not data or (self.drop_last and len(data) < self.batch_size):
            raise StopIteration
        return self.collate_fn(data)
