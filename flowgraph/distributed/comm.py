"""Communicators: the collectives ``all_reduce``, ``broadcast`` and ``all_gather`` on flowgraph tensors.

:class:`StoreCommunicator` moves host copies through the TCP store (slow but real: CPU processes, tests of the
whole flow); :class:`MpiCommunicator` moves them through MPI (``mpi4py``, under ``mpirun``).
:class:`NcclCommunicator` runs NCCL (``cupy.cuda.nccl``) on the CuPy arrays of ``cuda:`` tensors on a
dedicated stream. All are in place: the tensor passed in holds the result afterwards.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import FlowError
from ..tensor import Tensor
from ..tensor.tensor import _wrap
from .store import StoreClient

_OPS = ("sum", "avg", "max")


def _check_op(op: str) -> None:
    if op not in _OPS:
        raise FlowError(f"all_reduce op must be one of {_OPS}, got {op!r}")


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, Tensor):
        raise FlowError(f"{what} needs a flowgraph Tensor, got {type(t).__name__}")


def _c_order(array: np.ndarray) -> np.ndarray:
    """``array`` in C order, 0-d kept 0-d (``np.ascontiguousarray`` turns 0-d into shape ``(1,)``)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


class Communicator(ABC):
    """The interface every transport implements; ``rank`` and ``world_size`` are set by the constructor."""

    rank: int
    world_size: int

    def all_reduce(self, tensor: Tensor, op: str = "sum") -> Tensor:
        """Reduce ``tensor`` over all ranks in place (``op``: ``"sum"``, ``"avg"``, ``"max"``); returns it."""
        self.all_reduce_coalesced([tensor], op)
        return tensor

    @abstractmethod
    def all_reduce_coalesced(self, tensors: list[Tensor], op: str = "sum", async_op: bool = False) -> list[Tensor]:
        """``all_reduce`` of several tensors in place, as one operation; returns them.

        ``async_op=True`` lets an asynchronous transport return before later work is ordered after the
        collective: call :meth:`synchronize` before reading the tensors (``DataParallel`` does, so the
        all-reduce overlaps the rest of backward).
        """

    @abstractmethod
    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        """Overwrite ``tensor`` on every rank with rank ``src``'s values; returns it."""

    @abstractmethod
    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's ``tensor`` (same shape and dtype on all ranks), in rank order."""

    def synchronize(self) -> None:
        """Wait for collectives launched asynchronously (no-op for synchronous transports)."""
        return  # an optional hook: the default does nothing

    def close(self) -> None:
        """Release the transport's resources."""
        return  # an optional hook: the default does nothing


class _HostCommunicator(Communicator):
    """Collectives on host copies; a subclass only moves bytes (:meth:`_gather_blobs`, :meth:`_broadcast_bytes`).

    The reductions are done here, in rank order, so every rank gets identical bits whatever the transport. The
    host part of each collective is one ``Backend.host_call``, so a step recorded by ``fg.jit`` communicates
    again on every replay.
    """

    rank: int
    world_size: int

    @abstractmethod
    def _gather_blobs(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload`` (lengths may differ), in rank order."""

    @abstractmethod
    def _broadcast_bytes(self, payload: bytes, src: int) -> bytes:
        """Rank ``src``'s ``payload`` on every rank (the others pass ``b""``)."""

    def _gather_flat(self, flat: np.ndarray) -> list[np.ndarray]:
        """Every rank's 1-d array (same dtype and size on all ranks), in rank order."""
        return [np.frombuffer(b, dtype=flat.dtype) for b in self._gather_blobs(flat.tobytes())]

    @staticmethod
    def _host(tensor: Tensor) -> np.ndarray:
        return _c_order(np.asarray(tensor._backend.to_host(tensor._data)))

    def all_reduce_coalesced(self, tensors: list[Tensor], op: str = "sum", async_op: bool = False) -> list[Tensor]:
        """One exchange for all ``tensors`` of one dtype (their host copies concatenated; one exchange per dtype
        otherwise). Sums are taken in rank order, so every rank gets identical bits. The host part is one
        ``Backend.host_call``, so a step recorded by ``fg.jit`` exchanges again on every replay."""
        _check_op(op)
        for t in tensors:
            _check_tensor(t, "all_reduce")
        if not tensors:
            return tensors
        bk = tensors[0]._backend
        reduced = bk.host_call(lambda *arrays: self._reduce_arrays(bk, arrays, op), *[t._data for t in tensors])
        with no_grad():
            for t, r in zip(tensors, reduced):
                t.copy_(_wrap(r, bk))
        return tensors

    def _reduce_arrays(self, bk: Any, arrays: tuple, op: str) -> tuple:
        """The reduced values of ``arrays`` as new device arrays (one exchange per dtype)."""
        hosts = [_c_order(np.asarray(bk.to_host(a))) for a in arrays]
        out: list[Any] = [None] * len(hosts)
        for dt in dict.fromkeys(h.dtype for h in hosts):
            idx = [i for i, h in enumerate(hosts) if h.dtype == dt]
            flat = np.concatenate([hosts[i].reshape(-1) for i in idx])
            total = self._reduce_flat(flat, op)
            offset = 0
            for i in idx:
                n = hosts[i].size
                out[i] = bk.from_host(_c_order(total[offset:offset + n].reshape(hosts[i].shape)))
                offset += n
        return tuple(out)

    def _reduce_flat(self, flat: np.ndarray, op: str) -> np.ndarray:
        parts = self._gather_flat(flat)
        if op == "max":
            return np.maximum.reduce(parts)
        out = parts[0].copy()
        for p in parts[1:]:
            out += p
        if op == "avg":
            out = (out / self.world_size).astype(flat.dtype, copy=False)
        return out

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        """Overwrite ``tensor`` with rank ``src``'s values (the exchange is one ``Backend.host_call``)."""
        _check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise FlowError(f"broadcast src={src} is not a rank of a world of size {self.world_size}")
        bk = tensor._backend
        (received,) = bk.host_call(lambda a: (self._broadcast_array(bk, a, src),), tensor._data)
        if self.rank != src:
            with no_grad():
                tensor.copy_(_wrap(received, bk))
        return tensor

    def _broadcast_array(self, bk: Any, array: Any, src: int) -> Any:
        host = _c_order(np.asarray(bk.to_host(array)))
        data = self._broadcast_bytes(host.tobytes() if self.rank == src else b"", src)
        if len(data) != host.nbytes:
            raise FlowError(f"broadcast: rank {src} sent {len(data)} bytes, rank {self.rank} expected "
                            f"{host.nbytes} (shape {tuple(host.shape)}, {host.dtype}); shapes must match")
        if self.rank == src:
            return array
        return bk.from_host(_c_order(np.frombuffer(data, dtype=host.dtype).reshape(host.shape)))

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's tensor in rank order (new tensors on ``tensor``'s device)."""
        _check_tensor(tensor, "all_gather")
        host = self._host(tensor)
        # Each blob starts with its shape and dtype as JSON (never pickle: ranks read each other's bytes).
        meta = json.dumps([list(host.shape), host.dtype.str]).encode()
        out = []
        for r, blob in enumerate(self._gather_blobs(meta + b"|" + host.tobytes())):
            shape, dt = json.loads(blob[: len(meta)]) if blob[: len(meta)] == meta else (None, None)
            if shape is None:
                raise FlowError(f"all_gather: rank {r}'s tensor differs in shape or dtype from rank {self.rank}'s "
                                f"{tuple(host.shape)} {host.dtype}; all ranks must pass the same shape and dtype")
            arr = np.frombuffer(blob[len(meta) + 1:], dtype=np.dtype(dt)).reshape(shape).copy()
            out.append(_wrap(tensor._backend.from_host(arr), tensor._backend))
        return out


class StoreCommunicator(_HostCommunicator):
    """Collectives through the TCP store with host copies: every rank publishes its array, then reads all.

    Each collective has a sequence number; a rank publishing for collective ``k`` deletes its own key of
    collective ``k - 2`` (all ranks have read it by then), so the store does not grow.
    """

    def __init__(self, store: StoreClient, rank: int, world_size: int, timeout: float = 300.0) -> None:
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self._seq = 0

    def _exchange(self, payload: bytes) -> list[bytes]:
        # Every collective is a full exchange (a broadcast's receivers publish an empty ack): a rank publishing for
        # collective k has read every rank's key of k - 1, so every rank has published k - 1 and thus finished
        # reading k - 2: deleting one's own key of k - 2 is safe.
        seq = self._seq
        self._seq += 1
        if seq >= 2:
            self.store.delete(f"coll/{seq - 2}/{self.rank}")
        self.store.set(f"coll/{seq}/{self.rank}", payload)
        return [self.store.get(f"coll/{seq}/{r}", self.timeout, from_rank=r) for r in range(self.world_size)]

    def _gather_blobs(self, payload: bytes) -> list[bytes]:
        return self._exchange(payload)

    def _broadcast_bytes(self, payload: bytes, src: int) -> bytes:
        return self._exchange(payload)[src]


class MpiCommunicator(_HostCommunicator):
    """Collectives through MPI (an ``mpi4py`` communicator, e.g. ``MPI.COMM_WORLD.Dup()``) with host copies.

    Used by ``init()`` when the job was started by ``mpirun`` and ``mpi4py`` is installed (the ``mpi`` extra):
    no TCP store, no secret (MPI's own transport connects the ranks). Only MPI's buffer calls are used
    (``Allgather``, ``Allgatherv``, ``Bcast``, ``Ibarrier``), never its pickled-object ones. Sums are taken in
    rank order on every rank after an ``Allgather`` (MPI's own ``Allreduce`` may sum in a different order on
    each rank), so every rank gets identical bits, the same as :class:`StoreCommunicator`.
    """

    def __init__(self, mpi_comm: Any, timeout: float = 300.0) -> None:
        self.mpi_comm, self.timeout = mpi_comm, timeout
        self.rank, self.world_size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self._pending: list[Any] = []  # Ibarrier requests of barriers that timed out here

    def _lengths(self, n: int) -> np.ndarray:
        counts = np.empty(self.world_size, dtype=np.int64)
        self.mpi_comm.Allgather(np.array([n], dtype=np.int64), counts)
        return counts

    def _gather_blobs(self, payload: bytes) -> list[bytes]:
        counts = self._lengths(len(payload))
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        self.mpi_comm.Allgatherv(np.frombuffer(payload, dtype=np.uint8), [recv, counts])
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return [recv[offsets[r]:offsets[r + 1]].tobytes() for r in range(self.world_size)]

    def _gather_flat(self, flat: np.ndarray) -> list[np.ndarray]:
        mine = flat.view(np.uint8)  # bytes on the wire: every dtype (float16, bool) without an MPI type map
        counts = self._lengths(mine.size)
        if (counts != mine.size).any():
            raise FlowError(f"all_reduce: ranks pass {counts.tolist()} bytes of {flat.dtype}; every rank must pass "
                            "tensors of the same shapes and dtypes in the same order")
        recv = np.empty((self.world_size, mine.size), dtype=np.uint8)
        self.mpi_comm.Allgather(mine, recv)
        return [recv[r].view(flat.dtype) for r in range(self.world_size)]

    def _broadcast_bytes(self, payload: bytes, src: int) -> bytes:
        return broadcast_bytes(self.mpi_comm, payload, src)

    def barrier(self, timeout: float | None = None) -> None:
        """Wait for every rank (``Ibarrier`` polled); a FlowError after ``timeout`` seconds (MPI cannot tell which
        ranks are missing)."""
        import time

        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        # A barrier that timed out is still pending in MPI (the late ranks will match it): finish it first.
        requests = [*self._pending, self.mpi_comm.Ibarrier()]
        self._pending = []
        delay = 0.0002
        while requests:
            if requests[0].Test():
                requests.pop(0)
                continue
            if time.monotonic() >= deadline:
                self._pending = requests
                raise FlowError(f"rank {self.rank}: MPI barrier timed out after {limit:.1f} s; some of the "
                                f"{self.world_size} ranks did not reach it (dead or stuck)")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def close(self) -> None:
        """Free the communicator (MPI itself is finalised by mpi4py at exit)."""
        self.mpi_comm.Free()


def broadcast_bytes(mpi_comm: Any, payload: bytes, src: int) -> bytes:
    """Rank ``src``'s ``payload`` on every rank of ``mpi_comm`` (its length first, then the bytes: buffer
    calls only)."""
    n = np.array([len(payload)], dtype=np.int64)
    mpi_comm.Bcast(n, root=src)
    buf = np.frombuffer(payload, dtype=np.uint8).copy() if mpi_comm.Get_rank() == src else np.empty(int(n[0]),
                                                                                                   np.uint8)
    mpi_comm.Bcast(buf, root=src)
    return buf.tobytes()


class NcclCommunicator(Communicator):
    """NCCL collectives (``cupy.cuda.nccl``) on the CuPy arrays of ``cuda:`` tensors, on a dedicated stream.

    Rank 0 creates the NCCL unique id and shares it through the store (or through MPI: ``mpi_comm``, an
    mpi4py communicator, under ``mpirun``). Collectives are enqueued on
    ``self.stream`` after an event recorded on the current stream (so they see the values computed so far);
    each collective ends by making the current stream wait for it (:meth:`synchronize`), so later kernels see
    its result while the host goes on. Run on 2 GPUs by ``tests/distributed`` and ``benchmarks/data_parallel.py``
    (CI has no GPU).
    """

    _NCCL_OPS = {"sum": "NCCL_SUM", "avg": "NCCL_SUM", "max": "NCCL_MAX"}

    def __init__(self, store: StoreClient | None, rank: int, world_size: int, local_rank: int,
                 timeout: float = 300.0, mpi_comm: Any = None):
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError as e:
            raise FlowError(f"backend='nccl' needs CuPy with NCCL support (cupy.cuda.nccl): {e}; install "
                            "cupy-cudaXXx and NCCL, or use init(backend='local')") from e
        if not getattr(nccl, "available", True):
            raise FlowError("backend='nccl': this CuPy build has no NCCL; install NCCL or use backend='local'")
        visible = cupy.cuda.runtime.getDeviceCount()
        # LOCAL_WORLD_SIZE is set by our launcher and torchrun; srun and mpirun do not say (world_size may span
        # several hosts), so only this rank's own GPU is checked there.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
        if local_world > visible or local_rank >= visible:
            raise FlowError(f"rank {rank}: {local_world} ranks on this node but only {visible} GPU(s) visible "
                            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
                            f"LOCAL_RANK {local_rank} needs cuda:{local_rank}")
        self.cupy, self.nccl = cupy, nccl
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device = f"cuda:{local_rank}"
        cupy.cuda.Device(local_rank).use()
        if rank == 0:
            uid = nccl.get_unique_id()  # bytes (CuPy 14) or a tuple of ints (older CuPy)
            packed = {"bytes": bytes(uid).hex()} if isinstance(uid, bytes) else {"ints": list(uid)}
            blob = json.dumps(packed).encode()
        else:
            blob = b""
        if mpi_comm is not None:  # an mpirun launch: the id travels through MPI, no store
            blob = broadcast_bytes(mpi_comm, blob, 0)
        elif store is None:
            raise FlowError("NcclCommunicator needs a store or an MPI communicator to share NCCL's unique id")
        elif rank == 0:
            store.set("nccl/unique_id", blob)
        else:
            blob = store.get("nccl/unique_id", timeout)
        if rank != 0:
            packed = json.loads(blob)
            uid = bytes.fromhex(packed["bytes"]) if "bytes" in packed else tuple(packed["ints"])
        self.comm = nccl.NcclCommunicator(world_size, uid, rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def _array(self, tensor: Tensor) -> Any:
        _check_tensor(tensor, "NCCL collective")
        if tensor.device != self.device:
            raise FlowError(f"rank {self.rank}: NCCL collectives need tensors on {self.device}, got {tensor.device}")
        arr = tensor._backend.native(tensor._data)
        if not arr.flags.c_contiguous:
            raise FlowError("NCCL collectives need a contiguous tensor; call .contiguous() first")
        return arr

    def _dtype(self, arr: Any) -> int:
        names = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
                 "int32": "NCCL_INT32", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8", "int8": "NCCL_INT8"}
        name = names.get(str(arr.dtype))
        if name is None:
            raise FlowError(f"NCCL has no collective for dtype {arr.dtype}; supported: {sorted(names)}")
        return getattr(self.nccl, name)

    def _enter(self) -> None:
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())

    def all_reduce_coalesced(self, tensors: list[Tensor], op: str = "sum", async_op: bool = False) -> list[Tensor]:
        """One NCCL group of in-place all-reduces (no flattening copies); ``avg`` with NCCL's own average."""
        _check_op(op)
        arrays = [self._array(t) for t in tensors]
        avg = getattr(self.nccl, "NCCL_AVG", None)
        code = avg if op == "avg" and avg is not None else getattr(self.nccl, self._NCCL_OPS[op])
        self._enter()
        self.nccl.groupStart()
        try:
            for arr in arrays:
                self.comm.allReduce(arr.data.ptr, arr.data.ptr, arr.size, self._dtype(arr), code, self.stream.ptr)
        finally:
            self.nccl.groupEnd()
        if op == "avg" and avg is None:
            with self.stream:
                for arr in arrays:
                    arr /= self.world_size
        if not async_op:
            self.synchronize()
        return tensors

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        """NCCL broadcast in place from rank ``src``."""
        arr = self._array(tensor)
        self._enter()
        self.comm.broadcast(arr.data.ptr, arr.data.ptr, arr.size, self._dtype(arr), src, self.stream.ptr)
        self.synchronize()
        return tensor

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """NCCL all-gather into one buffer, returned as one tensor per rank."""
        arr = self._array(tensor)
        out = self.cupy.empty((self.world_size, *arr.shape), dtype=arr.dtype)
        self._enter()
        self.comm.allGather(arr.data.ptr, out.data.ptr, arr.size, self._dtype(arr), self.stream.ptr)
        self.synchronize()
        return [_wrap(out[r], tensor._backend) for r in range(self.world_size)]  # on the device, no host copy

    def synchronize(self) -> None:
        """Make the current stream wait for every collective enqueued so far (a device-side wait: the host
        goes on). Every collective ends with it, so work queued after a collective sees its result, as
        PyTorch's collectives are ordered with the current stream."""
        self.cupy.cuda.get_current_stream().wait_event(self.stream.record())

    def close(self) -> None:
        """Destroy the NCCL communicator."""
        self.stream.synchronize()
        self.comm.destroy()

    def abort(self) -> None:
        """Abort the NCCL communicator without waiting for pending collectives (a rank that is failing)."""
        self.comm.abort()
