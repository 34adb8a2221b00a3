"""The terminal dashboard: the SSE client against a real dashboard server (late join, Last-Event-ID
reconnection through a proxy that cuts the stream), the rendered view for a known history, Monitor(tui=True)
and the ``python -m flowgraph.monitor.tui`` program."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("rich")

from flowgraph.errors import FlowError  # noqa: E402
from flowgraph.monitor import Monitor  # noqa: E402
from flowgraph.monitor.sse_client import EventSource, SSEParser, events_url  # noqa: E402
from flowgraph.monitor.tui import DashboardState, attach, render_text, sparkline  # noqa: E402

from .conftest import metrics_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------- the parser
def test_parser_follows_the_sse_rules():
    p = SSEParser()
    lines = ["retry: 1500", "", ": ping", "id: 7", "event: epoch", 'data: {"epoch":', "data: 8}", "",
             "event: meta", "data: not json", "", "id: 9", "", "data: x", "event: complete", ""]
    events = list(p.feed(lines))
    assert [(e.event, e.data, e.id) for e in events] == [
        ("epoch", {"epoch": 8}, "7"), ("meta", "not json", None), ("complete", "x", None)]
    assert p.retry_ms == 1500 and p.last_event_id == "9"  # an id alone updates the last id, dispatches nothing


def test_events_url_accepts_the_dashboard_address():
    assert events_url("http://127.0.0.1:3000") == "http://127.0.0.1:3000/events"
    assert events_url("http://127.0.0.1:3000/events/") == "http://127.0.0.1:3000/events"
    with pytest.raises(FlowError, match="http://127.0.0.1:3000"):
        events_url("localhost:3000")


# ---------------------------------------------------------------------- against a real server
def _log_later(mon: Monitor, epochs: range, delay: float = 0.3) -> threading.Thread:
    def run():
        time.sleep(delay)
        for epoch in epochs:
            mon.log(epoch, 0.01, metrics_for(epoch))
        mon.finish(keep_serving=True)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_late_attach_gets_every_past_epoch_once_then_live_ones(served):
    mon = served(8)
    for epoch in range(5):
        mon.log(epoch, 0.01, metrics_for(epoch))
    thread = _log_later(mon, range(5, 8))
    source = EventSource(mon.url, timeout=10)
    events = list(source)
    thread.join()
    assert events[0].event == "meta" and events[-1].event == "complete"
    epochs = [e for e in events if e.event == "epoch"]
    assert [e.data["epoch"] for e in epochs] == list(range(1, 9))
    assert [e.id for e in epochs] == [str(i) for i in range(8)]
    assert source.connections == 1 and source.completed


class CuttingProxy:
    """A TCP proxy in front of the dashboard whose connections the test can cut, recording each request head."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.heads: list[bytes] = []
        self.socks: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            with self.lock:
                self.socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, request: bool) -> None:
        first = True
        try:
            while data := src.recv(65536):
                if request and first:
                    self.heads.append(data)
                    first = False
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Reset every open connection (as a dropped network would)."""
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_reconnection_resumes_with_last_event_id(served):
    mon = served(6)
    for epoch in range(3):
        mon.log(epoch, 0.01, metrics_for(epoch))
    proxy = CuttingProxy(mon.port)
    statuses: list[str] = []
    source = EventSource(f"http://127.0.0.1:{proxy.port}", timeout=10, retry_ms=50, on_status=statuses.append)
    received = []
    try:
        for event in source:
            received.append(event)
            if event.event == "epoch" and event.id == "2" and source.connections == 1:
                proxy.cut()  # the stream breaks after epoch id 2; the rest is logged while we are away
                for epoch in range(3, 6):
                    mon.log(epoch, 0.01, metrics_for(epoch))
                mon.finish(keep_serving=True)
    finally:
        proxy.close()
    assert source.connections == 2
    assert b"last-event-id: 2" in proxy.heads[1].lower()
    assert b"last-event-id" not in proxy.heads[0].lower()
    epochs = [e.data["epoch"] for e in received if e.event == "epoch"]
    assert epochs == [1, 2, 3, 4, 5, 6]  # none lost, none repeated
    assert received[-1].event == "complete"
    assert statuses == ["connected", "reconnecting", "connected"]


def test_give_up_when_nothing_listens():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there
    source = EventSource(f"http://127.0.0.1:{port}", timeout=1, give_up_after=0.2, retry_ms=50)
    with pytest.raises(FlowError, match="cannot reach the dashboard"):
        list(source)


# ---------------------------------------------------------------------- the view
def _known_state() -> DashboardState:
    state = DashboardState()
    state.apply("meta", {"title": "demo", "total": 10, "status": "running"})
    for i in range(6):
        state.apply("epoch", {
            "epoch": i + 1, "total": 10, "seconds": 0.5, "eta": 0.5 * (9 - i),
            "metrics": {"loss": [1.0, 0.5, 0.4, 0.3, 0.25, 0.2][i], "acc": 0.5 + 0.05 * i, "gap": None},
            "resources": {"cpu": 37.0, "ram_used": 3 * 2**30, "ram_total": 16 * 2**30},
        })
    return state


def test_render_text_for_a_known_history():
    state = _known_state()
    state.apply("epoch", dict(state.epochs[2]))  # an epoch seen again is not drawn twice
    lines = [line.rstrip() for line in render_text(state, 80).splitlines()]
    assert lines == [
        "demo  running",
        "epoch 6/10  ██████████████████░░░░░░░░░░░░  elapsed 3.00s  ETA 2s",
        "metric    last     min     max  curve (6 epochs)",
        "loss    0.2000  0.2000  1.0000  █▄▃▂▁▁",
        "acc     0.7500  0.5000  0.7500  ▁▂▄▅▇█",
        "gap        nan       -       -",
        "cpu 37%  ram 3.0GiB/16.0GiB",
    ]
    state.apply("complete", {"status": "completed", "epochs": 6, "total": 10, "elapsed": 3.2,
                             "mean_epoch_seconds": 0.5, "final_metrics": {}})
    lines = [line.rstrip() for line in render_text(state, 80).splitlines()]
    assert lines[0] == "demo  completed"
    assert lines[1] == "epoch 6/10  ██████████████████░░░░░░░░░░░░  elapsed 3.20s"
    assert lines[-1] == "completed after 6/10 epochs in 3.20s (0.50s/epoch)"


def test_reconnecting_is_shown():
    state = _known_state()
    state.connection = "reconnecting"
    assert render_text(state, 80).splitlines()[0].rstrip() == "demo  running, reconnecting"


def test_sparkline_scales_buckets_and_gaps():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], 8) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0, 2.0], 5) == "▄▄▄"
    assert sparkline([1.0, None, 3.0], 5) == "▁ █"
    assert sparkline(list(range(100)), 4) == "▁▃▆█"  # bucket means 12, 37, 62, 87
    assert sparkline([], 4) == ""


# ---------------------------------------------------------------------- in the training process
def test_monitor_tui_draws_the_view_instead_of_epoch_lines(make_monitor):
    out = io.StringIO()
    mon = make_monitor(3, quiet=False, tui=True, stream=out, progress_bar=True)
    for epoch in range(3):
        mon.log(epoch, 0.01, {"loss": 1.0 / (epoch + 1)})
    mon.finish()
    text = out.getvalue()
    assert "epoch 1/3 loss" not in text  # no per-epoch console lines
    assert "metric" in text and "loss    0.3333  0.3333  1.0000  █▃▁" in text
    assert "completed after 3/3 epochs" in text


def test_monitor_tui_argument_errors():
    with pytest.raises(FlowError, match="tui must be True or False"):
        Monitor(3, tui="yes")
    with pytest.raises(FlowError, match="quiet=True prints nothing; choose one"):
        Monitor(3, tui=True, quiet=True)


# ---------------------------------------------------------------------- the program
def test_attach_draws_until_complete(served):
    mon = served(4)
    for epoch in range(2):
        mon.log(epoch, 0.01, {"loss": 1.0 / (epoch + 1)})
    thread = _log_later(mon, range(2, 4))
    out = io.StringIO()
    final = attach(mon.url, stream=out)
    thread.join()
    assert final is not None and final["epochs"] == 4
    assert "completed after 4/4 epochs" in out.getvalue()


def test_python_m_tui_exits_after_complete(served):
    mon = served(3)
    for epoch in range(3):
        mon.log(epoch, 0.01, {"loss": 1.0 / (epoch + 1)})
    mon.finish(keep_serving=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="80")
    done = subprocess.run([sys.executable, "-m", "flowgraph.monitor.tui", mon.url], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "epoch 3/3" in done.stdout and "completed after 3/3 epochs" in done.stdout
