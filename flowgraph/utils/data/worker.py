"""Worker processes of a ``DataLoader``: ``get_worker_info()`` and the loop each worker runs.

A worker reads batches with the same fetchers as the main process and sends them back as NumPy arrays (tensors
become :class:`~flowgraph.utils.data.collate.HostTensor`), tagged with their position so the main process can
deliver them in order. The loop is a plain module-level function, so it works with every start method
(``fork``, ``spawn``, ``forkserver``).
"""

from __future__ import annotations

import os
import queue
import random
import traceback
from typing import Any

import numpy as np

from ...backends import get_backend
from .collate import default_collate, to_host
from .fetch import IterableFetcher, MapFetcher

__all__ = ["WorkerInfo", "get_worker_info"]

#: Seconds a worker waits for a task before checking that its parent is still alive.
POLL_INTERVAL = 0.5


class WorkerInfo:
    """What a worker process knows about itself: ``id`` (0..num_workers-1), ``num_workers``, ``seed`` (the
    seed of its generators, ``base_seed + id``) and ``dataset`` (its own copy of the data set)."""

    __initialized = False

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.__keys = tuple(kwargs)
        self.__initialized = True

    def __setattr__(self, key: str, val: Any) -> None:
        if self.__initialized:
            from ...errors import FlowError

            raise FlowError(f"cannot assign attributes to {type(self).__name__} objects (tried {key!r})")
        super().__setattr__(key, val)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__keys if k != "dataset")
        return f"WorkerInfo({body})"


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Inside a ``DataLoader`` worker process, its :class:`WorkerInfo`; ``None`` in the main process.

    An ``IterableDataset`` uses it to give each worker a different part of the stream.
    """
    return _worker_info


class WorkerError:
    """An exception raised in a worker, carried to the main process as text (its type travels when it can be
    pickled by reference, which every importable exception class can)."""

    def __init__(self, worker_id: int, where: str, exc: BaseException) -> None:
        self.worker_id, self.where = worker_id, where
        self.type_name = type(exc).__name__
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        import pickle

        try:
            pickle.dumps(type(exc))  # only writes: checks the class can travel by reference
            self.exc_type: type | None = type(exc)
        except Exception:  # noqa: BLE001 - a local class: the main process raises a FlowError instead
            self.exc_type = None

    def reraise(self) -> None:
        """Raise the exception in the main process: the same type where possible, naming the worker and with the
        worker's traceback in the message, as PyTorch does."""
        from ...errors import FlowError

        where = f" ({self.where})" if self.where else ""
        msg = (f"Caught {self.type_name} in DataLoader worker process {self.worker_id}{where}.\n"
               f"Original {self.traceback}")
        if self.exc_type is KeyError:
            raise _KeyErrorMessage(msg)
        if self.exc_type is not None:
            try:
                exc = self.exc_type(msg)
            except Exception:  # noqa: BLE001 - a constructor that needs other arguments
                exc = None
            if exc is not None:
                raise exc
        raise FlowError(msg)


class _KeyErrorMessage(KeyError):
    """A ``KeyError`` from a worker: printed as its message (a plain ``KeyError`` shows a quoted repr, which would
    put the traceback on one line)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IterableEnd:
    """A worker's answer once its copy of an iterable data set is exhausted."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


def _seed_worker(seed: int, base_seed: int, worker_id: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and flowgraph's CPU generator in a worker."""
    random.seed(seed)
    np.random.seed(np.random.SeedSequence([worker_id, base_seed]).generate_state(4))
    get_backend("cpu").seed(seed)


def worker_loop(is_iterable: bool, dataset: Any, index_queue: Any, result_queue: Any, done_event: Any,
                auto_collation: bool, collate_fn: Any, batch_size: int | None, drop_last: bool, base_seed: int,
                init_fn: Any, worker_id: int, num_workers: int, parent_pid: int) -> None:
    """The body of worker ``worker_id``: take ``(generation, index, task)`` from ``index_queue``, put
    ``(generation, index, batch or error)`` on ``result_queue``; ``None`` or ``done_event`` ends it.

    ``generation`` counts the epochs of a persistent worker: a task of a new generation restarts an iterable
    data set's iterator.
    """
    global _worker_info
    try:
        seed = base_seed + worker_id
        _seed_worker(seed, base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        init_error: WorkerError | None = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
        except Exception as exc:  # noqa: BLE001 - reported to the main process
            init_error = WorkerError(worker_id, "in worker_init_fn", exc)
        check = collate_fn is not default_collate
        map_fetcher = None if is_iterable else MapFetcher(dataset, auto_collation, collate_fn)
        iter_fetcher, iter_generation, exhausted = None, None, False
        while True:
            try:
                task = index_queue.get(timeout=POLL_INTERVAL)
            except queue.Empty:
                if done_event.is_set() or os.getppid() != parent_pid:
                    break
                continue
            if task is None or done_event.is_set():
                break
            generation, idx, index = task
            if init_error is not None:
                result_queue.put((generation, idx, init_error))
                init_error = None
                continue
            try:
                if is_iterable:
                    if generation != iter_generation:
                        iter_generation, exhausted = generation, False
                        iter_fetcher = IterableFetcher(dataset, auto_collation, collate_fn, batch_size, drop_last)
                    if exhausted:
                        data: Any = IterableEnd(worker_id)
                    else:
                        try:
                            data = to_host(iter_fetcher.fetch())
                        except StopIteration:
                            exhausted, data = True, IterableEnd(worker_id)
                else:
                    data = to_host(map_fetcher.fetch(index))
                if check:
                    _check_picklable(data)
            except Exception as exc:  # noqa: BLE001 - reported to the main process with the traceback
                data = WorkerError(worker_id, "", exc)
            result_queue.put((generation, idx, data))
    except KeyboardInterrupt:
        pass
    if done_event.is_set():
        result_queue.cancel_join_thread()
        result_queue.close()


def _check_picklable(data: Any) -> None:
    """Raise here, in the worker, if a custom ``collate_fn`` returned something that cannot travel: otherwise the
    queue's feeder thread would drop the batch and the main process would wait for it forever."""
    from multiprocessing.reduction import ForkingPickler

    try:
        ForkingPickler.dumps(data)  # writes only
    except Exception as exc:
        from ...errors import FlowError

        raise FlowError(f"the batch returned by collate_fn cannot be sent to the main process ({exc}); return "
                        "tensors, NumPy arrays, numbers, strings and containers of them") from exc
