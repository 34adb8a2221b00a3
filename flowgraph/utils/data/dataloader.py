"""``DataLoader``: batches from a data set, in the main process or in worker processes, as PyTorch's.

Single-process (``num_workers=0``): the main process reads and collates each batch when asked. With workers,
each worker process reads whole batches (task ``k`` goes to worker ``k % num_workers``), turns tensors into NumPy
arrays and sends them back through a ``multiprocessing`` queue; the main process reorders them, so batches come in
sampler order, and turns them back into flowgraph tensors on the loader's ``device``. ``prefetch_factor`` batches
per worker are requested ahead.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import queue
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ...backends import parse_device
from ...errors import FlowError
from .collate import default_collate, default_convert, from_host, to_device
from .dataset import Dataset, IterableDataset
from .fetch import IterableFetcher, MapFetcher, tensor_dataset_devices
from .sampler import (
    BatchSampler,
    GeneratorLike,
    RandomSampler,
    Sampler,
    SequentialSampler,
    draw_seed,
    resolve_generator,
)
from .worker import POLL_INTERVAL, IterableEnd, WorkerError, worker_loop

T_co = TypeVar("T_co", covariant=True)

__all__ = ["DataLoader"]

#: Seconds ``shutdown`` waits for all workers to exit before terminating the rest.
JOIN_TIMEOUT = 2.0


class _InfiniteConstantSampler(Sampler[None]):
    """The sampler of an ``IterableDataset`` loader: ``None`` forever (the data set decides when to stop)."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


class DataLoader(Generic[T_co]):
    """Iterate over a data set in batches of flowgraph tensors, with PyTorch's arguments and behaviour.

        loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, num_workers=2, generator=0)
        for xb, yb in loader:
            ...

    Arguments are ``torch.utils.data.DataLoader``'s: ``batch_size`` (``None`` turns auto-batching off: samples
    come one by one through ``default_convert``), ``shuffle``, ``sampler``, ``batch_sampler``, ``num_workers``,
    ``collate_fn`` (default :func:`default_collate`), ``drop_last``, ``timeout`` (seconds to wait for a worker's
    batch; 0 waits forever), ``worker_init_fn(worker_id)``, ``multiprocessing_context`` (a start method name or a
    context; the platform's default otherwise), ``generator`` (a ``numpy.random.Generator`` or an int seed: the
    shuffle order and the workers' base seed come from it; without one from flowgraph's global generator),
    ``prefetch_factor`` (batches requested ahead per worker, default 2), ``persistent_workers`` (keep the worker
    processes between epochs) and ``in_order`` (``False`` delivers worker batches as they arrive).
    ``pin_memory`` and ``pin_memory_device`` are accepted and have no effect (batches are host NumPy memory).

    ``device`` (a flowgraph addition) moves every tensor of each batch to that device, one batch ahead: while
    the loop works on batch ``k``, batch ``k + 1`` is already on the device.

    Worker processes: each gets its own copy of the data set, seeds ``random``, NumPy's global generator and
    flowgraph's CPU generator from ``base_seed + worker_id`` (``get_worker_info().seed``), and sends batches
    back as NumPy arrays. An exception in a worker is raised again in the main process with the worker's id and
    original traceback; a worker that dies raises a ``FlowError``; workers are shut down when the iterator is
    exhausted or garbage collected (an early ``break``), or with the loader for ``persistent_workers``.
    """

    _GUARDED = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
    __initialized = False

    def __init__(self, dataset: Dataset[T_co], batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | Iterable | None = None, batch_sampler: Sampler | Iterable | None = None,
                 num_workers: int = 0, collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: GeneratorLike = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, device: str | None = None) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise FlowError(f"DataLoader(): num_workers option should be a non-negative int, got {num_workers!r}; "
                            "use num_workers=0 to disable multiprocessing")
        if timeout < 0:
            raise FlowError(f"DataLoader(): timeout option should be non-negative, got {timeout!r}")
        if num_workers == 0 and prefetch_factor is not None:
            raise FlowError("DataLoader(): prefetch_factor option could only be specified in multiprocessing; let "
                            "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None")
        if prefetch_factor is not None and (isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int)
                                            or prefetch_factor < 1):
            raise FlowError(f"DataLoader(): prefetch_factor must be a positive int, got {prefetch_factor!r}")
        on_device = sorted(tensor_dataset_devices(dataset) - {"cpu"}) if num_workers else []
        if on_device:
            raise FlowError(f"DataLoader(num_workers={num_workers}): the TensorDataset holds tensors on "
                            f"{', '.join(on_device)}, but worker processes read CPU data only; keep the data set on "
                            f"the CPU and pass device={on_device[0]!r} to move the batches, or use num_workers=0")
        if persistent_workers and num_workers == 0:
            raise FlowError("DataLoader(): persistent_workers option needs num_workers > 0")
        if isinstance(dataset, IterableDataset):
            if shuffle not in (False, None):
                raise FlowError(f"DataLoader() with IterableDataset: expected unspecified shuffle option, but got "
                                f"shuffle={shuffle}; an iterable data set decides its own order")
            if sampler is not None:
                raise FlowError(f"DataLoader() with IterableDataset: expected unspecified sampler option, but got "
                                f"sampler={sampler!r}")
            if batch_sampler is not None:
                raise FlowError(f"DataLoader() with IterableDataset: expected unspecified batch_sampler option, but "
                                f"got batch_sampler={batch_sampler!r}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise FlowError("DataLoader(): sampler option is mutually exclusive with shuffle; shuffle inside the "
                            "sampler (e.g. RandomSampler) instead")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise FlowError("DataLoader(): batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                "sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None:
            if drop_last:
                raise FlowError("DataLoader(): batch_size=None option disables auto-batching and is mutually "
                                "exclusive with drop_last")
        elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise FlowError(f"DataLoader(): batch_size should be a positive integer value or None, but got "
                            f"batch_size={batch_size!r}")
        rng = resolve_generator(generator, "DataLoader()")
        if sampler is None:
            if isinstance(dataset, IterableDataset):
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=rng)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.collate_fn = collate_fn if collate_fn is not None else (
            default_collate if batch_sampler is not None else default_convert)
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None or num_workers == 0 else 2
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.device = None if device is None else parse_device(device)
        self._rng = rng
        self._iterator: _MultiProcessIter | None = None
        self.__initialized = True

    def __setattr__(self, attr: str, val: Any) -> None:
        if self.__initialized and attr in self._GUARDED:
            raise FlowError(f"{attr} attribute should not be set after {type(self).__name__} is initialized; "
                            "make a new DataLoader")
        super().__setattr__(attr, val)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def _mp_context(self) -> Any:
        ctx = self.multiprocessing_context
        if ctx is None:
            return multiprocessing.get_context()
        if isinstance(ctx, str):
            methods = multiprocessing.get_all_start_methods()
            if ctx not in methods:
                raise FlowError(f"DataLoader(): multiprocessing_context={ctx!r} is not a start method here; "
                                f"choose one of {methods}")
            return multiprocessing.get_context(ctx)
        if not hasattr(ctx, "Process"):
            raise FlowError(f"DataLoader(): multiprocessing_context must be a start method name or a "
                            f"multiprocessing context, got {type(ctx).__name__}")
        return ctx

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            it: Any = _SingleProcessIter(self)
        elif self.persistent_workers:
            if self._iterator is None:
                self._iterator = _MultiProcessIter(self)
            else:
                self._iterator.reset()
            it = self._iterator
        else:
            it = _MultiProcessIter(self)
        return _DevicePrefetch(it, self.device) if self.device is not None else it

    def __len__(self) -> int:
        return _length(self.dataset, self.batch_size, self.drop_last, self._index_sampler)


def _length(dataset: Any, batch_size: int | None, drop_last: bool, index_sampler: Any) -> int:
    """``len(DataLoader)``: batches per epoch (an iterable data set's own length, batched)."""
    if isinstance(dataset, IterableDataset):
        length = len(dataset)  # type: ignore[arg-type]
        if batch_size is not None:
            length = length // batch_size if drop_last else math.ceil(length / batch_size)
        return length
    return len(index_sampler)


class _BaseIter:
    """What every loader iterator copies from its loader (never the loader itself: a persistent iterator must
    not keep its loader alive)."""

    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._is_iterable = isinstance(loader.dataset, IterableDataset)
        self._auto_collation = loader._auto_collation
        self._index_sampler = loader._index_sampler
        self._collate_fn = loader.collate_fn
        self._batch_size, self._drop_last = loader.batch_size, loader.drop_last
        self._base_seed = draw_seed(loader._rng)

    def __iter__(self) -> _BaseIter:
        return self

    def __len__(self) -> int:
        return _length(self._dataset, self._batch_size, self._drop_last, self._index_sampler)


class _SingleProcessIter(_BaseIter):
    """Batches read in the main process (``num_workers=0``)."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        if self._is_iterable:
            self._fetcher: Any = IterableFetcher(self._dataset, self._auto_collation, self._collate_fn,
                                                 self._batch_size, self._drop_last)
        else:
            self._fetcher = MapFetcher(self._dataset, self._auto_collation, self._collate_fn)
            self._sampler_iter = iter(self._index_sampler)

    def __next__(self) -> Any:
        if self._is_iterable:
            return self._fetcher.fetch()
        return self._fetcher.fetch(next(self._sampler_iter))


class _WorkerPool:
    """The worker processes and queues of one iterator; ``shutdown`` runs once (also from a finalizer)."""

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.index_queues: list[Any] = []
        self.result_queue: Any = None
        self.done_event: Any = None
        self.closed = False

    def shutdown(self) -> None:
        """Ask every worker to stop, wait up to ``JOIN_TIMEOUT`` seconds, terminate the rest, close the queues."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.done_event is not None:
                self.done_event.set()
            for q in self.index_queues:
                try:
                    q.put(None)
                except Exception:  # noqa: BLE001, S110 - a closed queue: the worker stops on done_event anyway
                    pass
            deadline = time.monotonic() + JOIN_TIMEOUT
            for w in self.workers:
                w.join(timeout=max(0.0, deadline - time.monotonic()))
            for w in self.workers:
                if w.is_alive():
                    w.terminate()
                    w.join(timeout=1.0)
        finally:
            for q in [*self.index_queues, self.result_queue]:
                if q is not None:
                    q.cancel_join_thread()
                    q.close()


class _MultiProcessIter(_BaseIter):
    """Batches read by worker processes, delivered in sampler order (or as they come with ``in_order=False``)."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor * loader.num_workers
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        self._device = loader.device
        ctx = loader._mp_context()
        pool = self._pool = _WorkerPool()
        self._finalizer = weakref.finalize(self, pool.shutdown)  # early break, garbage collection, exit
        pool.result_queue = ctx.Queue()
        pool.done_event = ctx.Event()
        for worker_id in range(self._num_workers):
            index_queue = ctx.Queue()
            index_queue.cancel_join_thread()
            w = ctx.Process(target=worker_loop, daemon=True, args=(
                self._is_iterable, self._dataset, index_queue, pool.result_queue, pool.done_event,
                self._auto_collation, self._collate_fn, self._batch_size, self._drop_last, self._base_seed,
                loader.worker_init_fn, worker_id, self._num_workers, os.getpid()))
            try:
                w.start()
            except Exception as exc:
                self._finalizer()
                method = ctx.get_start_method()
                raise FlowError(f"DataLoader: could not start worker process {worker_id} with the {method!r} start "
                                f"method ({type(exc).__name__}: {exc}); with 'spawn' or 'forkserver' the data set, "
                                "collate_fn and worker_init_fn must be picklable (module-level functions, no "
                                "lambdas)") from exc
            pool.index_queues.append(index_queue)
            pool.workers.append(w)
        self._generation = 0
        self.reset()

    def reset(self) -> None:
        """Start an epoch: a new generation of tasks (a persistent worker restarts an iterable data set), the
        sampler from the beginning, ``prefetch_factor * num_workers`` tasks sent ahead."""
        self._generation += 1
        self._sampler_iter = itertools.repeat(None) if self._is_iterable else iter(self._index_sampler)
        self._send_idx = self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}
        self._active = [True] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        for _ in range(self._prefetch):
            self._try_put_index()

    def _try_put_index(self) -> None:
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_cycle)
            if self._active[worker_id]:
                break
        else:
            return
        self._pool.index_queues[worker_id].put((self._generation, self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._send_idx += 1

    def __next__(self) -> Any:
        if self._pool.closed:
            raise StopIteration
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info is not None and (len(info) == 2 or self._active[info[0]]):
                    break
                self._task_info.pop(self._rcvd_idx, None)  # delivered out of order, or its worker's stream ended
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._finalizer()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(info[1])
            generation, idx, data = self._get_data()
            if generation != self._generation:
                continue  # a persistent worker's answer to an earlier, abandoned epoch
            if isinstance(data, IterableEnd):
                self._active[data.worker_id] = False
                continue
            if idx == self._rcvd_idx or not self._in_order:
                del self._task_info[idx]
                if idx == self._rcvd_idx:
                    self._rcvd_idx += 1
                return self._process(data)
            self._task_info[idx] += (data,)

    def _process(self, data: Any) -> Any:
        self._try_put_index()
        if isinstance(data, WorkerError):
            data.reraise()
        return from_host(data, self._device)

    def _get_data(self) -> tuple[int, int, Any]:
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = POLL_INTERVAL if deadline is None else max(0.0, min(POLL_INTERVAL, deadline - time.monotonic()))
            try:
                return self._pool.result_queue.get(timeout=wait)
            except queue.Empty:
                pass
            dead = [w for w in self._pool.workers if not w.is_alive()]
            if dead:
                self._finalizer()
                codes = ", ".join(f"pid {w.pid} exit code {w.exitcode}" for w in dead)
                raise FlowError(f"DataLoader worker(s) exited unexpectedly ({codes}); a negative code is the signal "
                                "that ended it (e.g. -9: killed, often for memory)")
            if deadline is not None and time.monotonic() >= deadline:
                raise FlowError(f"DataLoader timed out after {self._timeout} seconds waiting for a batch from the "
                                "worker processes; raise timeout= (0 waits forever) or make the data set faster")


class _DevicePrefetch:
    """Moves each batch to ``device`` one batch ahead of the loop: returning batch ``k`` after batch ``k + 1``
    has been read and sent to the device. An error reading batch ``k + 1`` is raised on the next call."""

    def __init__(self, inner: Any, device: str) -> None:
        self._inner, self._device = inner, device
        self._pending: list[Any] = []
        self._error: BaseException | None = None
        self._started = False

    def __iter__(self) -> _DevicePrefetch:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def _pull(self) -> None:
        try:
            self._pending.append(to_device(next(self._inner), self._device))
        except StopIteration:
            pass
        except Exception as exc:  # noqa: BLE001 - raised on the call that would have returned this batch
            self._error = exc

    def __next__(self) -> Any:
        if not self._started:
            self._started = True
            self._pull()
        if not self._pending:
            if self._error is not None:
                exc, self._error, self._started = self._error, None, False
                raise exc
            raise StopIteration
        current = self._pending.pop()
        if self._error is None:
            self._pull()
        return current
