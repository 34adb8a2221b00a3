"""What a connection may hold, and how the server lets go of misbehaving clients: quietly (nothing in the
training console), at once (the socket is closed, not left ESTABLISHED), without waiting on them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time

import httpx
import psutil
import pytest

from flowgraph.monitor.hub import EventHub
from flowgraph.monitor.server import (
    DashboardServer,
    Limits,
    LiveFeed,
    StreamTracker,
    bind_socket,
    build_app,
)

from .conftest import sse_events

BIG = {f"layer{i:04d}.block.attention.some_rather_long_metric_name": i / 7 for i in range(600)}  # ~40 KB


@pytest.fixture
def quiet_console(caplog, capfd):
    """Yields; afterwards, nothing at WARNING or above was logged and nothing was printed to stderr."""
    caplog.set_level(logging.DEBUG)
    yield caplog
    loud = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []
    assert capfd.readouterr().err == ""


def start_server(hub: EventHub, limits: Limits) -> DashboardServer:
    tracker, feed = StreamTracker(), LiveFeed(hub, limits)
    app = build_app(hub, lambda: None, "127.0.0.1", tracker=tracker, feed=feed)
    server = DashboardServer(app, bind_socket("127.0.0.1", 0), "127.0.0.1", limits=limits, tracker=tracker,
                             feed=feed)
    server.start()
    return server


def established_server_side(port: int) -> int:
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def stalled_client(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, before connecting
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


def wait_for(condition, limit: int = 400) -> bool:
    for _ in range(limit):
        if condition():
            return True
        time.sleep(0.025)
    return False


def test_a_stalled_client_is_dropped_after_the_send_timeout_quietly_and_its_socket_closed(quiet_console):
    hub = EventHub()
    server = start_server(hub, Limits(send_timeout=0.5, max_lag=10**9))
    stalled = stalled_client(server.port)
    try:
        for epoch in range(400):  # ~16 MB: more than the socket buffers hold
            hub.publish_epoch({"epoch": epoch + 1, "metrics": BIG})
            if server.stats()["dropped"]:
                break
            time.sleep(0.002)
        assert wait_for(lambda: server.stats()["dropped"] == 1)
        assert wait_for(lambda: server.stats()["connections"] == 0)
        assert established_server_side(server.port) == 0
        assert server.stats()["open_streams"] == 0
    finally:
        stalled.close()
        hub.close()
        server.stop()


def test_finish_with_a_stalled_client_drops_it_and_prints_nothing(served, quiet_console):
    mon = served(100, client_queue_size=10**9)  # never dropped for lag: only the end of the run lets it go
    stalled = stalled_client(mon.port)
    try:
        for epoch in range(100):
            mon.log(epoch, 0.001, BIG)
        assert wait_for(lambda: mon._server.stats()["open_streams"] == 1)
        server = mon._server
        mon.finish()  # lingers at most `stall` for it, drops it, stops the server
        assert server.stats()["dropped"] == 1
        assert not server.running
        assert established_server_side(server.port) == 0
    finally:
        stalled.close()


def test_slow_header_connections_cannot_lock_out_a_browser(quiet_console):
    hub = EventHub()
    hub.publish_meta({"status": "running"})
    server = start_server(hub, Limits(header_timeout=1.0, max_connections=16))
    slow = []
    try:
        for _ in range(40):  # more than the cap: the longest-waiting ones make room
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /api/meta HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            slow.append(sock)
        assert wait_for(lambda: server.connection_count <= 16)
        response = httpx.get(f"http://127.0.0.1:{server.port}/api/meta", timeout=10)
        assert response.status_code == 200 and response.json() == {"status": "running"}
        assert wait_for(lambda: server.connection_count == 0)  # the header timeout closed the rest
        closed = 0
        for sock in slow:
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == 40
    finally:
        for sock in slow:
            sock.close()
        hub.close()
        server.stop()


def test_oversized_and_invalid_requests_are_refused_without_a_log_line(quiet_console):
    hub = EventHub()
    server = start_server(hub, Limits())
    try:
        huge = {"X-Big": "a" * (32 * 1024)}
        assert httpx.get(f"http://127.0.0.1:{server.port}/api/meta", headers=huge, timeout=10).status_code == 431
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            answer = b""
            try:  # a head that grows past h11's limit while incomplete: refused, the connection closed
                sock.sendall(b"GET / HTTP/1.1\r\n")
                for _ in range(40):
                    sock.sendall(b"X-Pad: " + b"b" * 1000 + b"\r\n")
                    time.sleep(0.005)
                answer = sock.recv(100)
            except (ConnectionResetError, BrokenPipeError):
                pass
            assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
        assert wait_for(lambda: server.connection_count == 0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"HELLO THERE\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        hub.close()
        server.stop()


def test_a_browser_that_drops_out_near_the_end_resumes_and_gets_the_tail(served, quiet_console):
    mon = served(40)
    received: list[int] = []
    last_id = None
    with httpx.Client(timeout=10) as client:
        with client.stream("GET", mon.url + "/events") as response:
            events = sse_events(response)
            for epoch in range(30):
                mon.log(epoch, 0.001, {"loss": 1.0})
            for event in events:
                if event.event == "epoch":
                    received.append(event.data["epoch"])
                    last_id = event.id
                    if len(received) == 30:
                        break  # the connection drops here
        for epoch in range(30, 40):
            mon.log(epoch, 0.001, {"loss": 1.0})
        server, url = mon._server, mon.url
        finisher = threading.Thread(target=mon.finish)
        finisher.start()  # complete is published; the server stays up for the browser it owes
        with client.stream("GET", url + "/events", headers={"Last-Event-ID": last_id}) as response:
            tail = list(sse_events(response))
    finisher.join(20)
    assert not finisher.is_alive()
    received += [e.data["epoch"] for e in tail if e.event == "epoch"]
    assert received == list(range(1, 41))
    assert tail[-1].event == "complete" and tail[-1].data["status"] == "completed"
    assert not server.running


def test_many_connect_and_leave_clients_leave_nothing_behind(served, quiet_console):
    mon = served(1000)
    for epoch in range(300):
        mon.log(epoch, 0.001, {"loss": 1.0, "acc": 0.5})
    port = mon.port
    fds_before = len(psutil.Process().open_files()) + len(psutil.Process().net_connections("tcp"))
    for i in range(60):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            if i % 2:
                sock.recv(2048)
    assert wait_for(lambda: mon._server.stats()["connections"] == 0 and mon._server.stats()["readers"] == 0)
    stats = mon._server.stats()
    assert stats["open_streams"] == 0 and stats["request_tasks"] == 0
    fds_after = len(psutil.Process().open_files()) + len(psutil.Process().net_connections("tcp"))
    assert fds_after <= fds_before


def test_an_idle_stream_gets_pings(quiet_console):
    hub = EventHub()
    limits = Limits(write_interval=0.05)
    tracker, feed = StreamTracker(), LiveFeed(hub, limits, ping=0.2)
    app = build_app(hub, lambda: None, "127.0.0.1", tracker=tracker, feed=feed)
    server = DashboardServer(app, bind_socket("127.0.0.1", 0), "127.0.0.1", limits=limits, tracker=tracker,
                             feed=feed)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(f"GET /events HTTP/1.0\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
            received = b""
            while received.count(b": ping") < 3:
                chunk = sock.recv(4096)
                assert chunk, "the stream ended"
                received += chunk
        assert b"event: epoch" not in received
    finally:
        hub.close()
        server.stop()


def test_an_epoch_published_before_the_feed_first_runs_still_wakes_a_waiting_stream():
    """The race a late client hit under load: its stream joined the feed (which starts the feed's task), read
    the hub and began waiting; the training thread published before the task's first step ran. The task's
    baseline version is the one at join, so that epoch counts as new and wakes the stream at the next
    look, not at the next ping (15 s by default: past a client's read timeout)."""

    async def scenario() -> bool:
        hub = EventHub()
        feed = LiveFeed(hub, Limits(write_interval=0.01), ping=60.0)
        reader = feed.join(None, -1)  # schedules the feed's task; it has not run yet
        version = hub.read(reader.cursor).version
        waiting = feed.changed(version)
        waited_on = waiting.send(None)  # the stream is now waiting, still before the feed's first step
        hub.publish_epoch({"epoch": 1})  # the training thread, meanwhile
        for _ in range(200):  # the feed looks every 10 ms
            await asyncio.sleep(0.01)
            if waited_on.done():
                break
        woke = waited_on.done()
        with contextlib.suppress(StopIteration):
            waiting.send(None)
        feed.leave(reader)
        return woke

    assert asyncio.run(scenario())
