"""The rendezvous store admits only processes of the job: a wrong or missing secret can neither read nor write
a key, and a silent peer cannot stall the ranks."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import flowgraph as fg
from flowgraph.distributed.store import HANDSHAKE_TIMEOUT, StoreClient, StoreServer

SECRET = bytes.fromhex("aa" * 32)


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0, secret=SECRET)
    yield s
    s.close()


def test_the_right_secret_reads_and_writes(server):
    c = StoreClient("127.0.0.1", server.port, rank=0, connect_timeout=5, secret=SECRET)
    c.set("grad/0", b"\x01\x02")
    assert c.try_get("grad/0") == b"\x01\x02"
    c.close()


@pytest.mark.parametrize("secret", [b"", bytes.fromhex("bb" * 32)], ids=["no secret", "wrong secret"])
def test_a_foreign_client_is_refused(server, secret):
    owner = StoreClient("127.0.0.1", server.port, rank=0, connect_timeout=5, secret=SECRET)
    owner.set("grad/0", b"secret gradients")
    with pytest.raises(fg.FlowError, match="refused this process"):
        StoreClient("127.0.0.1", server.port, rank=9, connect_timeout=5, secret=secret)
    # a raw client that skips the handshake and sends a request gets nothing back
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.recv(64)  # the nonce
        raw.sendall(b"\x00\x00\x00\x01G\x00\x00\x00\x06grad/0\x00\x00\x00\x00")
        raw.settimeout(HANDSHAKE_TIMEOUT + 2)
        try:
            answer = raw.recv(64)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # closed without an answer
    assert owner.try_get("grad/0") == b"secret gradients"  # untouched
    owner.close()


def test_a_silent_peer_does_not_stall_the_job(server):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # connects, never answers
    try:
        t0 = time.monotonic()
        c = StoreClient("127.0.0.1", server.port, rank=1, connect_timeout=5, secret=SECRET)
        done = threading.Event()

        def work():
            for i in range(50):
                c.set(f"k{i}", b"v")
                assert c.try_get(f"k{i}") == b"v"
            done.set()

        threading.Thread(target=work, daemon=True).start()
        assert done.wait(5) and time.monotonic() - t0 < 5
        c.close()
    finally:
        silent.close()


def test_a_multi_host_init_without_a_secret_is_refused(monkeypatch):
    from flowgraph.distributed import _bind_address

    monkeypatch.delenv("FLOWGRAPH_STORE_SECRET", raising=False)
    assert _bind_address("127.0.0.1") == "127.0.0.1"
    with pytest.raises(fg.FlowError, match="FLOWGRAPH_STORE_SECRET"):
        _bind_address("10.1.2.3")
    monkeypatch.setenv("FLOWGRAPH_STORE_SECRET", "ab" * 32)
    assert _bind_address("10.1.2.3") == "10.1.2.3"


def test_a_dead_peer_is_named_within_seconds(server):
    """Outside the launcher too: a rank whose heartbeat went stale is reported while others wait for its data."""
    waiter = StoreClient("127.0.0.1", server.port, rank=0, connect_timeout=5, secret=SECRET)
    waiter.set("heartbeat/1", repr(time.time() - 60).encode())  # rank 1 beat a minute ago, then died
    t0 = time.monotonic()
    with pytest.raises(fg.FlowError, match=r"rank 1 stopped \(its last heartbeat is"):
        waiter.get("coll/7/1", timeout=300, from_rank=1)
    assert time.monotonic() - t0 < 5
    waiter.set("heartbeat/2", repr(time.time()).encode())  # alive: the wait times out normally instead
    with pytest.raises(fg.FlowError, match="timed out after 1.5 s waiting for store key 'coll/7/2' from rank 2"):
        waiter.get("coll/7/2", timeout=1.5, from_rank=2)
    waiter.close()
