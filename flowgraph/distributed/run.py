"""The launcher: ``python -m flowgraph.distributed.run --nproc-per-node N [options] train.py args...``.

It starts one process per local rank with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, the job's ``FLOWGRAPH_STORE_SECRET`` and ``FLOWGRAPH_LAUNCHED=1`` (how
``init()`` tells it from torchrun, whose variables are the same) in the environment (``CUDA_VISIBLE_DEVICES``
is left untouched: rank ``i`` uses ``cuda:LOCAL_RANK``), waits for them, and when one exits non-zero terminates
the others (SIGTERM, then SIGKILL after ``--kill-timeout`` seconds) and exits with that child's code and a
message naming the rank.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flowgraph.distributed.run", description=__doc__.split("\n")[0])
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes (ranks) on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node-rank", type=int, default=0, help="index of this node, 0..nnodes-1")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of the node hosting rank 0 (the store)")
    p.add_argument("--master-port", type=int, default=29500, help="port of the store on the master node")
    p.add_argument("--kill-timeout", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the other ranks")
    p.add_argument("--bind-cores", action="store_true",
                   help="give each local rank its own share of this node's physical cores (Linux; a core's "
                        "hyperthreads stay with one rank), so no two ranks' Python threads share a core")
    p.add_argument("-m", "--module", action="store_true",
                   help="run `script` as a module (python -m script), as torchrun's -m does")
    p.add_argument("script", help="the training script (a module name with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def _core_of(cpu: int) -> str:
    """The physical core CPU ``cpu`` belongs to, as the kernel lists its hyperthreads ("0,16")."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read().strip()
    except OSError:
        return f"cpu{cpu}"


def core_shares(nproc: int, cpus: Sequence[int] | None = None) -> list[list[int]]:
    """This node's usable CPUs (``cpus``, default this process's affinity) split into ``nproc`` shares of whole
    physical cores (a core's hyperthreads, read from ``/sys/devices/system/cpu``, go to one share), in core
    order: share ``r`` is local rank ``r``'s. A CPU whose topology is unreadable is a core of its own."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    cores: dict[str, list[int]] = {}
    for cpu in cpus:
        cores.setdefault(_core_of(cpu), []).append(cpu)
    groups = list(cores.values())
    if len(groups) < nproc:
        raise ValueError(f"--bind-cores: {nproc} ranks but only {len(groups)} physical cores usable here")
    per, extra = divmod(len(groups), nproc)
    shares, start = [], 0
    for r in range(nproc):
        n = per + (r < extra)
        shares.append(sorted(c for g in groups[start:start + n] for c in g))
        start += n
    return shares


def launch(script: str, args: Sequence[str] = (), nproc_per_node: int = 1, nnodes: int = 1, node_rank: int = 0,
           master_addr: str = "127.0.0.1", master_port: int = 29500, kill_timeout: float = 10.0,
           module: bool = False, bind_cores: bool = False) -> int:
    """Run ``script`` in ``nproc_per_node`` processes and return the exit code (0 when all ranks succeeded).

    With ``module=True`` ``script`` is a module name run as ``python -m script``. With ``bind_cores=True`` each
    local rank runs on its own share of the physical cores (:func:`core_shares`; Linux only).
    """
    if nproc_per_node < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        print(f"flowgraph.distributed.run: need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < "
              f"--nnodes; got {nproc_per_node}, {nnodes}, {node_rank}", file=sys.stderr)
        return 2
    world = nproc_per_node * nnodes
    secret = os.environ.get("FLOWGRAPH_STORE_SECRET")
    if secret is None:
        if nnodes > 1 and master_addr not in ("127.0.0.1", "localhost", "::1"):
            print("flowgraph.distributed.run: a multi-host job needs FLOWGRAPH_STORE_SECRET (the same hex string on "
                  "every host, e.g. python -c 'import secrets; print(secrets.token_hex(32))')", file=sys.stderr)
            return 2
        secret = secrets.token_hex(32)  # one per job: only its ranks can use the store
    shares = None
    if bind_cores:
        if not hasattr(os, "sched_setaffinity"):
            print("flowgraph.distributed.run: --bind-cores needs Linux (os.sched_setaffinity)", file=sys.stderr)
            return 2
        try:
            shares = core_shares(nproc_per_node)
        except ValueError as e:
            print(f"flowgraph.distributed.run: {e}", file=sys.stderr)
            return 2
    procs: dict[int, subprocess.Popen] = {}
    for local in range(nproc_per_node):
        rank = node_rank * nproc_per_node + local
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(nproc_per_node), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                   FLOWGRAPH_STORE_SECRET=secret, FLOWGRAPH_LAUNCHED="1")
        target = ["-m", script] if module else [script]
        pin = None if shares is None else functools.partial(os.sched_setaffinity, 0, shares[local])
        procs[rank] = subprocess.Popen([sys.executable, *target, *args], env=env, preexec_fn=pin)
    failed: tuple[int, int] | None = None
    try:
        while procs and failed is None:
            for rank, proc in list(procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                del procs[rank]
                if code != 0:
                    failed = (rank, code)
                    break
            time.sleep(0.05)
    except KeyboardInterrupt:
        failed = (-1, 130)
    if failed is None:
        return 0
    rank, code = failed
    stopped = sorted(procs)
    for proc in procs.values():
        proc.terminate()
    deadline = time.monotonic() + kill_timeout
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    what = "interrupted" if rank < 0 else f"rank {rank} exited with code {code}"
    print(f"flowgraph.distributed.run: {what}; terminated ranks {stopped}", file=sys.stderr)
    return code if code > 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    a = _parser().parse_args(argv)
    return launch(a.script, a.args, a.nproc_per_node, a.nnodes, a.node_rank, a.master_addr, a.master_port,
                  a.kill_timeout, module=a.module, bind_cores=a.bind_cores)


if __name__ == "__main__":
    sys.exit(main())
