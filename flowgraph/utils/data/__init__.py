"""Data loading with ``torch.utils.data``'s names and semantics; batches are flowgraph tensors.

    from flowgraph.utils.data import DataLoader, TensorDataset, random_split

    train, val = random_split(TensorDataset(x, y), [0.8, 0.2], generator=0)
    for xb, yb in DataLoader(train, batch_size=64, shuffle=True, num_workers=2, generator=0):
        ...

See ``docs/data.md`` for workers, seeding, device prefetch and the differences from PyTorch.
"""

from __future__ import annotations

from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .distributed import DistributedSampler
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from .worker import WorkerInfo, get_worker_info

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset", "DistributedSampler",
    "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler", "StackDataset", "Subset",
    "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler", "WorkerInfo", "default_collate",
    "default_convert", "get_worker_info", "random_split",
]
