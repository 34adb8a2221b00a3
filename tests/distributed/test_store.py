"""The TCP store: values across processes, timeouts that name the key and rank, barriers naming missing ranks."""

import subprocess
import sys
import time

import pytest

from flowgraph.distributed.store import StoreClient, StoreServer, barrier
from flowgraph.errors import FlowError


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def _run_child(code: str, port: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code.format(port=port)], capture_output=True, text=True, timeout=30)


def test_set_get_across_processes(server):
    child = ("from flowgraph.distributed.store import StoreClient\n"
             "c = StoreClient('127.0.0.1', {port}, rank=1)\n"
             "c.set('uid', bytes(range(256)) * 100)\n"
             "print(c.get('reply', timeout=20).decode())\n")
    proc = subprocess.Popen([sys.executable, "-c", child.format(port=server.port)], stdout=subprocess.PIPE, text=True)
    client = StoreClient("127.0.0.1", server.port, rank=0)
    assert client.get("uid", timeout=20) == bytes(range(256)) * 100
    client.set("reply", b"hello rank 1")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and out.strip() == "hello rank 1"
    assert client.add("counter", 2) == 2 and client.add("counter", 3) == 5
    assert client.delete("uid") and client.try_get("uid") is None
    client.close()


def test_get_timeout_names_key_and_rank(server):
    client = StoreClient("127.0.0.1", server.port, rank=3)
    t0 = time.monotonic()
    with pytest.raises(FlowError, match=r"rank 3: timed out after 0\.3 s waiting for store key 'never/set'"):
        client.get("never/set", timeout=0.3)
    assert time.monotonic() - t0 < 5
    with pytest.raises(FlowError, match=r"\['b'\]"):
        client.set("a", b"1")
        client.wait(["a", "b"], timeout=0.2)
    with pytest.raises(FlowError, match="needs bytes"):
        client.set("a", "text")
    client.close()


def test_connect_timeout_is_a_flow_error():
    closed = StoreServer("127.0.0.1", 0)
    port = closed.port
    closed.close()
    with pytest.raises(FlowError, match="rank 2: cannot reach the store"):
        StoreClient("127.0.0.1", port, rank=2, connect_timeout=0.3)


def test_barrier_names_missing_and_dead_ranks(server):
    c0 = StoreClient("127.0.0.1", server.port, rank=0)
    # rank 2 starts beating, then dies; rank 1 never starts.
    child = ("import os, time\n"
             "from flowgraph.distributed.store import Heartbeat\n"
             "Heartbeat('127.0.0.1', {port}, 2, interval=0.1)\n"
             "time.sleep(0.2)\n"
             "os._exit(0)\n")
    assert _run_child(child, server.port).returncode == 0
    time.sleep(0.4)
    with pytest.raises(FlowError) as err:
        barrier(c0, 0, 3, "b0", timeout=0.3, stale_after=0.3)
    msg = str(err.value)
    assert "barrier 'b0' timed out" in msg
    assert "rank 1 (no heartbeat" in msg
    assert "rank 2 (last heartbeat" in msg and "presumed dead" in msg
    assert "rank 0" not in msg.split("missing:")[1]
    c0.close()


def test_barrier_passes_when_all_arrive(server):
    child = ("from flowgraph.distributed.store import StoreClient, barrier\n"
             "c = StoreClient('127.0.0.1', {port}, rank=1)\n"
             "barrier(c, 1, 2, 'x', timeout=20)\n")
    proc = subprocess.Popen([sys.executable, "-c", child.format(port=server.port)])
    c0 = StoreClient("127.0.0.1", server.port, rank=0)
    barrier(c0, 0, 2, "x", timeout=20)
    assert proc.wait(timeout=20) == 0
    c0.close()
