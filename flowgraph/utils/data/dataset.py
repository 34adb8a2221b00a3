"""Datasets with ``torch.utils.data``'s names: ``Dataset``, ``IterableDataset``, ``TensorDataset``, ``Subset``,
``ConcatDataset``, ``ChainDataset``, ``StackDataset`` and ``random_split``."""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

from ...errors import FlowError, IndexOutOfRangeError, ShapeError
from ...tensor import Tensor
from .sampler import GeneratorLike, permutation, resolve_generator

T_co = TypeVar("T_co", covariant=True)

__all__ = ["ChainDataset", "ConcatDataset", "Dataset", "IterableDataset", "StackDataset", "Subset", "TensorDataset",
           "random_split"]


class Dataset(Generic[T_co]):
    """A map-style data set: ``ds[i]`` returns sample ``i`` and ``len(ds)`` the number of samples.

    Subclass it and define ``__getitem__`` (and ``__len__``, which the default samplers need). A subclass may
    also define ``__getitems__(indices) -> list`` to fetch a whole batch at once; ``DataLoader`` then calls it
    instead of ``__getitem__`` per sample, as PyTorch does. ``ds1 + ds2`` is a :class:`ConcatDataset`.
    """

    def __getitem__(self, index) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} is a Dataset subclass without __getitem__; define "
                                  "__getitem__(self, index) to return one sample")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co]):
    """A data set read as a stream: define ``__iter__``. Use it for data that cannot be indexed (files read in
    order, generated samples).

    With ``num_workers > 0`` every worker process iterates its own copy, so each sample would come once per
    worker: shard the stream with :func:`~flowgraph.utils.data.get_worker_info` inside ``__iter__``::

        def __iter__(self):
            info = get_worker_info()
            start, step = (0, 1) if info is None else (info.id, info.num_workers)
            return iter(range(self.start + start, self.end, step))
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} is an IterableDataset subclass without __iter__; define "
                                  "__iter__(self) to yield the samples")

    def __add__(self, other: Dataset) -> ChainDataset:
        return ChainDataset([self, other])


class TensorDataset(Dataset[tuple[Tensor, ...]]):
    """Samples are rows of tensors of the same length: ``ds[i] == (t0[i], t1[i], ...)``.

    ``DataLoader`` with the default collation takes whole batches of rows at once (one gather per tensor instead
    of one index per sample and a stack); the result is the same.
    """

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise FlowError("TensorDataset(): pass at least one tensor, e.g. TensorDataset(inputs, targets)")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise FlowError(f"TensorDataset(): argument {i} is a {type(t).__name__}, not a flowgraph Tensor; "
                                "convert it with fg.tensor(...) or fg.from_numpy(...)")
            if t.ndim == 0:
                raise ShapeError(f"TensorDataset(): argument {i} is a 0-d tensor; samples are rows, so every "
                                 "tensor needs at least one dimension")
        sizes = [t.shape[0] for t in tensors]
        if len(set(sizes)) != 1:
            raise ShapeError(f"TensorDataset(): size mismatch between tensors: first dimensions are {sizes}; "
                             "every tensor needs the same number of rows")
        self.tensors = tuple(tensors)

    def __getitem__(self, index) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class StackDataset(Dataset):
    """Samples combined from several data sets of the same length: ``StackDataset(a, b)[i] == (a[i], b[i])`` and
    ``StackDataset(x=a, y=b)[i] == {"x": a[i], "y": b[i]}``."""

    def __init__(self, *args: Dataset, **kwargs: Dataset) -> None:
        if args and kwargs:
            raise FlowError("StackDataset(): pass the data sets either positionally (samples are tuples) or as "
                            "keywords (samples are dicts), not both")
        self.datasets: tuple | dict = args if args else kwargs
        parts = list(args) if args else list(kwargs.values())
        if not parts:
            raise FlowError("StackDataset(): pass at least one data set")
        lengths = [len(d) for d in parts]
        if len(set(lengths)) != 1:
            raise ShapeError(f"StackDataset(): size mismatch between data sets: lengths {lengths}")
        self._length = lengths[0]

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset[T_co]):
    """Map-style data sets one after the other: index ``len(a)`` of ``ConcatDataset([a, b])`` is ``b[0]``."""

    @staticmethod
    def cumsum(sequence: Sequence[Dataset]) -> list[int]:
        """Running totals of the lengths (``cumulative_sizes``)."""
        out, total = [], 0
        for d in sequence:
            total += len(d)
            out.append(total)
        return out

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise FlowError("ConcatDataset(): datasets should not be an empty iterable")
        for i, d in enumerate(self.datasets):
            if isinstance(d, IterableDataset):
                raise FlowError(f"ConcatDataset(): datasets[{i}] is an IterableDataset, which has no indices; "
                                "chain iterable data sets with ChainDataset instead")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> T_co:
        n = len(self)
        if not isinstance(idx, (int, np.integer)):
            raise FlowError(f"ConcatDataset: index must be an int, got {type(idx).__name__}")
        if idx < 0:
            if -idx > n:
                raise IndexOutOfRangeError(f"ConcatDataset: index {idx} is out of range for {n} samples")
            idx += n
        if idx >= n:
            raise IndexOutOfRangeError(f"ConcatDataset: index {idx} is out of range for {n} samples")
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        local = idx if which == 0 else idx - self.cumulative_sizes[which - 1]
        return self.datasets[which][local]


class ChainDataset(IterableDataset):
    """Iterable data sets one after the other (``ConcatDataset`` for streams)."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)

    def __iter__(self):
        for i, d in enumerate(self.datasets):
            if not isinstance(d, IterableDataset):
                raise FlowError(f"ChainDataset: datasets[{i}] is a {type(d).__name__}; ChainDataset only chains "
                                "IterableDataset objects (use ConcatDataset for map-style data sets)")
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``, in that order: ``Subset(ds, [4, 2])[0] is ds[4]``."""

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list:
        """A batch of samples (``DataLoader`` calls it): the inner data set's ``__getitems__`` when it has one."""
        mapped = [self.indices[i] for i in indices]
        inner = getattr(self.dataset, "__getitems__", None)
        if callable(inner):
            return inner(mapped)
        return [self.dataset[i] for i in mapped]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(dataset: Dataset[T_co], lengths: Sequence[int | float],
                 generator: GeneratorLike = None) -> list[Subset[T_co]]:
    """Split ``dataset`` into non-overlapping random subsets of the given lengths, as ``torch.utils.data``.

    ``lengths`` are sample counts summing to ``len(dataset)``, or fractions summing to 1: each subset gets
    ``floor(frac * n)`` samples and the remainder is handed out one by one round-robin from the first subset.
    ``generator`` (a ``numpy.random.Generator`` or an int seed) makes the split reproducible; without one the
    permutation's seed comes from flowgraph's global generator, so ``fg.manual_seed`` fixes it too.

        train, val = random_split(ds, [0.8, 0.2], generator=42)
    """
    n = len(dataset)  # type: ignore[arg-type]
    lengths = list(lengths)
    if not lengths:
        raise FlowError("random_split(): lengths is empty; pass sample counts or fractions, e.g. [0.8, 0.2]")
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:  # fractions (PyTorch's test, ints included)
        counts = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise FlowError(f"random_split(): fraction at index {i} is {frac}; fractions lie in [0, 1]")
            counts.append(int(math.floor(n * frac)))
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        for i, c in enumerate(counts):
            if c == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.",
                              stacklevel=2)
        lengths = counts
    for i, c in enumerate(lengths):
        if not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 0:
            raise FlowError(f"random_split(): lengths[{i}] is {c!r}; pass non-negative ints summing to the data "
                            f"set's length ({n}) or fractions summing to 1")
    if sum(lengths) != n:
        raise FlowError(f"random_split(): sum of input lengths ({sum(lengths)}) does not equal the length of the "
                        f"input dataset ({n})")
    perm = permutation(n, resolve_generator(generator, "random_split()")).tolist()
    out, offset = [], 0
    for c in lengths:
        out.append(Subset(dataset, perm[offset:offset + c]))
        offset += c
    return out

