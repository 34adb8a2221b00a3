"""Launching without flowgraph's launcher: torchrun-style variables, Slurm, MPI (``detect_environment``,
``expand_hostlist``), the store's secret for those launches, and 2-process DataParallel training started by plain
processes, by ``mpirun`` (MPI transport) and by torchrun."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph.distributed import StoreClient, detect_environment, expand_hostlist
from flowgraph.errors import FlowError

from ._util import free_port

HERE = Path(__file__).parent
SECRET = "cd" * 32
#: Every variable detect_environment reads: cleared so the machine running the tests cannot leak into them.
LAUNCH_VARIABLES = (
    "FLOWGRAPH_LAUNCHED", "FLOWGRAPH_STORE_PORT", "FLOWGRAPH_STORE_SECRET", "FLOWGRAPH_MPI", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent.parent), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---- Slurm host lists -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hostlist, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("gpu5", ["gpu5"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),  # the zero padding of the start is kept
    ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),  # several groups multiply
    ("a,b[7],c-[0009-0010]x", ["a", "b7", "c-0009x", "c-0010x"]),
    (" login1 ", ["login1"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist, message", [
    ("n[1-3", "unbalanced brackets"),
    ("n1-3]", "unbalanced brackets"),
    ("n[[1]]", "nested brackets"),
    ("n[3-1]", "runs backwards; write 1-3"),
    ("n[a-b]", "'a-b' in 'n\\[a-b\\]' is not a number"),
    ("n[1-]", "is not a number or a range"),
    ("a,,b", "empty host name"),
    ("", "empty host name"),
])
def test_expand_hostlist_rejects_malformed_lists(hostlist, message):
    with pytest.raises(FlowError, match=r"SLURM_NODELIST: .*" + message):
        expand_hostlist(hostlist, "SLURM_NODELIST")


# ---- detect_environment -----------------------------------------------------------------------------------------

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29400"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[07-08,11],cpu1",
         "SLURM_JOB_ID": "123456"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize("env, expected", [
    (dict(TORCHRUN, FLOWGRAPH_LAUNCHED="1"), (3, 4, 1, "10.0.0.2", 29400, "flowgraph")),
    (TORCHRUN, (3, 4, 1, "10.0.0.2", 29400, "torchrun")),
    # torchrun's agent holds MASTER_PORT with its own store: ours takes the next port
    (dict(TORCHRUN, TORCHELASTIC_USE_AGENT_STORE="True"), (3, 4, 1, "10.0.0.2", 29401, "torchrun")),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1234"}, (0, 1, 0, "127.0.0.1", 1234, "torchrun")),
    # the first host of the node list; the port 15000 + job id % 10000
    (SLURM, (5, 8, 1, "gpu07", 18456, "slurm")),
    (dict(SLURM, MASTER_ADDR="head", MASTER_PORT="4000"), (5, 8, 1, "head", 4000, "slurm")),
    ({k: v for k, v in SLURM.items() if k not in ("SLURM_NODELIST", "SLURM_JOB_ID")}
     | {"SLURM_JOB_NODELIST": "a[3-4]"}, (5, 8, 1, "a3", 29500, "slurm")),
    (OMPI, (1, 2, 1, "127.0.0.1", 29500, "mpi")),  # one host: the store on loopback
    (dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="1"), (1, 2, 1, None, 29500, "mpi")),  # several hosts, no MASTER_ADDR
    (dict(OMPI, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0"), (1, 2, 1, "127.0.0.1", 29500, "mpi")),
    ({"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "3", "MV2_COMM_WORLD_LOCAL_RANK": "0",
      "MASTER_ADDR": "h0", "MASTER_PORT": "7000"}, (2, 3, 0, "h0", 7000, "mpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (1, 2, 1, "127.0.0.1", 29500, "mpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2, None, None, 29500, "mpi")),  # init asks MPI for the local rank
    (dict(SLURM, PMI_RANK="5", PMI_SIZE="8"), (5, 8, 1, "gpu07", 18456, "slurm")),  # srun --mpi=pmi2
    (dict(TORCHRUN, **SLURM), (3, 4, 1, "10.0.0.2", 29400, "torchrun")),  # torchrun inside a Slurm job
    (dict(TORCHRUN, FLOWGRAPH_STORE_PORT="5555"), (3, 4, 1, "10.0.0.2", 5555, "torchrun")),
], ids=["flowgraph", "torchrun", "torchrun-agent-store", "torchrun-defaults", "slurm", "slurm-master",
        "slurm-job-nodelist", "openmpi", "openmpi-hosts", "mpirun-in-sbatch", "mvapich", "pmi", "pmi-no-local",
        "srun-pmi2", "torchrun-in-slurm", "store-port"])
def test_detect_environment(env, expected):
    found = detect_environment(env)
    assert (found.rank, found.world_size, found.local_rank, found.master_addr, found.master_port,
            found.source) == expected


@pytest.mark.parametrize("env, message", [
    ({}, "no launcher found: environment variable RANK"),
    (dict(TORCHRUN, RANK="x"), "environment variable RANK='x' .*torchrun.* must be an integer >= 0"),
    (dict(TORCHRUN, RANK="4"), "RANK=4 is not a rank of a world of WORLD_SIZE=4"),
    (dict(TORCHRUN, WORLD_SIZE="0"), "WORLD_SIZE='0' .* must be an integer >= 1"),
    (dict(TORCHRUN, LOCAL_RANK="-1"), "LOCAL_RANK='-1' .* must be an integer >= 0"),
    (dict(TORCHRUN, LOCAL_RANK="4"), "LOCAL_RANK=4 is not below WORLD_SIZE=4"),
    ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, "LOCAL_RANK is not set"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, "MASTER_PORT is not set"),
    (dict(TORCHRUN, MASTER_PORT="70000"), "MASTER_PORT='70000' .* TCP port in 1..65535"),
    (dict(TORCHRUN, FLOWGRAPH_STORE_PORT="port"), "FLOWGRAPH_STORE_PORT='port'"),
    ({"WORLD_SIZE": "2"}, "environment variable RANK=None"),
    (dict(SLURM, SLURM_PROCID="8"), "SLURM_PROCID=8 is not a rank of a world of SLURM_NTASKS=8"),
    (dict(SLURM, SLURM_NTASKS="two"), "SLURM_NTASKS='two' .*slurm"),
    (dict(SLURM, SLURM_NODELIST="gpu[07-"), "SLURM_NODELIST: unbalanced brackets"),
    (dict(SLURM, SLURM_JOB_ID="abc"), "SLURM_JOB_ID='abc'"),
    ({k: v for k, v in SLURM.items() if k != "SLURM_NODELIST"}, "needs MASTER_ADDR or SLURM_NODELIST"),
    ({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID is not set"),
    (dict(OMPI, OMPI_COMM_WORLD_RANK="2"), "OMPI_COMM_WORLD_RANK=2 is not a rank of a world of "
                                          "OMPI_COMM_WORLD_SIZE=2"),
    (dict(OMPI, OMPI_COMM_WORLD_LOCAL_RANK="1.5"), "OMPI_COMM_WORLD_LOCAL_RANK='1.5'"),
    ({"PMI_RANK": "0", "PMI_SIZE": ""}, "PMI_SIZE='' .*mpi"),
])
def test_detect_environment_names_the_bad_variable(env, message):
    with pytest.raises(FlowError, match=message):
        detect_environment(env)


# ---- the store's secret for launches not made by our launcher ----------------------------------------------------

@pytest.mark.parametrize("env, hint", [
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "29999"}, "torchrun"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "MASTER_ADDR": "127.0.0.1"}, "slurm"),
    (dict(OMPI, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0", FLOWGRAPH_MPI="0"), "mpi4py"),
])
def test_other_launchers_need_the_secret_exported(no_launcher, env, hint):
    for k, v in env.items():
        no_launcher.setenv(k, v)
    with pytest.raises(FlowError, match="FLOWGRAPH_STORE_SECRET is not set.*export FLOWGRAPH_STORE_SECRET=") as e:
        dist.init(backend="local", timeout=5)
    assert hint in str(e.value)
    assert not dist.is_initialized()


def test_a_world_of_one_needs_no_export_and_its_store_is_still_authenticated(no_launcher):
    """One rank has nobody to share a secret with: init makes one in-process; a client without it is refused."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())}.items():
        no_launcher.setenv(k, v)
    dist.init(backend="local", timeout=5)
    try:
        port = dist.get_communicator().store.port
        for secret in (b"", bytes.fromhex(SECRET)):
            with pytest.raises(FlowError, match="refused this process"):
                StoreClient("127.0.0.1", port, rank=1, connect_timeout=5, secret=secret)
        assert dist.all_reduce(fg.tensor([1.5])).tolist() == [1.5]
    finally:
        dist.destroy()


def test_a_multi_host_mpi_launch_without_mpi4py_needs_master_addr(no_launcher):
    for k, v in dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="1", FLOWGRAPH_MPI="0", FLOWGRAPH_STORE_SECRET=SECRET).items():
        no_launcher.setenv(k, v)
    with pytest.raises(FlowError, match="spans several hosts and MASTER_ADDR is not set"):
        dist.init(backend="local", timeout=5)


def test_torchrun_agent_store_port_is_left_alone(no_launcher):
    """Under torchrun the agent listens on MASTER_PORT: init's store takes MASTER_PORT + 1 and works."""
    with socket.socket() as agent:  # stands in for torchrun's agent store
        agent.bind(("127.0.0.1", 0))
        agent.listen(1)
        port = agent.getsockname()[1]
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
                     "FLOWGRAPH_STORE_SECRET": SECRET}.items():
            no_launcher.setenv(k, v)
        dist.init(backend="local", timeout=5)
        try:
            assert (dist.get_world_size(), dist.get_rank(), dist.get_local_rank()) == (1, 0, 0)
            assert dist.all_reduce(fg.tensor([2.0, 3.0])).tolist() == [2.0, 3.0]
            assert dist.get_communicator().store.port == port + 1
        finally:
            dist.destroy()


# ---- real processes ---------------------------------------------------------------------------------------------

def _check_results(out: Path, source: str, transport: str) -> None:
    for rank in (0, 1):
        worst, gathered = (out.parent / f"{out.name}.{rank}").read_text().split(" ", 1)
        assert float(worst) <= 1e-6, f"rank {rank}: max |dp - single| = {worst}"
        assert gathered.strip() == "[0.0, 1.0]"
        assert (out.parent / f"{out.name}.{rank}.info").read_text().split() == [source, transport, str(rank)]


def test_torchrun_variables_with_plain_processes(tmp_path):
    """No launcher: two processes started by hand with RANK/WORLD_SIZE/... and the exported secret train as one
    process on the full batch (the DataParallel worker of test_data_parallel.py)."""
    port, out = free_port(), tmp_path / "res"
    procs = [subprocess.Popen([sys.executable, str(HERE / "_dp_worker.py"), str(out), "local"], cwd=HERE,
                              env=_clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                             MASTER_PORT=str(port), FLOWGRAPH_STORE_SECRET=SECRET),
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        errors = [p.communicate(timeout=60)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errors)
    _check_results(out, "torchrun", "StoreCommunicator")


def test_plain_processes_without_the_secret_fail_saying_what_to_export(tmp_path):
    res = subprocess.run([sys.executable, str(HERE / "_dp_worker.py"), str(tmp_path / "res"), "local"], cwd=HERE,
                         env=_clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                        MASTER_PORT=str(free_port())),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "FLOWGRAPH_STORE_SECRET is not set" in res.stderr and "export FLOWGRAPH_STORE_SECRET=" in res.stderr


MPIRUN = shutil.which("mpirun")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY,
                               reason=f"needs mpirun (apt openmpi-bin) and mpi4py (the mpi extra): "
                                      f"mpirun {'found' if MPIRUN else 'absent'}, "
                                      f"mpi4py {'found' if HAVE_MPI4PY else 'absent'}")


def _mpirun(args: list[str], env: dict[str, str], n: int = 2) -> subprocess.CompletedProcess:
    cmd = [MPIRUN, "-n", str(n)]
    if "Open MPI" in subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout:
        cmd += ["--allow-run-as-root", "--oversubscribe"]  # CI runs as root on 2 cores
        # containers often forbid the cross-process memory copy (CMA) Open MPI's shared-memory transport tries
        env = dict(env, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    return subprocess.run([*cmd, sys.executable, *args], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=60)


@needs_mpi
@pytest.mark.parametrize("transport", ["MpiCommunicator", "StoreCommunicator"])
def test_mpirun_data_parallel_matches_single_process(tmp_path, transport):
    """``mpirun -n 2 python _dp_worker.py``: with mpi4py MPI carries the collectives (no store, no secret);
    with ``FLOWGRAPH_MPI=0`` the same launch uses the store and needs the exported secret."""
    extra = {} if transport == "MpiCommunicator" else {"FLOWGRAPH_MPI": "0", "FLOWGRAPH_STORE_SECRET": SECRET,
                                                       "MASTER_PORT": str(free_port())}
    res = _mpirun([str(HERE / "_dp_worker.py"), str(tmp_path / "res"), "local"], _clean_env(**extra))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    _check_results(tmp_path / "res", "mpi", transport)


@needs_mpi
def test_mpi_communicator_collectives(tmp_path):
    """3 ranks (so the summation order shows in the bits): float32 sums taken in rank order on every rank, three
    dtypes coalesced, max/avg, broadcast from rank 1, all_gather, shape mismatches reported, and a barrier that
    times out while the other ranks sleep."""
    res = _mpirun([str(HERE / "_mpi_coll_worker.py"), str(tmp_path / "res")], _clean_env(), n=3)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    for rank in (0, 1, 2):
        assert (tmp_path / f"res.{rank}").read_text() == "ok", f"rank {rank}"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch's torchrun")
def test_torchrun_launch(tmp_path):
    """``python -m torch.distributed.run --nproc-per-node 2``: the worker's store sits next to the agent's."""
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), str(HERE / "_dp_worker.py"), str(tmp_path / "res"), "local"], cwd=HERE,
                         env=_clean_env(FLOWGRAPH_STORE_SECRET=SECRET, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_results(tmp_path / "res", "torchrun", "StoreCommunicator")


@needs_mpi
def test_mpirun_jit_sync_batchnorm_and_no_sync_over_mpi(tmp_path):
    """The other 2-rank workers of test_data_parallel.py over MpiCommunicator: 12 jitted Adam steps equal eager
    ones (the recorded collectives run on every replay), SyncBatchNorm equals one process on the whole batch,
    and no_sync accumulation equals one big batch."""
    env = _clean_env()
    for worker in ("_jit_dp_worker.py", "_syncbn_worker.py", "_no_sync_worker.py"):
        res = _mpirun([str(HERE / worker), str(tmp_path / worker), "local"], env)
        assert res.returncode == 0, (worker, (res.stdout + res.stderr)[-3000:])
    for rank in (0, 1):
        assert float((tmp_path / f"_jit_dp_worker.py.{rank}").read_text()) <= 1e-5
        synced, local = (float(v) for v in (tmp_path / f"_syncbn_worker.py.{rank}").read_text().split())
        assert synced <= 1e-5 and local > 1e-3, (synced, local)
        no_sync, toggle, was_local = (tmp_path / f"_no_sync_worker.py.{rank}").read_text().split()
        assert float(no_sync) <= 1e-6 and float(toggle) <= 1e-6 and was_local == "1"
