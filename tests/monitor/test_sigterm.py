"""SIGTERM (what launchers, Slurm and Kubernetes send) ends a monitored run like Ctrl-C: status ``terminated``,
the report and the CSV written, the previous handler restored, exit status 143 and no traceback."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, time
    from flowgraph.monitor import Monitor
    with Monitor(100000, report_path=sys.argv[1], csv_path=sys.argv[2], quiet=True) as mon:
        for epoch in range(100000):
            time.sleep(0.002)
            mon.log(epoch, 0.002, {"loss": 1.0 / (epoch + 1)})
            if epoch == 20:
                print("ready", flush=True)
    print("not reached", flush=True)
""")


def test_sigterm_writes_the_report_and_csv_and_exits_143(tmp_path):
    report, table = tmp_path / "report.html", tmp_path / "run.csv"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(report), str(table)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert err == "" and out == ""  # no traceback, nothing after the block
    assert '"status":"terminated"' in report.read_text().replace(" ", "")
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) > 20
    assert [int(r["epoch"]) for r in rows] == list(range(1, len(rows) + 1))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the spool is gone


def test_the_previous_handler_is_restored():
    from flowgraph.monitor import Monitor

    before = signal.getsignal(signal.SIGTERM)
    with Monitor(1, quiet=True) as mon:
        assert signal.getsignal(signal.SIGTERM) is not before
        mon.log(0, 0.1, {"loss": 1.0})
    assert signal.getsignal(signal.SIGTERM) is before
    assert mon.status == "completed"


def test_a_handler_of_the_program_is_left_alone():
    from flowgraph.monitor import Monitor

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with Monitor(1, quiet=True):
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_terminated_is_not_swallowed_by_except_exception():
    from flowgraph.monitor.monitor import Terminated

    with pytest.raises(SystemExit) as caught:
        try:
            raise Terminated()
        except Exception:  # noqa: BLE001 - what a training loop may do
            pytest.fail("except Exception caught SIGTERM's exception")
    assert caught.value.code == 143


def test_no_handler_outside_the_main_thread():
    import threading

    from flowgraph.monitor import Monitor

    seen = []

    def run():
        with Monitor(1, quiet=True) as mon:
            seen.append(signal.getsignal(signal.SIGTERM))
            mon.log(0, 0.1, {"loss": 1.0})

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]
