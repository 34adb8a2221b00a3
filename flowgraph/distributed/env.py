"""Where a rank learns who it is: :func:`detect_environment` reads the variables launchers set.

Sources, first match wins:

1. ``flowgraph`` -- ``python -m flowgraph.distributed.run`` (it sets ``FLOWGRAPH_LAUNCHED=1`` next to the
   torchrun-style variables below, and a per-job ``FLOWGRAPH_STORE_SECRET``).
2. ``torchrun`` -- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun, or set by
   hand). torchrun's agent already listens on ``MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE=True``), so the
   store then uses ``MASTER_PORT + 1``.
3. ``mpi`` launched by ``mpirun`` (Open MPI's ``OMPI_COMM_WORLD_*``, MVAPICH's ``MV2_COMM_WORLD_*``). These come
   before Slurm: processes that ``mpirun`` starts inside an ``sbatch`` script inherit the batch step's
   ``SLURM_PROCID=0``, which is not their rank.
4. ``slurm`` -- ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; the rendezvous host is
   ``MASTER_ADDR`` or else the first host of ``SLURM_NODELIST`` (or ``SLURM_JOB_NODELIST``); the port is
   ``MASTER_PORT`` or else ``15000 + SLURM_JOB_ID % 10000`` (the default PyTorch Lightning uses), 29500 without a
   job id.
5. ``mpi`` through PMI (MPICH/Intel MPI's Hydra): ``PMI_RANK``, ``PMI_SIZE``, the local rank from
   ``MPI_LOCALRANKID`` or ``PMI_LOCAL_RANK`` when set.

A malformed or inconsistent value raises a :class:`FlowError` naming the variable.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..errors import FlowError

#: Set to ``1`` by ``python -m flowgraph.distributed.run`` in every rank's environment.
LAUNCHER_ENV = "FLOWGRAPH_LAUNCHED"
#: The port of the rendezvous store when given explicitly (wins over every launcher's ``MASTER_PORT``).
STORE_PORT_ENV = "FLOWGRAPH_STORE_PORT"
#: ``MASTER_PORT`` when no launcher variable gives one (torchrun's default).
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class DistributedEnvironment:
    """What the launcher told this process.

    ``local_rank`` is None when the launcher does not say (PMI without ``MPI_LOCALRANKID``; ``init`` then asks
    MPI). ``master_addr``/``master_port`` locate rank 0's rendezvous store; ``master_addr`` is None for a
    multi-host MPI launch without ``MASTER_ADDR`` (MPI itself is the rendezvous there). ``source`` is one of
    ``"flowgraph"``, ``"torchrun"``, ``"slurm"``, ``"mpi"``.
    """

    rank: int
    world_size: int
    local_rank: int | None
    master_addr: str | None
    master_port: int
    source: str


def _int(env: Mapping[str, str], name: str, source: str, minimum: int = 0) -> int:
    value = env.get(name)
    text = (value or "").strip()
    if not re.fullmatch(r"[+-]?\d+", text) or int(text) < minimum:
        raise FlowError(f"environment variable {name}={value!r} (read for a {source} launch) must be an integer "
                        f">= {minimum}")
    return int(text)


def _port(env: Mapping[str, str], name: str, source: str) -> int:
    port = _int(env, name, source, minimum=1)
    if port > 65535:
        raise FlowError(f"environment variable {name}={env[name]!r} (read for a {source} launch) must be a TCP "
                        "port in 1..65535")
    return port


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_host(pattern: str, variable: str) -> Iterator[str]:
    """The hosts of one comma-free entry such as ``rack[1-2]-n[01-03,7]`` (every bracket group multiplies)."""
    pieces, pos = [], 0
    for m in _GROUP.finditer(pattern):
        pieces.append([pattern[pos:m.start()]])
        choices: list[str] = []
        for part in m.group(1).split(","):
            lo, dash, hi = part.partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                raise FlowError(f"{variable}: {part!r} in {pattern!r} is not a number or a range like 01-03")
            if not dash:
                choices.append(lo)
                continue
            if int(hi) < int(lo):
                raise FlowError(f"{variable}: range {part!r} in {pattern!r} runs backwards; write {hi}-{lo}")
            width = len(lo) if lo.startswith("0") else 0  # Slurm keeps the zero padding of the range's start
            choices.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        pieces.append(choices)
        pos = m.end()
    pieces.append([pattern[pos:]])
    if any(c in "[]" for piece in pieces[::2] for c in piece[0]):
        raise FlowError(f"{variable}: unbalanced brackets in {pattern!r}")
    return ("".join(p) for p in itertools.product(*pieces))


def _split_top_level(text: str, variable: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    entries, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise FlowError(f"{variable}: nested brackets in {text!r}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise FlowError(f"{variable}: unbalanced brackets in {text!r}")
        elif c == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth:
        raise FlowError(f"{variable}: unbalanced brackets in {text!r}")
    entries.append(text[start:])
    if any(not e.strip() for e in entries):
        raise FlowError(f"{variable}: empty host name in {text!r}")
    return [e.strip() for e in entries]


def iter_hostlist(hostlist: str, variable: str = "hostlist") -> Iterator[str]:
    """The hosts of a Slurm compressed host list (``node[01-03,07],gpu5``), lazily, in order.

    Written here because the usual tool (``scontrol show hostnames``) is absent outside a Slurm installation
    and the syntax is small. ``variable`` names the source in error messages.
    """
    for entry in _split_top_level(hostlist.strip(), variable):
        yield from _expand_host(entry, variable)


def expand_hostlist(hostlist: str, variable: str = "hostlist") -> list[str]:
    """Every host of a Slurm compressed host list: ``expand_hostlist("node[01-03,07],gpu5")`` is
    ``["node01", "node02", "node03", "node07", "gpu5"]``; zero padding is kept, several bracket groups in one
    name multiply (``r[1-2]n[1-2]`` -> ``r1n1, r1n2, r2n1, r2n2``). Malformed lists raise a FlowError."""
    return list(iter_hostlist(hostlist, variable))


def _check(rank: int, world: int, local_rank: int | None, names: tuple[str, str, str], source: str) -> None:
    if rank >= world:
        raise FlowError(f"{names[0]}={rank} is not a rank of a world of {names[1]}={world} (read for a {source} "
                        f"launch); ranks run 0..{world - 1}")
    if local_rank is not None and local_rank >= world:
        raise FlowError(f"{names[2]}={local_rank} is not below {names[1]}={world} (read for a {source} launch); "
                        "a local rank counts the ranks on one host, which are fewer than all ranks")


def _from_torchrun(env: Mapping[str, str], source: str) -> DistributedEnvironment:
    rank, world = _int(env, "RANK", source), _int(env, "WORLD_SIZE", source, minimum=1)
    local = _int(env, "LOCAL_RANK", source) if "LOCAL_RANK" in env else 0 if world == 1 else None
    if local is None:
        raise FlowError(f"environment variable LOCAL_RANK is not set while RANK={rank} and WORLD_SIZE={world} are "
                        f"(read for a {source} launch); set it to this process's index on its host")
    _check(rank, world, local, ("RANK", "WORLD_SIZE", "LOCAL_RANK"), source)
    if "MASTER_PORT" not in env:
        raise FlowError(f"environment variable MASTER_PORT is not set (read for a {source} launch); export the "
                        "port of rank 0's rendezvous store, e.g. MASTER_PORT=29500")
    port = _port(env, "MASTER_PORT", source)
    if source == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        port = port + 1 if port < 65535 else port - 1  # torchrun's own store holds MASTER_PORT
    if "MASTER_ADDR" in env and not env["MASTER_ADDR"].strip():
        raise FlowError(f"environment variable MASTER_ADDR={env['MASTER_ADDR']!r} is empty (read for a {source} "
                        "launch); set it to rank 0's host name or address (127.0.0.1 for a single host)")
    return DistributedEnvironment(rank, world, local, env.get("MASTER_ADDR", "127.0.0.1"), port, source)


def _from_slurm(env: Mapping[str, str]) -> DistributedEnvironment:
    rank, world = _int(env, "SLURM_PROCID", "slurm"), _int(env, "SLURM_NTASKS", "slurm", minimum=1)
    local = _int(env, "SLURM_LOCALID", "slurm") if "SLURM_LOCALID" in env else None
    if local is None:
        raise FlowError("environment variable SLURM_LOCALID is not set while SLURM_PROCID is; start the ranks "
                        "with srun (one task per rank), which sets both")
    _check(rank, world, local, ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"), "slurm")
    addr = env.get("MASTER_ADDR")
    if not addr:
        name = next((n for n in ("SLURM_NODELIST", "SLURM_JOB_NODELIST") if env.get(n)), None)
        if name is None:
            raise FlowError("a slurm launch needs MASTER_ADDR or SLURM_NODELIST/SLURM_JOB_NODELIST to find the "
                            "host of rank 0; neither is set")
        addr = next(iter_hostlist(env[name], name))
    if "MASTER_PORT" in env:
        port = _port(env, "MASTER_PORT", "slurm")
    elif "SLURM_JOB_ID" in env:
        port = 15000 + _int(env, "SLURM_JOB_ID", "slurm") % 10000
    else:
        port = DEFAULT_PORT
    return DistributedEnvironment(rank, world, local, addr, port, "slurm")


#: (rank, size, local rank, local size) variables of the MPI launchers, in the order they are tried.
_MPI_VARIABLES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def _from_mpi(env: Mapping[str, str], names: tuple[str, str, str, str]) -> DistributedEnvironment:
    rank_n, size_n, local_n, local_size_n = names
    rank, world = _int(env, rank_n, "mpi"), _int(env, size_n, "mpi", minimum=1)
    if local_n not in env and rank_n == "PMI_RANK" and "PMI_LOCAL_RANK" in env:
        local_n = "PMI_LOCAL_RANK"
    local = _int(env, local_n, "mpi") if local_n in env else 0 if world == 1 else None
    _check(rank, world, local, (rank_n, size_n, local_n), "mpi")
    addr = env.get("MASTER_ADDR") or None
    single_host = local_size_n in env and _int(env, local_size_n, "mpi", minimum=1) == world
    if addr is None and (single_host or world == 1):
        addr = "127.0.0.1"
    port = _port(env, "MASTER_PORT", "mpi") if "MASTER_PORT" in env else DEFAULT_PORT
    return DistributedEnvironment(rank, world, local, addr, port, "mpi")


def detect_environment(environ: Mapping[str, str] | None = None) -> DistributedEnvironment:
    """Rank, world size, local rank and rendezvous address from the launcher's variables (``os.environ`` by
    default); see the module docstring for the order. ``FLOWGRAPH_STORE_PORT``, when set, overrides the port.
    Raises a :class:`FlowError` naming the variable when one is malformed or inconsistent, and listing what it
    looked for when no launcher is recognised."""
    env = os.environ if environ is None else environ
    if env.get(LAUNCHER_ENV) == "1":
        found = _from_torchrun(env, "flowgraph")
    elif "RANK" in env or "WORLD_SIZE" in env:
        found = _from_torchrun(env, "torchrun")
    elif "OMPI_COMM_WORLD_RANK" in env:
        found = _from_mpi(env, _MPI_VARIABLES[0])
    elif "MV2_COMM_WORLD_RANK" in env:
        found = _from_mpi(env, _MPI_VARIABLES[1])
    elif "SLURM_PROCID" in env:
        found = _from_slurm(env)
    elif "PMI_RANK" in env:
        found = _from_mpi(env, _MPI_VARIABLES[2])
    else:
        raise FlowError(
            "init(): no launcher found: environment variable RANK (torchrun or "
            "`python -m flowgraph.distributed.run --nproc-per-node N script.py`), SLURM_PROCID (srun), "
            "OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK or PMI_RANK (mpirun) is not set; start the script with "
            "one of these launchers or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself"
        )
    if STORE_PORT_ENV in env:
        found = DistributedEnvironment(found.rank, found.world_size, found.local_rank, found.master_addr,
                                       _port(env, STORE_PORT_ENV, found.source), found.source)
    return found
