"""shard() against torch.utils.data.DistributedSampler."""

import pytest

from flowgraph.distributed import shard
from flowgraph.errors import FlowError

CONFIGS = [(10, 3, False), (10, 3, True), (12, 4, False), (12, 4, True), (7, 2, False), (2, 5, False),
           (1, 3, False), (11, 4, True)]


@pytest.mark.parametrize("n,world,drop_last", CONFIGS)
def test_unshuffled_matches_torch(n, world, drop_last):
    torch_data = pytest.importorskip("torch.utils.data")
    for rank in range(world):
        ref = list(torch_data.DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                                 drop_last=drop_last))
        assert shard(n, rank, world, shuffle=False, drop_last=drop_last) == ref


@pytest.mark.parametrize("n,world,drop_last", CONFIGS)
def test_shuffled_follows_the_same_rules(n, world, drop_last):
    torch_data = pytest.importorskip("torch.utils.data")
    shards = [shard(n, r, world, shuffle=True, seed=5, epoch=2, drop_last=drop_last) for r in range(world)]
    refs = [list(torch_data.DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=5,
                                               drop_last=drop_last)) for r in range(world)]
    assert [len(s) for s in shards] == [len(r) for r in refs]
    merged = sorted(i for s in shards for i in s)
    assert set(merged) == (set(range(n)) if not drop_last else set(merged))
    if drop_last:
        assert len(set(merged)) == len(merged)  # disjoint
    assert shards == [shard(n, r, world, shuffle=True, seed=5, epoch=2, drop_last=drop_last) for r in range(world)]


def test_epoch_changes_the_permutation():
    assert shard(100, 0, 2, epoch=0) != shard(100, 0, 2, epoch=1)
    assert sorted(shard(100, 0, 2, epoch=1) + shard(100, 1, 2, epoch=1)) == list(range(100))


def test_bad_arguments():
    with pytest.raises(FlowError, match="rank must be in"):
        shard(10, 2, 2)
    with pytest.raises(FlowError, match="world_size must be a positive int"):
        shard(10, 0, 0)
