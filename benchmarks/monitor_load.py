"""The monitor's dashboard server under load: rapid connect/disconnects and concurrent clients while training.

    python benchmarks/monitor_load.py                        # 1,000 connects, 50 clients, 300 epochs, 3 rounds
    python benchmarks/monitor_load.py --connects 200 --epochs 120 --rounds 1 --json out.json
    python benchmarks/monitor_load.py --memory 1000000       # memory held after 1M epochs of 40 metrics

Training runs in a child process whose stdout and stderr are the training console: a NumPy workload of
``--step-ms`` per epoch and ``Monitor(quiet=False, progress_bar=False)`` serving on 127.0.0.1 (port 0), 40
metrics per epoch. This process drives the load with asyncio sockets, on 127.0.0.1 only, with bounded counts
and timeouts, so it always stops by itself:

* ``--connects`` rapid connect/disconnects, 20 at a time, cycling through five ways of leaving: connect and
  close; send ``GET /events`` and close; read the first bytes and close; read and reset (RST) in the middle
  of the history; close in the middle of the request head;
* ``--clients`` dashboard clients (``GET /events``), half connected before the first epoch, half joining
  during the run, each reading to ``complete`` and resuming with ``Last-Event-ID`` if its connection drops.

Each round trains twice with the same epochs: serving with no client (the baseline), then under load; the
ratio of the median epoch times is printed (goal < 1.05). Also printed: lines in the training console other
than the monitor's own (goal 0), clients that received every epoch exactly once (goal all), and once the
clients left: open connections and streams, file descriptors and event-loop tasks against the baseline,
and the RSS change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

HOST = "127.0.0.1"
METRICS = 40
STORM_PARALLEL = 20
EPOCH_LINE = re.compile(r"^epoch +\d+/\d+ ")
DEADLINE = 300.0  # seconds: every wait below gives up after this


# ---------------------------------------------------------------------------------------------- the child


def _workload(steps: int) -> float:
    """``steps`` small NumPy steps, like a small model's training loop (Python-heavy); returns a checksum."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64))
    w = rng.standard_normal((64, 64)) * 0.1
    for _ in range(steps):
        x = np.tanh(a @ w)
        w -= 1e-3 * (a.T @ x)
    return float(w[0, 0])


def _server_counts(mon: Any) -> dict[str, int]:
    counts = dict(mon._server.stats()) if mon._server is not None else {}
    counts["fds"] = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1
    return counts


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def child(epochs: int, steps: int, stats_path: str) -> None:
    """Train ``epochs`` epochs with a serving monitor; stdin says ``go`` (start) and ``done`` (clients left)."""
    from flowgraph.monitor import Monitor

    names = [f"block{i:02d}.loss" for i in range(METRICS)]
    mon = Monitor(epochs, quiet=False, progress_bar=False)
    mon.serve(port=0)  # prints "dashboard: http://127.0.0.1:PORT" into the console
    _workload(steps)  # warm up
    baseline = _server_counts(mon)
    baseline_rss = _rss()
    with open(stats_path + ".ready", "w", encoding="utf-8"):
        pass  # the baseline is taken: clients may connect
    sys.stdin.readline()  # go
    times, stamps = [], []
    for epoch in range(epochs):
        start = time.perf_counter()
        value = _workload(steps)
        seconds = time.perf_counter() - start
        mon.log(epoch, seconds, {name: value + i for i, name in enumerate(names)})
        times.append(time.perf_counter() - start)
        stamps.append(time.time())
    mon.finish(keep_serving=True)
    sys.stdin.readline()  # done: every client has its `complete` or left
    waited = 0.0
    while waited < 30 and (_server_counts(mon)["connections"] or _server_counts(mon)["open_streams"]):
        time.sleep(0.05)
        waited += 0.05
    end = _server_counts(mon)
    end_rss = _rss()
    import psutil

    main_id = threading.get_native_id()
    cpu = {"main": 0.0, "other_threads": 0.0}
    for thread in psutil.Process().threads():
        cpu["main" if thread.id == main_id else "other_threads"] += thread.user_time + thread.system_time
    stats = {"times": times, "stamps": stamps, "baseline": baseline, "end": end, "baseline_rss": baseline_rss,
             "end_rss": end_rss, "cpu": cpu}
    with open(stats_path, "w", encoding="utf-8") as handle:
        json.dump(stats, handle)
    mon.close()


# ---------------------------------------------------------------------------------------------- the load


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    status = await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass
    return status


async def dashboard_client(port: int, delay: float, received: list[tuple[int, int]]) -> dict[str, Any]:
    """Follow /events like a browser until ``complete``: (id, epoch) of each epoch into ``received``."""
    await asyncio.sleep(delay)
    last_id: str | None = None
    connections = 0
    while connections < 50:
        connections += 1
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        try:
            resume = f"Last-Event-ID: {last_id}\r\n" if last_id is not None else ""
            writer.write(f"GET /events HTTP/1.0\r\nHost: {HOST}:{port}\r\n{resume}\r\n".encode())
            if not (await _read_head(reader)).startswith(b"HTTP/1.1 200"):
                continue
            event, data, event_id = "message", [], None
            while True:
                line = await reader.readline()
                if not line:
                    break  # the server ended the stream without `complete`: resume
                text = line.decode().rstrip("\r\n")
                if text == "":
                    if data and event == "epoch":
                        received.append((int(event_id or -1), json.loads("\n".join(data))["epoch"]))
                        last_id = event_id
                    elif data and event == "complete":
                        return {"connections": connections, "complete": json.loads("\n".join(data))}
                    event, data, event_id = "message", [], None
                elif not text.startswith(":"):
                    field, _, value = text.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        event = value
                    elif field == "data":
                        data.append(value)
                    elif field == "id":
                        event_id = value
        except OSError:
            pass  # reset: resume
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return {"connections": connections, "complete": None}


async def rapid_connect(port: int, index: int) -> bool:
    """Connect and leave at once, in one of five ways (see the module text); True when it connected."""
    mode = index % 5
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return False
    try:
        request = f"GET /events HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
        if mode == 1:
            writer.write(request)
        elif mode in (2, 3):
            writer.write(request)
            await asyncio.wait_for(reader.read(2048), 10)
            if mode == 3:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif mode == 4:
            writer.write(request[:20])
            await writer.drain()
    except (TimeoutError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return True


async def storm(port: int, count: int) -> dict[str, float]:
    """``count`` rapid connects, ``STORM_PARALLEL`` at a time."""
    gate = asyncio.Semaphore(STORM_PARALLEL)

    async def one(index: int) -> bool:
        async with gate:
            return await rapid_connect(port, index)

    start = time.time()
    results = await asyncio.gather(*(one(i) for i in range(count)))
    return {"connected": sum(results), "start": start, "end": time.time()}


async def load(port: int, go: Any, clients: int, connects: int, run_seconds: float) -> dict[str, Any]:
    """Half the clients connect, training starts (``go()``), the storm and the other half run alongside."""
    early = clients // 2
    streams: list[list[tuple[int, int]]] = [[] for _ in range(clients)]
    early_tasks = [asyncio.create_task(dashboard_client(port, 0.0, streams[i])) for i in range(early)]
    await asyncio.sleep(0.5)  # let them connect
    go()
    late_tasks = [
        asyncio.create_task(dashboard_client(port, run_seconds * (i + 1) / (clients - early + 1), streams[early + i]))
        for i in range(clients - early)
    ]
    storm_result = await storm(port, connects)
    outcomes = await asyncio.wait_for(asyncio.gather(*early_tasks, *late_tasks), DEADLINE)
    return {"streams": streams, "outcomes": outcomes, "storm": storm_result}


# ---------------------------------------------------------------------------------------------- one run


def _drain(pipe: Any, lines: list[str], seen: threading.Event | None = None) -> None:
    for line in pipe:
        lines.append(line.rstrip("\n"))
        if seen is not None and line.startswith("dashboard: "):
            seen.set()


def run_once(
    epochs: int, steps: int, *, clients: int = 0, connects: int = 0, step_s: float = 0.02, pin: bool = False
) -> dict[str, Any]:
    """Train in a child, under load when ``clients`` or ``connects``; the child's stats plus what was seen.

    ``pin``: the child runs on CPU 0 and this process on the others, as if the clients were elsewhere.
    """
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = os.path.join(tmp, "stats.json")
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", str(epochs), str(steps), stats_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        if pin and len(affinity) > 1:
            first = min(affinity)
            os.sched_setaffinity(proc.pid, {first})
            os.sched_setaffinity(0, affinity - {first})
        out: list[str] = []
        err: list[str] = []
        served = threading.Event()
        readers = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, err, served), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            waited = 0.0
            while not os.path.exists(stats_path + ".ready") and proc.poll() is None and waited < 60:
                time.sleep(0.02)
                waited += 0.02
            if not served.wait(1) or not os.path.exists(stats_path + ".ready"):
                raise RuntimeError(f"the child did not start serving: {err}")
            port = int(next(line for line in err if line.startswith("dashboard: ")).rsplit(":", 1)[1])

            def go() -> None:
                proc.stdin.write("go\n")
                proc.stdin.flush()

            seen: dict[str, Any] = {}
            if clients or connects:
                before = time.process_time()
                seen = asyncio.run(load(port, go, clients, connects, epochs * step_s))
                seen["load_cpu"] = time.process_time() - before
            else:
                go()
            proc.stdin.write("done\n")
            proc.stdin.flush()
            proc.wait(DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if pin and len(affinity) > 1:
                os.sched_setaffinity(0, affinity)
        for reader in readers:
            reader.join(10)
        if not os.path.exists(stats_path):
            raise RuntimeError(f"the child failed (status {proc.returncode}): " + "\n".join(err + out))
        with open(stats_path, encoding="utf-8") as handle:
            stats = json.load(handle)
    console = err + out
    stats["returncode"] = proc.returncode
    stats["console"] = console
    stats["other_lines"] = [
        line for line in console
        if not (line.startswith("dashboard: ") or EPOCH_LINE.match(line) or line.startswith("training completed"))
    ]
    stats.update(seen)
    return stats


def summary(run: dict[str, Any], epochs: int, base: dict[str, Any]) -> dict[str, Any]:
    """One run's figures, epoch times as ratios to ``base``'s."""
    storm = run.get("storm") or {"connected": 0, "start": 0.0, "end": 0.0}
    streams = run.get("streams") or []
    return {
        "median_ms": statistics.median(run["times"]) * 1000,
        "ratio_median": statistics.median(run["times"]) / statistics.median(base["times"]),
        "ratio_mean": statistics.fmean(run["times"]) / statistics.fmean(base["times"]),
        "connected": storm["connected"],
        "storm_seconds": storm["end"] - storm["start"],
        "clients_every_epoch_once": sum(every_epoch_once(s, epochs) for s in streams),
        "reconnections": sum(o["connections"] - 1 for o in run.get("outcomes") or []),
        "console_other_lines": len(run["other_lines"]),
        "baseline_counts": run["baseline"],
        "end_counts": run["end"],
        "rss_change_mb": (run["end_rss"] - run["baseline_rss"]) / 2**20,
        "returncode": run["returncode"],
        "cpu": run["cpu"],
        "load_cpu": run.get("load_cpu", 0.0),
    }


def every_epoch_once(stream: list[tuple[int, int]], epochs: int) -> bool:
    """True when a client's (id, epoch) pairs are exactly the epochs 1..epochs in order, ids 0..epochs-1."""
    return stream == [(i, i + 1) for i in range(epochs)]


def calibrate(step_s: float) -> int:
    """Workload steps that take about ``step_s`` seconds here."""
    steps = 200
    _workload(steps)  # imports NumPy, warms caches
    start = time.perf_counter()
    _workload(steps)
    per_step = (time.perf_counter() - start) / steps
    return max(1, int(step_s / per_step))


# ---------------------------------------------------------------------------------------------- memory


def memory(epochs: int) -> dict[str, float]:
    """RSS growth and epochs held after ``epochs`` epochs of 40 metrics (no server, resources off)."""
    import psutil

    from flowgraph.monitor import Monitor

    mon = Monitor(epochs, quiet=True)
    mon._sampler.sample = lambda device=None: {}  # psutil sampling dominates log(); it holds no history
    names = [f"block{i:02d}.loss" for i in range(METRICS)]
    process = psutil.Process()
    mon.log(0, 0.1, dict.fromkeys(names, 0.5))
    before = process.memory_info().rss
    start = time.perf_counter()
    for epoch in range(1, epochs):
        mon.log(epoch, 0.1, {name: 1.0 / (epoch + i) for i, name in enumerate(names)})
    seconds = time.perf_counter() - start
    return {"epochs": epochs, "rss_growth_mb": (process.memory_info().rss - before) / 2**20,
            "held": len(mon._hub.epoch_messages()), "us_per_log": seconds / epochs * 1e6}


# ---------------------------------------------------------------------------------------------- main


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=20.0, help="workload per epoch (default 20 ms)")
    parser.add_argument("--connects", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", type=int, default=0, help="also measure memory after this many epochs")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="training child on one CPU, load generator on the others (default: on)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    results: dict[str, Any] = {"args": vars(args), "rounds": []}
    if args.memory:
        held = memory(args.memory)
        results["memory"] = held
        print(f"memory: {held['epochs']:,} epochs of {METRICS} metrics -> RSS +{held['rss_growth_mb']:.1f} MiB, "
              f"{held['held']:,} epochs held, {held['us_per_log']:.0f} us per log()")
    steps = calibrate(args.step_ms / 1000)
    results["load_average_before"] = _load_average()
    print(f"load average before: {results['load_average_before']} (the ratios mean something on a quiet machine "
          "only: other processes on the training CPU move them far more than the server does)")
    for round_number in range(args.rounds):
        base = run_once(args.epochs, steps, pin=args.pin)
        clients_only = run_once(args.epochs, steps, clients=args.clients, step_s=args.step_ms / 1000, pin=args.pin)
        loaded = run_once(args.epochs, steps, clients=args.clients, connects=args.connects,
                          step_s=args.step_ms / 1000, pin=args.pin)
        row = {"baseline": summary(base, args.epochs, base),
               "clients": summary(clients_only, args.epochs, base),
               "clients_and_connects": summary(loaded, args.epochs, base)}
        results["rounds"].append(row)
        print(f"round {round_number + 1}: median epoch {row['baseline']['median_ms']:.2f} ms serving with no client")
        for name, label in (("clients", f"{args.clients} clients"),
                            ("clients_and_connects", f"{args.clients} clients + {args.connects} rapid connects")):
            r = row[name]
            print(f"  {label}: median {r['median_ms']:.2f} ms (ratio {r['ratio_median']:.3f}), mean ratio "
                  f"{r['ratio_mean']:.3f}; {r['clients_every_epoch_once']}/{args.clients} clients got every epoch "
                  f"exactly once ({r['reconnections']} reconnections); {r['connected']} connects in "
                  f"{r['storm_seconds']:.1f}s; {r['console_other_lines']} other console lines")
            print(f"    after the clients left: {r['end_counts']} (before: {r['baseline_counts']}), "
                  f"RSS {r['rss_change_mb']:+.1f} MiB; CPU s: training thread {r['cpu']['main']:.2f}, server "
                  f"{r['cpu']['other_threads']:.2f}, load generator {r['load_cpu']:.2f}")
    results["load_average_after"] = _load_average()
    print(f"load average after: {results['load_average_after']}")
    for name in ("clients", "clients_and_connects"):
        ratios = [r[name]["ratio_median"] for r in results["rounds"]]
        means = [r[name]["ratio_mean"] for r in results["rounds"]]
        if ratios:
            results[f"{name}_ratio"] = statistics.median(ratios)
            print(f"epoch time, {name.replace('_', ' ')} / no client: median ratio {statistics.median(ratios):.3f}, "
                  f"mean ratio {statistics.median(means):.3f} (medians over {len(ratios)} rounds; goal < 1.05)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
