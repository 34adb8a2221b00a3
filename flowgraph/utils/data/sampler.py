"""Samplers with ``torch.utils.data``'s names: the order in which a ``DataLoader`` reads a map-style data set.

Randomness: flowgraph has no ``Generator`` object, so ``generator=`` takes a ``numpy.random.Generator`` (its
state advances, as a ``torch.Generator``'s does: each epoch gets a new order, reproducibly) or an int seed (a
``numpy.random.default_rng(seed)`` made once). Without one, every ``iter()`` draws a fresh seed from flowgraph's
global generator, so ``fg.manual_seed(s)`` makes the orders reproducible, as ``torch.manual_seed`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Generic, TypeVar

import numpy as np

from ...errors import FlowError, ShapeError
from ...tensor import Tensor

T_co = TypeVar("T_co", covariant=True)

#: What ``generator=`` accepts: a NumPy generator, an int seed, or None (flowgraph's global generator).
GeneratorLike = np.random.Generator | int | None

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "SubsetRandomSampler",
           "WeightedRandomSampler"]


def resolve_generator(generator: GeneratorLike, where: str) -> np.random.Generator | None:
    """The NumPy generator behind a ``generator=`` argument (None stays None: draw from the global one)."""
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        return np.random.default_rng(int(generator))
    raise FlowError(f"{where}: generator must be a numpy.random.Generator, an int seed or None, got "
                    f"{type(generator).__name__} (flowgraph has no torch.Generator; pass a seed instead)")


def draw_seed(rng: np.random.Generator | None) -> int:
    """A 63-bit seed from ``rng``, or from flowgraph's global CPU generator (seeded by ``fg.manual_seed``)."""
    if rng is not None:
        return int(rng.integers(0, 2 ** 63 - 1))
    from ...tensor import randint

    return int(randint(0, 2 ** 62, size=()).item())


def permutation(n: int, rng: np.random.Generator | None) -> np.ndarray:
    """A random permutation of ``0..n-1`` from ``rng`` (or a generator seeded from the global one)."""
    return (rng if rng is not None else np.random.default_rng(draw_seed(None))).permutation(n)


def _positive_int(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise FlowError(f"{where}: {name} should be a positive integer value, but got {name}={value!r}")
    return int(value)


def _boolean(value, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise FlowError(f"{where}: {name} should be a boolean value, but got {name}={value!r}")
    return value


class Sampler(Generic[T_co]):
    """Base class of samplers: ``__iter__`` yields indices (or lists of indices for a batch sampler); define
    ``__len__`` too when the count is known (``len(DataLoader)`` uses it)."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} is a Sampler subclass without __iter__")


class SequentialSampler(Sampler[int]):
    """``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """Random order: a permutation of the data set (repeated as needed for ``num_samples``), or with
    ``replacement=True`` ``num_samples`` independent uniform draws. ``generator``: see the module docstring."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: GeneratorLike = None) -> None:
        self.data_source = data_source
        self.replacement = _boolean(replacement, "replacement", "RandomSampler()")
        self._num_samples = None if num_samples is None else _positive_int(num_samples, "num_samples",
                                                                           "RandomSampler()")
        self.generator = generator
        self._rng = resolve_generator(generator, "RandomSampler()")

    @property
    def num_samples(self) -> int:
        """How many indices one pass yields (the data set's length unless given)."""
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        rng = self._rng if self._rng is not None else np.random.default_rng(draw_seed(None))
        if self.replacement:
            yield from rng.integers(0, n, size=self.num_samples).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from rng.permutation(n).tolist()
        yield from rng.permutation(n)[: self.num_samples % n].tolist()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """The given ``indices`` in a random order (a new one each pass)."""

    def __init__(self, indices: Sequence[int], generator: GeneratorLike = None) -> None:
        self.indices = indices
        self.generator = generator
        self._rng = resolve_generator(generator, "SubsetRandomSampler()")

    def __iter__(self) -> Iterator[int]:
        for i in permutation(len(self.indices), self._rng).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """``num_samples`` indices drawn with probabilities proportional to ``weights`` (one weight per sample; they
    need not sum to 1), with or without replacement."""

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: GeneratorLike = None) -> None:
        where = "WeightedRandomSampler()"
        self.num_samples = _positive_int(num_samples, "num_samples", where)
        self.replacement = _boolean(replacement, "replacement", where)
        host = weights.detach().numpy() if isinstance(weights, Tensor) else weights
        w = np.asarray(host, dtype=np.float64)
        if w.ndim != 1:
            raise ShapeError(f"{where}: weights should be a 1d sequence but given weights have shape {w.shape}")
        if w.size == 0 or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
            raise FlowError(f"{where}: weights must be finite, non-negative and not all zero; got {w.tolist()[:8]}"
                            f"{' ...' if w.size > 8 else ''}")
        if not replacement and self.num_samples > int((w > 0).sum()):
            raise FlowError(f"{where}: cannot draw num_samples={self.num_samples} without replacement from "
                            f"{int((w > 0).sum())} samples of non-zero weight; lower num_samples or pass "
                            "replacement=True")
        self.weights = w
        self.generator = generator
        self._rng = resolve_generator(generator, where)

    def __iter__(self) -> Iterator[int]:
        rng = self._rng if self._rng is not None else np.random.default_rng(draw_seed(None))
        p = self.weights / self.weights.sum()
        yield from rng.choice(len(p), size=self.num_samples, replace=self.replacement, p=p).tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Groups another sampler's indices into lists of ``batch_size``; the last, shorter list is dropped with
    ``drop_last``. ``list(BatchSampler(SequentialSampler(range(5)), 2, False)) == [[0, 1], [2, 3], [4]]``."""

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.batch_size = _positive_int(batch_size, "batch_size", "BatchSampler()")
        self.drop_last = _boolean(drop_last, "drop_last", "BatchSampler()")
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size
