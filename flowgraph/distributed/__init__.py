"""Data-parallel training across processes: ``init``, collectives, :class:`DataParallel`, :func:`shard`.

Start the processes with ``python -m flowgraph.distributed.run --nproc-per-node N train.py``; in the script call
``init()`` (reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), wrap the model in
:class:`DataParallel`, and give each rank its part of the data with :func:`shard`. See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import os

from ..errors import FlowError
from ..tensor import Tensor
from .comm import Communicator, NcclCommunicator, StoreCommunicator
from .data_parallel import DataParallel, assign_buckets
from .sampler import shard
from .store import Heartbeat, StoreClient, StoreServer
from .store import barrier as _store_barrier
from .sync_batchnorm import SyncBatchNorm, all_reduce_sum, sync_batch_norm

__all__ = [
    "Communicator", "DataParallel", "NcclCommunicator", "StoreClient", "StoreCommunicator", "StoreServer",
    "SyncBatchNorm", "all_reduce_sum", "sync_batch_norm",
    "all_gather", "all_reduce", "assign_buckets", "barrier", "broadcast", "destroy", "get_rank",
    "get_world_size", "init", "is_initialized", "is_main_process", "shard",
]


class _State:
    def __init__(self, rank: int, world_size: int, local_rank: int, server: StoreServer | None,
                 store: StoreClient, heartbeat: Heartbeat, comm: Communicator, timeout: float) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.server, self.store, self.heartbeat, self.comm, self.timeout = server, store, heartbeat, comm, timeout
        self.barriers = 0


_state: _State | None = None


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.lstrip("-").isdigit():
        raise FlowError(f"init(): environment variable {name} is {value!r}; start the script with "
                        "`python -m flowgraph.distributed.run --nproc-per-node N script.py` or set RANK, "
                        "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself")
    return int(value)


def init(backend: str = "nccl", timeout: float = 300.0) -> None:
    """Join the process group described by the environment the launcher sets.

    ``backend="nccl"`` runs collectives with NCCL on ``cuda:LOCAL_RANK``; ``backend="local"`` runs them through
    the TCP store with host copies (any device, slow; for CPU processes and tests). Rank 0 hosts the store on
    ``MASTER_PORT``. ``timeout`` bounds every wait for another rank (seconds).
    """
    global _state
    if _state is not None:
        raise FlowError("distributed.init() called twice; call distributed.destroy() first")
    if backend not in ("nccl", "local"):
        raise FlowError(f"init(backend={backend!r}): backend must be 'nccl' or 'local'")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise FlowError(f"init(timeout={timeout!r}): timeout must be a positive number of seconds")
    rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    port = _env_int("MASTER_PORT")
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if world < 1:
        raise FlowError(f"init(): WORLD_SIZE={world}; the number of processes must be >= 1")
    if not 0 <= rank < world:
        raise FlowError(f"init(): RANK={rank} is not in [0, WORLD_SIZE={world})")
    if local_rank < 0:
        raise FlowError(f"init(): LOCAL_RANK={local_rank}; the rank on this host must be >= 0")
    if not 1 <= port <= 65535:
        raise FlowError(f"init(): MASTER_PORT={port} is not a TCP port; it must be in 1..65535")
    if not addr.strip():
        raise FlowError(f"init(): MASTER_ADDR={addr!r} is empty; set it to rank 0's host name or address "
                        "(127.0.0.1 for a single host)")
    server = StoreServer(_bind_address(addr), port) if rank == 0 else None
    store = StoreClient(addr, port, rank, connect_timeout=timeout)
    heartbeat = Heartbeat(addr, port, rank)
    if backend == "nccl":
        comm: Communicator = NcclCommunicator(store, rank, world, local_rank, timeout)
    else:
        comm = StoreCommunicator(store, rank, world, timeout)
    _state = _State(rank, world, local_rank, server, store, heartbeat, comm, timeout)
    if isinstance(comm, NcclCommunicator):
        _abort_on_uncaught()
    barrier()


def _abort_on_uncaught() -> None:
    """Make an uncaught exception end this rank at once: print it, abort NCCL, exit 1.

    Otherwise the interpreter's exit would destroy the communicator, which waits for collectives the other
    ranks never finish: the failing rank would hang instead of exiting, and the launcher would never learn
    that it failed. Installed once per process; it aborts the communicator of the current ``init()``.
    """
    import sys

    if _HOOK:
        return
    previous = sys.excepthook

    def abort_and_exit(kind, value, tb) -> None:
        previous(kind, value, tb)
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            if _state is not None and isinstance(_state.comm, NcclCommunicator):
                _state.comm.abort()
        os._exit(1)

    sys.excepthook = abort_and_exit
    _HOOK.append(abort_and_exit)


#: The installed hook (empty until the first NCCL ``init()``).
_HOOK: list = []


def _get() -> _State:
    if _state is None:
        raise FlowError("flowgraph.distributed is not initialised; call flowgraph.distributed.init() first")
    return _state


def is_initialized() -> bool:
    """True between ``init()`` and ``destroy()``."""
    return _state is not None


def _bind_address(master_addr: str) -> str:
    """Where rank 0's store listens: loopback for a single-host job (``MASTER_ADDR`` on this machine only),
    otherwise ``MASTER_ADDR`` itself; never every interface. A multi-host job needs the store secret."""
    import ipaddress

    from .store import SECRET_ENV, job_secret

    try:
        loopback = master_addr == "localhost" or ipaddress.ip_address(master_addr).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return "127.0.0.1"
    if not job_secret():
        raise FlowError(
            f"init(): MASTER_ADDR={master_addr} reaches beyond this machine but {SECRET_ENV} is not set; anyone "
            "who reaches the port could read or change the job's gradients. Start the job with "
            "`python -m flowgraph.distributed.run` (it sets a secret) or export the same hex secret on every host"
        )
    return master_addr


def is_main_process() -> bool:
    """True outside a process group and on rank 0: where checkpoints, reports and the dashboard happen.

    ``Graph.save_checkpoint`` and the ``Monitor`` (dashboard, console, report, exports) act only where this is
    True, so one training script runs unchanged on every rank.
    """
    return _state is None or _state.rank == 0


def get_rank() -> int:
    """This process's rank, 0..world_size-1."""
    return _get().rank


def get_world_size() -> int:
    """The number of ranks."""
    return _get().world_size


def get_communicator() -> Communicator:
    """The communicator ``init()`` created (what :class:`DataParallel` uses by default)."""
    return _get().comm


def barrier(timeout: float | None = None) -> None:
    """Wait for every rank; after ``timeout`` seconds the FlowError names the missing (or dead) ranks."""
    s = _get()
    s.comm.synchronize()
    name = str(s.barriers)
    s.barriers += 1
    _store_barrier(s.store, s.rank, s.world_size, name, s.timeout if timeout is None else timeout)


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduce ``tensor`` over all ranks in place (``"sum"``, ``"avg"`` or ``"max"``); returns it."""
    return _get().comm.all_reduce(tensor, op)


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """Overwrite ``tensor`` on every rank with rank ``src``'s values; returns it."""
    return _get().comm.broadcast(tensor, src)


def all_gather(tensor: Tensor) -> list[Tensor]:
    """Every rank's ``tensor`` in rank order."""
    return _get().comm.all_gather(tensor)


def destroy() -> None:
    """Leave the process group: a final barrier (so rank 0 keeps the store up until all are done), then close."""
    global _state
    s = _get()
    barrier()
    s.comm.close()
    s.heartbeat.stop()
    s.store.add("destroy/passed", 1)
    if s.server is not None:
        # Rank 0 hosts the store: keep it up until every rank has left the final barrier.
        import time

        deadline = time.monotonic() + 10.0
        while int(s.store.try_get("destroy/passed") or b"0") < s.world_size and time.monotonic() < deadline:
            time.sleep(0.005)
    s.store.close()
    if s.server is not None:
        s.server.close()
    _state = None
