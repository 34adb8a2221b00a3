"""flowgraph.utils.data: datasets, samplers, collation and DataLoader (main process and workers), against
torch.utils.data wherever the result is deterministic."""

from __future__ import annotations

import collections
import gc
import os
import random
import time

import numpy as np
import pytest

import flowgraph as fg
from flowgraph.errors import FlowError, IndexOutOfRangeError, ShapeError
from flowgraph.utils.data import (
    BatchSampler,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    get_worker_info,
    random_split,
)

Point = collections.namedtuple("Point", "x y")


def _torch_data():
    return pytest.importorskip("torch.utils.data")


def _plain(obj):
    """A comparable form of a batch from either framework: tensors as (dtype name, shape, values)."""
    if isinstance(obj, fg.Tensor):
        return ("tensor", obj.dtype.name, tuple(obj.shape), obj.tolist())
    if type(obj).__module__ == "torch" and type(obj).__name__ == "Tensor":
        return ("tensor", str(obj.dtype).removeprefix("torch."), tuple(obj.shape), obj.tolist())
    if isinstance(obj, dict):
        return ("dict", {k: _plain(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (type(obj).__name__, [_plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_plain(v) for v in obj])
    return obj


def _ds(n=10):
    return TensorDataset(fg.arange(float(2 * n)).reshape(n, 2), fg.arange(n))


# ---------------------------------------------------------------------- samplers
@pytest.mark.parametrize("n,batch,drop_last", [(10, 3, False), (10, 3, True), (9, 3, True), (1, 4, False),
                                               (0, 2, False)])
def test_sequential_and_batch_samplers_match_torch(n, batch, drop_last):
    td = _torch_data()
    ours = BatchSampler(SequentialSampler(range(n)), batch, drop_last)
    ref = td.BatchSampler(td.SequentialSampler(range(n)), batch, drop_last)
    assert list(ours) == list(ref) and len(ours) == len(ref)


def test_sampler_argument_errors():
    with pytest.raises(FlowError, match="batch_size should be a positive integer value, but got batch_size=0"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(FlowError, match="drop_last should be a boolean value"):
        BatchSampler(range(3), 2, 1)
    with pytest.raises(FlowError, match="replacement should be a boolean value"):
        RandomSampler(range(3), replacement=1)
    with pytest.raises(FlowError, match="num_samples should be a positive integer value"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(FlowError, match="generator must be a numpy.random.Generator, an int seed or None"):
        RandomSampler(range(3), generator="seed")
    with pytest.raises(ShapeError, match="1d sequence"):
        WeightedRandomSampler([[1.0]], 2)
    with pytest.raises(FlowError, match="non-negative and not all zero"):
        WeightedRandomSampler([1.0, -1.0], 2)
    with pytest.raises(FlowError, match="without replacement from 1 samples"):
        WeightedRandomSampler([0.0, 1.0], 2, replacement=False)


def test_random_sampler_permutes_and_is_reproducible():
    s = RandomSampler(range(20), generator=3)
    first, second = list(s), list(s)
    assert sorted(first) == list(range(20)) and first != second  # the generator's state advances per epoch
    again = RandomSampler(range(20), generator=3)
    assert list(again) == first and list(again) == second
    rng = np.random.default_rng(5)
    assert list(RandomSampler(range(20), generator=rng)) == list(RandomSampler(range(20),
                                                                               generator=np.random.default_rng(5)))
    fg.manual_seed(11)
    a = list(RandomSampler(range(20)))
    split = [list(s) for s in random_split(range(20), [0.5, 0.5])]
    fg.manual_seed(11)
    assert list(RandomSampler(range(20))) == a and [list(s) for s in random_split(range(20), [0.5, 0.5])] == split


def test_random_sampler_num_samples_and_replacement():
    long = list(RandomSampler(range(4), num_samples=10, generator=0))
    counts = collections.Counter(long)
    assert len(long) == 10 and all(counts[i] in (2, 3) for i in range(4)) and sorted(long[:4]) == [0, 1, 2, 3]
    draws = list(RandomSampler(range(3), replacement=True, num_samples=50, generator=0))
    assert len(draws) == 50 and set(draws) <= {0, 1, 2} and len(RandomSampler(range(3), num_samples=7)) == 7


def test_subset_and_weighted_samplers():
    idx = [7, 3, 9, 1]
    out = list(SubsetRandomSampler(idx, generator=0))
    assert sorted(out) == sorted(idx) and len(SubsetRandomSampler(idx)) == 4
    w = list(WeightedRandomSampler([0.0, 1.0, 3.0], 200, generator=0))
    assert 0 not in w and w.count(2) > w.count(1)
    no_rep = list(WeightedRandomSampler(fg.tensor([1.0, 1.0, 1.0, 0.0]), 3, replacement=False, generator=1))
    assert sorted(no_rep) == [0, 1, 2]


@pytest.mark.parametrize("n,world,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (2, 5, False),
                                               (11, 4, True)])
def test_distributed_sampler_matches_torch_unshuffled(n, world, drop_last):
    td = _torch_data()
    for rank in range(world):
        ours = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
        ref = td.DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(ref) and len(ours) == len(ref) and ours.total_size == ref.total_size


def test_distributed_sampler_shuffles_disjointly_per_epoch():
    parts = [DistributedSampler(range(12), num_replicas=3, rank=r, seed=4) for r in range(3)]
    first = [list(p) for p in parts]
    assert sorted(i for p in first for i in p) == list(range(12))
    for p in parts:
        p.set_epoch(1)
    assert [list(p) for p in parts] != first
    assert list(DistributedSampler(range(12), num_replicas=3, rank=0, seed=4)) == first[0]


def test_distributed_sampler_defaults_come_from_the_process_group(monkeypatch):
    from flowgraph import distributed
    from tests.distributed._util import free_port

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    distributed.init(backend="local", timeout=10)
    try:
        sampler = DistributedSampler(range(5), shuffle=False)
        assert (sampler.num_replicas, sampler.rank, list(sampler)) == (1, 0, [0, 1, 2, 3, 4])
        assert DistributedSampler(range(5), num_replicas=2, shuffle=False).rank == 0
    finally:
        distributed.destroy()


def test_distributed_sampler_errors():
    with pytest.raises(FlowError, match="not initialised; call flowgraph.distributed.init"):
        DistributedSampler(range(4))
    with pytest.raises(FlowError, match=r"invalid rank 3, rank should be in the interval \[0, 2\]"):
        DistributedSampler(range(4), num_replicas=3, rank=3)


# ---------------------------------------------------------------------- datasets
def test_tensor_dataset_subset_concat_stack_chain():
    ds = _ds(5)
    x, y = ds[2]
    assert x.tolist() == [4.0, 5.0] and y.item() == 2 and len(ds) == 5
    sub = Subset(ds, [4, 0])
    assert len(sub) == 2 and sub[0][1].item() == 4 and [s[1].item() for s in sub.__getitems__([1, 0])] == [0, 4]
    cat = ds + Subset(ds, [1])
    assert isinstance(cat, ConcatDataset) and len(cat) == 6 and cat[5][1].item() == 1 and cat[-1][1].item() == 1
    assert cat.cumulative_sizes == [5, 6]
    with pytest.raises(IndexOutOfRangeError, match="index 6 is out of range for 6 samples"):
        cat[6]
    with pytest.raises(IndexOutOfRangeError):
        cat[-7]
    st = StackDataset(a=ds, b=list(range(10, 15)))
    assert st[1]["b"] == 11 and len(st) == 5 and StackDataset(ds, ds)[0][1][1].item() == 0

    class Stream(IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n

    chain = Stream(2) + Stream(3)
    assert isinstance(chain, ChainDataset) and list(chain) == [0, 1, 0, 1, 2] and len(chain) == 5


def test_dataset_errors():
    with pytest.raises(ShapeError, match=r"size mismatch between tensors: first dimensions are \[3, 2\]"):
        TensorDataset(fg.zeros(3), fg.zeros(2))
    with pytest.raises(FlowError, match="argument 0 is a list, not a flowgraph Tensor"):
        TensorDataset([1, 2])
    with pytest.raises(FlowError, match="datasets should not be an empty iterable"):
        ConcatDataset([])
    with pytest.raises(FlowError, match="is an IterableDataset"):
        ConcatDataset([IterableDataset()])
    with pytest.raises(ShapeError, match="size mismatch between data sets"):
        StackDataset([1], [1, 2])
    with pytest.raises(NotImplementedError, match="without __getitem__"):
        Dataset()[0]


@pytest.mark.parametrize("n,lengths", [(10, [3, 7]), (10, [0.3, 0.3, 0.4]), (11, [0.5, 0.5]), (7, [1 / 3] * 3),
                                       (5, [0.1, 0.9]), (10, [1.0])])
def test_random_split_lengths_match_torch(n, lengths):
    td = _torch_data()
    ours = random_split(range(n), lengths, generator=0)
    ref = td.random_split(range(n), lengths)
    assert [len(s) for s in ours] == [len(s) for s in ref]
    assert sorted(i for s in ours for i in s) == list(range(n))


def test_random_split_is_reproducible_and_checks_lengths():
    a = [list(s) for s in random_split(range(20), [0.5, 0.5], generator=7)]
    b = [list(s) for s in random_split(range(20), [0.5, 0.5], generator=np.random.default_rng(7))]
    assert a == b and a[0] != list(range(10))
    with pytest.raises(FlowError, match=r"sum of input lengths \(6\) does not equal the length of the input "
                                        r"dataset \(10\)"):
        random_split(range(10), [3, 3])
    with pytest.raises(FlowError, match=r"fraction at index 0 is 1.5; fractions lie in \[0, 1\]"):
        random_split(range(10), [1.5, -0.5])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        random_split(range(2), [0.9, 0.1])


# ---------------------------------------------------------------------- collation
def _collate_cases():
    return [
        [1.5, 2.5],
        [1, 2],
        [True, False],
        [np.float32(1.5), np.float32(2)],
        [np.array([1, 2], dtype=np.int16), np.array([3, 4], dtype=np.int16)],
        [np.ones((2, 2), dtype=np.uint8), np.zeros((2, 2), dtype=np.uint8)],
        [np.ones(3, dtype=np.float32), np.zeros(3, dtype=np.float32)],
        [(1, 2.0), (3, 4.0)],
        [[1, 2.0], [3, 4.0]],
        [{"a": 1, "b": np.ones(2)}, {"a": 2, "b": np.zeros(2)}],
        [Point(1, 2.0), Point(3, 4.0)],
        ["x", "y"],
        [{"s": "p", "n": [1, (2.0, np.int64(3))]}, {"s": "q", "n": [4, (5.0, np.int64(6))]}],
    ]


@pytest.mark.parametrize("case", range(13))
def test_default_collate_matches_torch(case):
    td = _torch_data()
    batch = _collate_cases()[case]
    assert _plain(default_collate(batch)) == _plain(td.default_collate(batch))


def test_default_collate_of_tensors_and_errors(device):
    out = default_collate([fg.ones(2, device=device), fg.zeros(2, device=device)])
    assert out.device == fg.device(device) and out.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    with pytest.raises(ShapeError, match="stack expects each tensor to be equal size"):
        default_collate([fg.ones(2), fg.ones(3)])
    with pytest.raises(ShapeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(FlowError, match="batch must contain tensors, numpy arrays, numbers, dicts or lists; "
                                        "found <class 'object'>"):
        default_collate([object()])
    with pytest.raises(FlowError, match="found <U1"):
        default_collate([np.array(["a"])])


@pytest.mark.parametrize("value", [np.ones(2), 1.0, (np.ones(1), 2), [np.float32(2)], {"a": np.arange(3)},
                                   Point(np.ones(1), "s"), "text"])
def test_default_convert_matches_torch(value):
    td = _torch_data()
    assert _plain(default_convert(value)) == _plain(td.default_convert(value))


# ---------------------------------------------------------------------- DataLoader, main process
def _torch_twin(n=10):
    import torch

    return torch.utils.data.TensorDataset(torch.arange(float(2 * n)).reshape(n, 2), torch.arange(n))


@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (3, True), (5, False), (None, False)])
def test_sequential_loader_matches_torch(batch_size, drop_last):
    td = _torch_data()
    ours = DataLoader(_ds(), batch_size=batch_size, drop_last=drop_last)
    ref = td.DataLoader(_torch_twin(), batch_size=batch_size, drop_last=drop_last)
    assert [_plain(b) for b in ours] == [_plain(b) for b in ref] and len(ours) == len(ref)


def test_loader_with_dict_samples_matches_torch():
    td = _torch_data()

    class Rows(Dataset):
        def __getitem__(self, i):
            return {"x": np.full(2, i, dtype=np.float32), "label": i % 2, "weight": 0.5 * i}

        def __len__(self):
            return 5

    assert [_plain(b) for b in DataLoader(Rows(), batch_size=2)] == [_plain(b) for b in td.DataLoader(Rows(),
                                                                                                       batch_size=2)]


def test_shuffle_is_a_reproducible_permutation():
    def order(seed, **kw):
        return [i for _, y in DataLoader(_ds(20), batch_size=6, shuffle=True, generator=seed, **kw) for i in y.tolist()]

    a = order(0)
    assert sorted(a) == list(range(20)) and a != list(range(20)) and order(0) == a and order(1) != a
    loader = DataLoader(_ds(20), batch_size=6, shuffle=True, generator=0)
    epochs = [[i for _, y in loader for i in y.tolist()] for _ in range(2)]
    assert epochs[0] == a and epochs[1] != a  # one generator across epochs, as a torch.Generator


def test_samplers_and_batch_sampler_arguments():
    loader = DataLoader(_ds(), batch_size=2, sampler=[9, 8, 7])
    assert [y.tolist() for _, y in loader] == [[9, 8], [7]]
    loader = DataLoader(_ds(), batch_sampler=[[0, 5], [2]])
    assert [y.tolist() for _, y in loader] == [[0, 5], [2]] and loader.batch_size is None
    loader = DataLoader(_ds(), collate_fn=lambda samples: len(samples), batch_size=4)
    assert list(loader) == [4, 4, 2]


def test_loader_argument_errors():
    ds = _ds()
    cases = [
        (dict(num_workers=-1), "num_workers option should be a non-negative int"),
        (dict(timeout=-1), "timeout option should be non-negative"),
        (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing"),
        (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
        (dict(sampler=[0], shuffle=True), "sampler option is mutually exclusive with shuffle"),
        (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
        (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
        (dict(batch_size=0), "batch_size should be a positive integer value or None"),
        (dict(generator=1.5), "generator must be a numpy.random.Generator"),
        (dict(num_workers=1, multiprocessing_context="nope"), "is not a start method here"),
    ]
    for kwargs, message in cases:
        with pytest.raises(FlowError, match=message):
            loader = DataLoader(ds, **kwargs)
            iter(loader)
    with pytest.raises(FlowError, match="expected unspecified shuffle option, but got shuffle=True"):
        DataLoader(IterableDataset(), shuffle=True)
    with pytest.raises(FlowError, match="expected unspecified sampler option"):
        DataLoader(IterableDataset(), sampler=[0])
    loader = DataLoader(ds, batch_size=2)
    with pytest.raises(FlowError, match="batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 3
    with pytest.raises(fg.BackendError):
        DataLoader(ds, device="tpu")


class _Range(IterableDataset):
    """start..end, each worker reading its own stride of it."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(self.start + first, self.end, step))

    def __len__(self):
        return self.end - self.start


def test_iterable_dataset_in_the_main_process_matches_torch():
    td = _torch_data()
    twin = type("TorchRange", (td.IterableDataset,), {k: _Range.__dict__[k] for k in ("__init__", "__iter__",
                                                                                       "__len__")})
    for kwargs in (dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)):
        ours = DataLoader(_Range(0, 10), **kwargs)
        ref = td.DataLoader(twin(0, 10), **kwargs)
        assert [_plain(b) for b in ours] == [_plain(b) for b in ref] and len(ours) == len(ref)
    assert get_worker_info() is None


def test_device_moves_batches_one_ahead(device):
    reads = []

    class Logged(Dataset):
        def __getitem__(self, i):
            reads.append(i)
            return np.array([i, i], dtype=np.float32), i

        def __len__(self):
            return 6

    it = iter(DataLoader(Logged(), batch_size=2, device=device))
    x, y = next(it)
    assert x.device == fg.device(device) and y.device == fg.device(device) and x.tolist() == [[0, 0], [1, 1]]
    assert reads == [0, 1, 2, 3]  # the second batch is read and on the device before the first is used
    rest = list(it)
    assert [b[1].tolist() for b in rest] == [[2, 3], [4, 5]] and len(it) == 3
    loaded = [b for b in DataLoader(_ds(4), batch_size=3, device=device)]
    assert loaded[1][0].device == fg.device(device) and loaded[1][0].tolist() == [[6.0, 7.0]]


def test_workers_refuse_a_tensor_dataset_on_an_accelerator(device):
    ds = TensorDataset(fg.zeros(4, 2, device=device), fg.zeros(4, device=device))
    if fg.device(device) == "cpu":
        assert len(DataLoader(Subset(ds, [0, 1]), num_workers=1)) == 2
        return
    with pytest.raises(FlowError, match=f"holds tensors on {fg.device(device)}, but worker processes read CPU "
                                        f"data only; keep the data set on the CPU and pass device="):
        DataLoader(Subset(ds, [0, 1]), num_workers=1)


def test_device_prefetch_raises_a_later_error_on_its_own_batch():
    class Broken(Dataset):
        def __getitem__(self, i):
            if i == 2:
                raise ValueError("bad sample 2")
            return float(i)

        def __len__(self):
            return 4

    it = iter(DataLoader(Broken(), batch_size=2, device="cpu"))
    assert next(it).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="bad sample 2"):
        next(it)


# ---------------------------------------------------------------------- workers (kept few: each starts processes)
class _Noisy(Dataset):
    """Samples that record the worker, its seeds and NumPy's / flowgraph's random draws."""

    def __getitem__(self, i):
        info = get_worker_info()
        return {"i": i, "worker": info.id, "seed": info.seed, "np": float(np.random.random()),
                "py": random.random(), "fg": fg.rand(1).item()}

    def __len__(self):
        return 12


def test_workers_deliver_in_order_and_seed_each_worker():
    loader = DataLoader(_Noisy(), batch_size=2, num_workers=2, generator=3)
    batches = list(loader)
    assert [b["i"].tolist() for b in batches] == [[2 * k, 2 * k + 1] for k in range(6)]
    assert [b["worker"].tolist()[0] for b in batches] == [0, 1, 0, 1, 0, 1]
    seeds = {b["worker"].tolist()[0]: b["seed"].tolist()[0] for b in batches}
    assert seeds[1] == seeds[0] + 1
    first = {k: batches[k]["np"].tolist() + batches[k]["fg"].tolist() + batches[k]["py"].tolist() for k in (0, 1)}
    assert first[0] != first[1]  # each worker has its own random streams
    again = list(DataLoader(_Noisy(), batch_size=2, num_workers=2, generator=3))
    assert [_plain(b) for b in again] == [_plain(b) for b in batches]  # reproducible from the loader's generator


def test_worker_batches_equal_main_process_batches_with_shuffle():
    main = [_plain(b) for b in DataLoader(_ds(20), batch_size=3, shuffle=True, generator=5)]
    workers = [_plain(b) for b in DataLoader(_ds(20), batch_size=3, shuffle=True, generator=5, num_workers=2,
                                             prefetch_factor=1)]
    assert main == workers


def test_iterable_dataset_sharded_by_worker_info_and_in_order_false():
    batches = [b.tolist() for b in DataLoader(_Range(0, 10), batch_size=3, num_workers=2)]
    assert batches == [[0, 2, 4], [1, 3, 5], [6, 8], [7, 9]]
    unordered = [b.tolist() for b in DataLoader(_Range(0, 10), batch_size=2, num_workers=2, in_order=False)]
    assert sorted(i for b in unordered for i in b) == list(range(10))


def _init_marks_worker(worker_id):
    os.environ["FG_TEST_WORKER"] = str(worker_id)


class _Env(Dataset):
    def __getitem__(self, i):
        return int(os.environ.get("FG_TEST_WORKER", "-1"))

    def __len__(self):
        return 4


def test_worker_init_fn_and_persistent_workers_reuse_processes():
    loader = DataLoader(_Env(), batch_size=1, num_workers=2, worker_init_fn=_init_marks_worker,
                        persistent_workers=True)
    assert [b.item() for b in loader] == [0, 1, 0, 1]
    pids = [w.pid for w in loader._iterator._pool.workers]
    it = iter(loader)
    next(it)  # abandon the epoch early: the next epoch must start cleanly from the beginning
    assert [b.item() for b in loader] == [0, 1, 0, 1]
    assert [w.pid for w in loader._iterator._pool.workers] == pids
    procs = list(loader._iterator._pool.workers)
    del loader, it
    gc.collect()
    assert not any(p.is_alive() for p in procs)
    stream = DataLoader(_Range(0, 5), batch_size=2, num_workers=2, persistent_workers=True)
    assert [b.tolist() for b in stream] == [b.tolist() for b in stream] == [[0, 2], [1, 3], [4]]


class _Failing(Dataset):
    def __getitem__(self, i):
        if i == 3:
            raise ValueError(f"sample {i} is corrupt")
        return i

    def __len__(self):
        return 6


def test_worker_exception_is_reraised_with_worker_and_traceback():
    loader = DataLoader(_Failing(), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(ValueError) as info:
        next(it)
    text = str(info.value)
    assert "Caught ValueError in DataLoader worker process 1" in text
    assert "Original Traceback (most recent call last)" in text and "sample 3 is corrupt" in text
    assert "in __getitem__" in text


class _Missing(Dataset):
    def __getitem__(self, i):
        return {}["feature"]

    def __len__(self):
        return 2


def test_worker_key_error_keeps_its_type_and_readable_message():
    with pytest.raises(KeyError) as info:
        list(DataLoader(_Missing(), num_workers=1))
    assert str(info.value).startswith("Caught KeyError in DataLoader worker process 0.\nOriginal Traceback")


def test_early_break_shuts_workers_down():
    it = iter(DataLoader(_ds(40), batch_size=2, num_workers=2))
    next(it)
    procs = list(it._pool.workers)
    assert all(p.is_alive() for p in procs)
    del it
    gc.collect()
    assert not any(p.is_alive() for p in procs)


class _Slow(Dataset):
    def __getitem__(self, i):
        time.sleep(0.6)
        return i

    def __len__(self):
        return 2


class _Dies(Dataset):
    def __getitem__(self, i):
        if get_worker_info().id == 0:
            os._exit(3)
        return i

    def __len__(self):
        return 4


def test_timeout_and_dead_worker_errors():
    with pytest.raises(FlowError, match=r"DataLoader timed out after 0.1 seconds"):
        next(iter(DataLoader(_Slow(), batch_size=1, num_workers=1, timeout=0.1)))
    with pytest.raises(FlowError, match=r"DataLoader worker\(s\) exited unexpectedly \(pid \d+ exit code 3\)"):
        list(DataLoader(_Dies(), batch_size=1, num_workers=2))


def test_unpicklable_custom_batch_is_an_error_not_a_hang():
    loader = DataLoader(_ds(4), batch_size=2, num_workers=1, collate_fn=lambda b: (lambda: b), timeout=10)
    with pytest.raises(FlowError, match="cannot be sent to the main process"):
        next(iter(loader))


def test_spawn_start_method():
    loader = DataLoader(_ds(6), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert [_plain(b) for b in loader] == [_plain(b) for b in DataLoader(_ds(6), batch_size=4)]
