"""``shard``: the sample indices of one rank, with ``torch.utils.data.DistributedSampler``'s rules."""

from __future__ import annotations

import math

import numpy as np

from ..errors import FlowError


def shard(n_samples: int, rank: int, world_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
          drop_last: bool = False) -> list[int]:
    """The indices rank ``rank`` of ``world_size`` reads in epoch ``epoch``.

    As ``DistributedSampler``: without ``drop_last`` the index list is padded by repeating its start until it
    divides evenly (every rank gets ``ceil(n / world_size)`` samples); with ``drop_last`` the tail is dropped
    (``floor(n / world_size)`` each). Rank ``r`` takes every ``world_size``-th index starting at ``r``. With
    ``shuffle`` the indices are first permuted by a generator seeded with ``seed + epoch`` (identical on all ranks,
    so the shards stay disjoint); that permutation is NumPy's (``default_rng``), not torch's ``randperm``, so
    shuffled lists differ from torch's while following the same rules. Unshuffled lists are identical to torch's.
    """
    for name, v in (("n_samples", n_samples), ("world_size", world_size)):
        if not isinstance(v, int) or v < (0 if name == "n_samples" else 1):
            raise FlowError(f"shard(): {name} must be a {'non-negative' if name == 'n_samples' else 'positive'} "
                            f"int, got {v!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise FlowError(f"shard(): rank must be in [0, {world_size}), got {rank!r}")
    if drop_last and n_samples % world_size:
        num = math.ceil((n_samples - world_size) / world_size)
    else:
        num = math.ceil(n_samples / world_size)
    total = num * world_size
    if shuffle:
        indices = np.random.default_rng(seed + epoch).permutation(n_samples).tolist()
    else:
        indices = list(range(n_samples))
    if not drop_last:
        pad = total - len(indices)
        if pad > 0:
            if not indices:
                raise FlowError("shard(): cannot pad an empty data set (n_samples=0) without drop_last")
            indices += (indices * math.ceil(pad / len(indices)))[:pad]
    else:
        indices = indices[:total]
    return indices[rank:total:world_size]
