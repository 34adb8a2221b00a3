"""A client that leaves while being sent a long history is noticed after one write: its stream ends, no
more of the history goes to the dead socket, and asyncio prints no "socket.send() raised exception." lines."""

from __future__ import annotations

import logging
import socket
import time

import pytest

pytest.importorskip("uvicorn")


def test_a_client_leaving_mid_history_stays_quiet_and_is_let_go(caplog):
    from flowgraph.monitor import Monitor

    mon = Monitor(20000, quiet=True, history_limit=40000)
    mon._sampler.sample = lambda device=None: {}
    for epoch in range(20000):
        mon.log(epoch, 0.001, {"loss": 1.0 / (epoch + 1), "acc": 0.5})
    url = mon.serve(port=0)
    host, port = url.split("//")[1].split(":")
    caplog.set_level(logging.DEBUG)
    try:
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(f"GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                sock.recv(4096)  # the stream started; leave now
        for _ in range(200):
            stats = mon._server.stats()
            if stats["open_streams"] == 0 and stats["connections"] == 0:
                break
            time.sleep(0.02)
        assert stats["open_streams"] == 0 and stats["readers"] == 0 and stats["connections"] == 0
        assert stats["streams_served"] == 3
    finally:
        mon.finish()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], f"{len(loud)} warnings reached the console after three clients left"
