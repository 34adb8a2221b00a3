"""The goal of issue #19, checked by counts: rapid connect/disconnects and 50 concurrent dashboard clients
while training print nothing into the training console, leave no connection, task or file descriptor
behind, and every client receives every epoch exactly once.

Training runs in a child process (its stdout and stderr are the console); the load comes from this one,
on 127.0.0.1 only, bounded in count and time (``benchmarks/monitor_load.py`` holds both sides and measures
the epoch time, which tests never assert on).
"""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
load = pytest.importorskip("benchmarks.monitor_load")


def check(run: dict, epochs: int, clients: int, connects: int) -> None:
    assert run["returncode"] == 0
    assert run["other_lines"] == []  # nothing but the monitor's own lines
    assert len(run["console"]) == 1 + epochs + 1  # "dashboard: ...", one line per epoch, the summary
    assert run["storm"]["connected"] == connects
    assert len(run["streams"]) == clients
    assert [load.every_epoch_once(stream, epochs) for stream in run["streams"]] == [True] * clients
    before, after = run["baseline"], run["end"]
    assert after["connections"] == 0 and after["open_streams"] == 0 and after["readers"] == 0
    assert after["request_tasks"] == 0
    assert after["loop_tasks"] == before["loop_tasks"]
    assert after["fds"] == before["fds"]
    assert after["streams_served"] >= clients
    assert (run["end_rss"] - run["baseline_rss"]) < 32 * 2**20  # the history grew; nothing else is held


def test_200_connects_and_50_clients_while_training():
    steps = load.calibrate(0.01)
    run = load.run_once(80, steps, clients=50, connects=200, step_s=0.01)
    check(run, 80, 50, 200)


@pytest.mark.slow
def test_1000_connects_and_50_clients_while_training():
    steps = load.calibrate(0.02)
    run = load.run_once(200, steps, clients=50, connects=1000, step_s=0.02)
    check(run, 200, 50, 1000)
