"""``DistributedSampler``: each rank reads its own part of a map-style data set.

The index arithmetic (padding, dropping, striding, the shuffled permutation) is
:func:`flowgraph.distributed.shard`'s; this class gives it ``torch.utils.data.DistributedSampler``'s interface.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

from ...errors import FlowError
from .sampler import Sampler

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler[int]):
    """The indices of rank ``rank`` of ``num_replicas``, as PyTorch's ``DistributedSampler``.

    ``num_replicas`` and ``rank`` default to ``flowgraph.distributed.get_world_size()`` / ``get_rank()`` once
    ``flowgraph.distributed.init()`` has run. Without ``drop_last`` the index list is padded by repeating its
    start so every rank gets ``ceil(n / num_replicas)`` samples; with it the tail is dropped. With ``shuffle``
    the order is a permutation seeded by ``seed + epoch``, the same on every rank (call :meth:`set_epoch` at the
    start of each epoch for a new order). Unshuffled index lists are identical to PyTorch's; shuffled ones follow
    the same rules with NumPy's permutation instead of torch's.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            from ... import distributed

            if not distributed.is_initialized():
                raise FlowError("DistributedSampler(): num_replicas and rank default to the process group's, but "
                                "flowgraph.distributed is not initialised; call flowgraph.distributed.init() "
                                "first or pass num_replicas= and rank=")
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise FlowError(f"DistributedSampler(): num_replicas must be a positive int, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise FlowError(f"DistributedSampler(): invalid rank {rank!r}, rank should be in the interval "
                            f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        from ...distributed.sampler import shard

        return iter(shard(len(self.dataset), self.rank, self.num_replicas, shuffle=self.shuffle, seed=self.seed,
                          epoch=self.epoch, drop_last=self.drop_last))

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next shuffle (``seed + epoch``): call it before each epoch's loop."""
        self.epoch = epoch
