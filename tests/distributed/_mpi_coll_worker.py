"""Run under ``mpirun -n 3`` by test_launch_env.py: MpiCommunicator's collectives checked against NumPy.

``python _mpi_coll_worker.py OUT`` writes ``OUT.<rank>`` with ``ok`` or the first failure.
"""

import sys
import time

import numpy as np

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph.errors import FlowError


def check(out_path: str) -> str:
    dist.init(backend="local", timeout=30)
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = dist.get_communicator()
    assert isinstance(comm, dist.MpiCommunicator), type(comm).__name__
    rng = [np.random.default_rng(r) for r in range(world)]
    values = [g.standard_normal(1000).astype(np.float32) * 1e3 for g in rng]
    expected = values[0].copy()
    for v in values[1:]:
        expected += v  # rank order: the bits every rank must get
    backwards = values[-1].copy()
    for v in values[-2::-1]:
        backwards += v
    assert world < 3 or backwards.tobytes() != expected.tobytes(), "the data cannot tell summation orders apart"
    a, b = fg.tensor(values[rank]), fg.tensor(np.arange(6, dtype=np.int64).reshape(2, 3) * (rank + 1))
    h = fg.tensor(np.full(3, 0.5 + rank, dtype=np.float16))
    comm.all_reduce_coalesced([a, b, h], "sum")  # three dtypes in one call
    assert a.detach().numpy().tobytes() == expected.tobytes(), "float32 sum differs from the rank-ordered sum"
    assert b.tolist() == (np.arange(6).reshape(2, 3) * (world * (world + 1) // 2)).tolist(), b.tolist()
    assert h.tolist() == [world * world / 2] * 3, h.tolist()  # sum of 0.5 + r
    m = dist.all_reduce(fg.tensor([float(rank), -float(rank)]), "max")
    assert m.tolist() == [world - 1.0, 0.0], m.tolist()
    avg = dist.all_reduce(fg.tensor([2.0 * rank, 4.0]), "avg")
    assert avg.tolist() == [world - 1.0, 4.0], avg.tolist()
    x = dist.broadcast(fg.tensor([[float(rank)] * 2] * 3), src=1)
    assert x.tolist() == [[1.0, 1.0]] * 3, x.tolist()
    gathered = dist.all_gather(fg.tensor(np.full((2, 2), rank, dtype=np.int32)))
    assert [g.tolist() for g in gathered] == [[[r, r], [r, r]] for r in range(world)]
    try:
        dist.broadcast(fg.zeros(3 if rank == 0 else 4), src=0)
        assert rank == 0, "a shape mismatch in broadcast was not reported"
    except FlowError as e:
        assert rank != 0 and "shapes must match" in str(e), str(e)
    try:
        dist.all_gather(fg.zeros(2 + rank))
        raise AssertionError("a shape mismatch in all_gather was not reported")
    except FlowError as e:
        assert "differs in shape or dtype" in str(e), str(e)
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(timeout=0.3)
            raise AssertionError("the barrier did not time out while the other ranks slept")
        except FlowError as e:
            assert "MPI barrier timed out after 0.3 s" in str(e) and time.monotonic() - t0 < 1.0, str(e)
    else:
        time.sleep(1.0)
        dist.barrier()  # matches rank 0's timed-out barrier, which rank 0 finishes in destroy's
    assert h.dtype == fg.float16
    dist.destroy()
    return "ok"


if __name__ == "__main__":
    out = sys.argv[1]
    try:
        result = check(out)
    except BaseException as e:  # written so the test shows what failed on which rank
        result = f"{type(e).__name__}: {e}"
    from mpi4py import MPI

    with open(f"{out}.{MPI.COMM_WORLD.Get_rank()}", "w") as f:
        f.write(result)
    if result != "ok":
        MPI.COMM_WORLD.Abort(1)  # the other ranks may wait in a collective this rank will never join
