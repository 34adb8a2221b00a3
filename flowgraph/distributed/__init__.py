"""Data-parallel training across processes: ``init``, collectives, :class:`DataParallel`, :func:`shard`.

Start the processes with ``python -m flowgraph.distributed.run --nproc-per-node N train.py`` (or torchrun, ``srun``,
``mpirun``); in the script call ``init()`` (it reads the launcher's variables: :func:`detect_environment`), wrap
the model in :class:`DataParallel`, and give each rank its part of the data with :func:`shard`;
:class:`ZeroRedundancyOptimizer` shards the optimizer state across the ranks. See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

from ..errors import FlowError
from ..tensor import Tensor
from .comm import Communicator, MpiCommunicator, NcclCommunicator, StoreCommunicator
from .data_parallel import DataParallel, assign_buckets
from .env import DistributedEnvironment, detect_environment, expand_hostlist
from .sampler import shard
from .store import Heartbeat, StoreClient, StoreServer
from .store import barrier as _store_barrier
from .sync_batchnorm import SyncBatchNorm, all_reduce_sum, sync_batch_norm
from .zero import ZeroRedundancyOptimizer, partition_parameters, sharded_checkpoint_path

__all__ = [
    "Communicator", "DataParallel", "DistributedEnvironment", "MpiCommunicator", "NcclCommunicator", "StoreClient",
    "StoreCommunicator", "StoreServer", "SyncBatchNorm", "all_reduce_sum", "sync_batch_norm",
    "all_gather", "all_reduce", "assign_buckets", "barrier", "broadcast", "destroy", "detect_environment",
    "expand_hostlist", "get_local_rank", "get_rank", "get_world_size", "init", "is_initialized", "is_main_process",
    "shard",
    "ZeroRedundancyOptimizer", "partition_parameters", "sharded_checkpoint_path",
]


class _State:
    def __init__(self, rank: int, world_size: int, local_rank: int, server: StoreServer | None,
                 store: StoreClient | None, heartbeat: Heartbeat | None, comm: Communicator, timeout: float,
                 source: str = "flowgraph", mpi: MpiCommunicator | None = None) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.server, self.store, self.heartbeat, self.comm, self.timeout = server, store, heartbeat, comm, timeout
        self.source, self.mpi = source, mpi  # mpi: set for an mpirun launch with mpi4py (no store then)
        self.barriers = 0


_state: _State | None = None

#: Set to ``0`` to keep an ``mpirun`` launch on the TCP store even where ``mpi4py`` is installed.
MPI_ENV = "FLOWGRAPH_MPI"


def _mpi_world(env: DistributedEnvironment) -> Any:
    """``MPI.COMM_WORLD`` for an MPI launch where ``mpi4py`` is importable (and ``FLOWGRAPH_MPI`` is not ``0``),
    else None. Importing ``mpi4py.MPI`` initialises MPI, so nothing is imported for other launches."""
    import importlib.util

    if env.source != "mpi" or os.environ.get(MPI_ENV) == "0" or importlib.util.find_spec("mpi4py") is None:
        return None
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) != (env.rank, env.world_size):
        raise FlowError(f"init(): MPI says rank {world.Get_rank()} of {world.Get_size()} but the launcher's "
                        f"variables say rank {env.rank} of {env.world_size}; mpi4py must use the MPI library of "
                        "the mpirun that started the job")
    return world


def init(backend: str = "nccl", timeout: float = 300.0) -> None:
    """Join the process group described by the environment the launcher sets.

    The launcher is recognised by :func:`detect_environment`: ``python -m flowgraph.distributed.run``, torchrun
    (or ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set by hand), Slurm's ``srun`` or
    ``mpirun``. ``backend="nccl"`` runs collectives with NCCL on ``cuda:LOCAL_RANK``; ``backend="local"`` runs
    them on host copies (any device, slow; for CPU processes and tests). Under ``mpirun`` with ``mpi4py``
    installed, MPI carries the bootstrap (NCCL's unique id), the barriers and the ``"local"`` collectives
    (:class:`MpiCommunicator`); otherwise rank 0 hosts the TCP store on ``MASTER_PORT``, which needs the job's
    ``FLOWGRAPH_STORE_SECRET`` (our launcher sets one; other launchers need it exported by the job script).
    ``timeout`` bounds every wait for another rank (seconds).
    """
    global _state
    if _state is not None:
        raise FlowError("distributed.init() called twice; call distributed.destroy() first")
    if backend not in ("nccl", "local"):
        raise FlowError(f"init(backend={backend!r}): backend must be 'nccl' or 'local'")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise FlowError(f"init(timeout={timeout!r}): timeout must be a positive number of seconds")
    env = detect_environment()
    rank, world = env.rank, env.world_size
    mpi_world = _mpi_world(env)
    local_rank = env.local_rank
    if local_rank is None and mpi_world is not None:
        from mpi4py import MPI

        node = mpi_world.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = node.Get_rank()
        node.Free()
    if local_rank is None:
        if backend == "nccl":
            raise FlowError(f"init(): the {env.source} launcher does not say which GPU this rank uses; set "
                            "MPI_LOCALRANKID (or LOCAL_RANK) or install mpi4py (`pip install flowgraph[mpi]`)")
        local_rank = 0  # host collectives: the local rank picks nothing
    if mpi_world is not None:
        mpi = MpiCommunicator(mpi_world.Dup(), timeout)
        if backend == "nccl":
            comm: Communicator = NcclCommunicator(None, rank, world, local_rank, timeout, mpi_comm=mpi.mpi_comm)
        else:
            comm = mpi
        _state = _State(rank, world, local_rank, None, None, None, comm, timeout, env.source, mpi)
    else:
        from .store import job_secret

        # A world of one has no other rank to share a secret with: a fresh one (in this process only) keeps
        # its store authenticated without asking the user to export anything.
        secret = job_secret() or (secrets.token_bytes(32) if world == 1 else b"")
        bind = _store_bind_address(env, secret)
        addr, port = env.master_addr or bind, env.master_port
        server = StoreServer(bind, port, secret=secret) if rank == 0 else None
        store = StoreClient(addr, port, rank, connect_timeout=timeout, secret=secret)
        heartbeat = Heartbeat(addr, port, rank, secret=secret)
        if backend == "nccl":
            comm = NcclCommunicator(store, rank, world, local_rank, timeout)
        else:
            comm = StoreCommunicator(store, rank, world, timeout)
        _state = _State(rank, world, local_rank, server, store, heartbeat, comm, timeout, env.source)
    if isinstance(comm, NcclCommunicator):
        _abort_on_uncaught()
    barrier()


def _store_bind_address(env: DistributedEnvironment, secret: bytes) -> str:
    """Where rank 0's store listens, after checking that the store will be authenticated.

    Our launcher always sets a secret (a loopback-only job may also run without one, as before). Any other
    launcher needs ``FLOWGRAPH_STORE_SECRET`` exported by the job script (``secret``: the one the store will
    use): the store never runs without authentication for them, and the FlowError says what to export.
    """
    from .store import SECRET_ENV

    if env.master_addr is None:
        raise FlowError(f"init(): this {env.source} launch spans several hosts and MASTER_ADDR is not set; export "
                        "MASTER_ADDR (the host of rank 0) and MASTER_PORT, or install mpi4py "
                        "(`pip install flowgraph[mpi]`) so that MPI itself is the rendezvous")
    if env.source != "flowgraph" and not secret:
        hint = " (or install mpi4py, `pip install flowgraph[mpi]`: MPI then replaces the store)" \
            if env.source == "mpi" else ""
        raise FlowError(
            f"init(): started by {env.source} without flowgraph's launcher and {SECRET_ENV} is not set; the "
            "rendezvous store admits only processes that know the job's secret. Export the same value to every "
            f"rank in the job script, before the launcher: `export {SECRET_ENV}=$(python -c "
            f"'import secrets; print(secrets.token_hex(32))')`{hint}"
        )
    return _bind_address(env.master_addr, secret)


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


def _bind_address(master_addr: str, secret: bytes | None = None) -> str:
    """Where rank 0's store listens: loopback for a single-host job (``MASTER_ADDR`` on this machine only),
    otherwise ``MASTER_ADDR`` itself; never every interface. A multi-host job needs the store secret
    (``secret``, by default ``FLOWGRAPH_STORE_SECRET``)."""
    import ipaddress

    from .store import SECRET_ENV, job_secret

    try:
        loopback = master_addr == "localhost" or ipaddress.ip_address(master_addr).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return "127.0.0.1"
    if not (job_secret() if secret is None else secret):
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


def get_local_rank() -> int:
    """This process's index on its host (``LOCAL_RANK``, ``SLURM_LOCALID``, ``OMPI_COMM_WORLD_LOCAL_RANK``...):
    with NCCL the rank uses ``cuda:get_local_rank()``."""
    return _get().local_rank


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
    if s.mpi is not None:
        s.mpi.barrier(timeout)
        return
    assert s.store is not None
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
    if s.mpi is not None:
        if s.mpi is not s.comm:
            s.mpi.close()
        _state = None
        return
    assert s.store is not None and s.heartbeat is not None
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
