"""A client that leaves during the history snapshot is noticed: no flood of asyncio send warnings."""

from __future__ import annotations

import logging
import socket
import time

import pytest

pytest.importorskip("uvicorn")


def test_a_client_leaving_mid_snapshot_stays_quiet(caplog):
    from flowgraph.monitor import Monitor

    mon = Monitor(20000, quiet=True)
    for epoch in range(20000):
        mon.log(epoch, 0.001, {"loss": 1.0 / (epoch + 1), "acc": 0.5})
    url = mon.serve(port=0)
    host, port = url.split("//")[1].split(":")
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(f"GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                sock.recv(4096)  # the stream started; leave now
        time.sleep(1.5)
    finally:
        mon.finish()
    flood = [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert flood == [], f"{len(flood)} asyncio send warnings reached the console after three clients left"
