"""SIGTERM (what launchers, Slurm and Kubernetes send) ends a monitored run like Ctrl-C: status ``terminated``,
the report written, the previous handler restored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import sys, time
    from flowgraph.monitor import Monitor
    with Monitor(1000, report_path=sys.argv[1], quiet=True) as mon:
        print("ready", flush=True)
        for epoch in range(1000):
            time.sleep(0.01)
            mon.log(epoch, 0.01, {"loss": 1.0 / (epoch + 1)})
    print("after", mon.status, flush=True)
""")


def test_sigterm_ends_the_run_with_a_report(tmp_path):
    report = tmp_path / "report.html"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(report)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # the Terminated exception still ends the process, after the report
    assert report.exists() and "terminated" in report.read_text()
    assert "Terminated" in err


def test_the_previous_handler_is_restored():
    from flowgraph.monitor import Monitor

    before = signal.getsignal(signal.SIGTERM)
    with Monitor(1, quiet=True) as mon:
        assert signal.getsignal(signal.SIGTERM) is not before
        mon.log(0, 0.1, {"loss": 1.0})
    assert signal.getsignal(signal.SIGTERM) is before
    assert mon.status == "completed"
