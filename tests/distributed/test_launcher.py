"""The launcher: environment of each rank, and a failing rank stopping the others."""

import os
import subprocess
import sys
import time

import pytest

from ._util import free_port

_ENV_SCRIPT = """
import os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
with open(sys.argv[1] + "." + os.environ["RANK"], "w") as f:
    f.write(" ".join(os.environ[k] for k in keys) + " " + " ".join(sys.argv[2:]))
"""

_FAIL_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
with open(sys.argv[1] + "." + str(rank), "w") as f:
    f.write(str(os.getpid()))
if rank == 1:
    time.sleep(0.5)
    sys.exit(3)
time.sleep(120)
"""


def _launch(tmp_path, script: str, *args: str, nproc: int = 2, extra=()):
    path = tmp_path / "script.py"
    path.write_text(script)
    cmd = [sys.executable, "-m", "flowgraph.distributed.run", "--nproc-per-node", str(nproc), *extra,
           "--master-port", str(free_port()), str(path), str(tmp_path / "out"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_ranks_get_their_environment(tmp_path):
    res = _launch(tmp_path, _ENV_SCRIPT, "--lr", "0.1", nproc=2, extra=("--nnodes", "2", "--node-rank", "1"))
    assert res.returncode == 0, res.stderr
    for local in range(2):
        rank = 2 + local
        fields = (tmp_path / f"out.{rank}").read_text().split()
        assert fields[:4] == [str(rank), str(local), "4", "2"]
        assert fields[4] == "127.0.0.1" and fields[6:] == ["--lr", "0.1"]


def test_failing_rank_terminates_the_others(tmp_path):
    t0 = time.monotonic()
    res = _launch(tmp_path, _FAIL_SCRIPT, nproc=3)
    elapsed = time.monotonic() - t0
    assert res.returncode == 3
    assert "rank 1 exited with code 3" in res.stderr and "terminated ranks [0, 2]" in res.stderr
    assert elapsed < 30
    for rank in (0, 2):
        pid = int((tmp_path / f"out.{rank}").read_text())
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"rank {rank} (pid {pid}) still running"


def test_bad_arguments_exit_2(tmp_path):
    res = _launch(tmp_path, _ENV_SCRIPT, nproc=0)
    assert res.returncode == 2 and "--nproc-per-node >= 1" in res.stderr


def test_module_mode_runs_python_dash_m(tmp_path):
    pkg = tmp_path / "fgdist_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "worker.py").write_text(_ENV_SCRIPT)
    cmd = [sys.executable, "-m", "flowgraph.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), "-m", "fgdist_probe.worker", str(tmp_path / "out"), "x"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    for rank in range(2):
        fields = (tmp_path / f"out.{rank}").read_text().split()
        assert fields[0] == str(rank) and fields[-1] == "x"


def test_core_shares_give_each_rank_whole_physical_cores(monkeypatch):
    from flowgraph.distributed import run

    # 8 CPUs, hyperthread pairs (i, i + 4) as many cloud hosts number them
    monkeypatch.setattr(run, "_core_of", lambda cpu: f"{cpu % 4},{cpu % 4 + 4}")
    assert run.core_shares(2, range(8)) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert run.core_shares(3, range(8)) == [[0, 1, 4, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="5 ranks but only 4 physical cores"):
        run.core_shares(5, range(8))


def test_bind_cores_pins_each_rank(tmp_path):
    script = tmp_path / "aff.py"
    script.write_text("import os\n"
                      "open(os.path.join(os.path.dirname(__file__), 'aff.' + os.environ['LOCAL_RANK']), 'w').write("
                      "','.join(map(str, sorted(os.sched_getaffinity(0)))))\n")
    n = min(2, len(os.sched_getaffinity(0)))
    res = subprocess.run([sys.executable, "-m", "flowgraph.distributed.run", "--nproc-per-node", str(n), "--bind-cores",
                          "--master-port", str(free_port()), str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    from flowgraph.distributed.run import core_shares

    for r, share in enumerate(core_shares(n)):
        assert (tmp_path / f"aff.{r}").read_text() == ",".join(map(str, share))
