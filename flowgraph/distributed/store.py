"""A small TCP key-value store for rendezvous: the NCCL unique id, barriers, heartbeats, host collectives.

One process (rank 0, see ``flowgraph.distributed.init``) runs a :class:`StoreServer` on ``MASTER_ADDR:MASTER_PORT``;
every rank talks to it through a :class:`StoreClient`. Messages are length-prefixed frames over one socket per
client: a request is ``op (1 byte) | key | value`` and a reply ``status (1 byte) | value``, where ``key`` and
``value`` each carry a 4-byte big-endian length. ``get`` blocks (polling the server) until the key is present or
the timeout passes, and then raises a :class:`FlowError` naming the key and the rank that waited.

Every connection starts with a challenge: the server sends a random nonce, the client answers with
HMAC-SHA256(secret, nonce), the server compares in constant time and closes the connection on a wrong answer
(the secret never crosses the wire). The secret is ``FLOWGRAPH_STORE_SECRET`` (hex), which the launcher
generates per job; a peer without it can neither read nor write a key, and a silent one is dropped after
``HANDSHAKE_TIMEOUT`` seconds on its own thread, so it cannot stall the job.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterable

from ..errors import FlowError

_SET, _GET, _DEL, _ADD = b"S", b"G", b"D", b"A"
_OK, _MISSING = b"1", b"0"
_LEN = struct.Struct(">I")
HANDSHAKE_TIMEOUT = 5.0
SECRET_ENV = "FLOWGRAPH_STORE_SECRET"


def job_secret() -> bytes:
    """The job's store secret from ``FLOWGRAPH_STORE_SECRET`` (hex), or empty when unset (loopback runs only)."""
    text = os.environ.get(SECRET_ENV, "")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise FlowError(f"{SECRET_ENV} must be a hex string (the launcher sets one: secrets.token_hex(32))") from None


def _answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _send_frame(sock: socket.socket, *parts: bytes) -> None:
    sock.sendall(b"".join(_LEN.pack(len(p)) + p for p in parts))


def _recv_part(sock: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, 4))
    return _recv_exact(sock, n)


class StoreServer:
    """The store itself: a thread that accepts clients and serves ``set``/``get``/``delete``/``add``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: bytes | None = None) -> None:
        self._secret = job_secret() if secret is None else secret
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise FlowError(f"store server cannot listen on {host}:{port}: {e}; choose another --master-port") from e
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="flowgraph-store", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT)
            nonce = secrets.token_bytes(32)
            _send_frame(conn, nonce)
            if not hmac.compare_digest(_recv_part(conn), _answer(self._secret, nonce)):
                return  # not this job: closed without a word (the client reports the refusal)
            conn.settimeout(None)
            _send_frame(conn, _OK)
            while True:
                op = _recv_part(conn)
                key = _recv_part(conn).decode()
                value = _recv_part(conn)
                with self._lock:
                    if op == _SET:
                        self._data[key] = value
                        reply = (_OK, b"")
                    elif op == _GET:
                        found = self._data.get(key)
                        reply = (_MISSING, b"") if found is None else (_OK, found)
                    elif op == _DEL:
                        reply = (_OK if self._data.pop(key, None) is not None else _MISSING, b"")
                    elif op == _ADD:
                        n = int(self._data.get(key, b"0")) + int(value)
                        self._data[key] = str(n).encode()
                        reply = (_OK, self._data[key])
                    else:
                        reply = (_MISSING, b"unknown op")
                _send_frame(conn, *reply)
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        """Stop accepting clients (connected ones finish when they disconnect)."""
        self._closed = True
        try:  # shutdown wakes the thread blocked in accept() (close alone leaves the port listening on Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


class StoreClient:
    """One rank's connection to a :class:`StoreServer`.

    ``connect_timeout`` bounds the wait for the server to come up (rank 0 may start after the others).
    """

    def __init__(self, host: str, port: int, rank: int = 0, connect_timeout: float = 60.0,
                 secret: bytes | None = None) -> None:
        self.host, self.port, self.rank = host, int(port), int(rank)
        secret = job_secret() if secret is None else secret
        self._lock = threading.Lock()
        deadline = time.monotonic() + connect_timeout
        last: Exception | None = None
        while True:
            try:
                self._sock = socket.create_connection((host, self.port), timeout=max(1.0, connect_timeout))
                self._sock.settimeout(HANDSHAKE_TIMEOUT)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    _send_frame(self._sock, _answer(secret, _recv_part(self._sock)))
                    accepted = _recv_part(self._sock) == _OK
                except (ConnectionError, OSError):
                    accepted = False
                if not accepted:
                    self._sock.close()
                    raise FlowError(
                        f"rank {rank}: the store at {host}:{port} refused this process: its {SECRET_ENV} differs "
                        "(start every rank with the launcher, or give all of them the same secret)"
                    )
                self._sock.settimeout(None)
                break
            except OSError as e:
                last = e
                if time.monotonic() >= deadline:
                    raise FlowError(
                        f"rank {rank}: cannot reach the store at {host}:{port} after {connect_timeout:.1f} s "
                        f"({last}); is rank 0 running and are MASTER_ADDR/MASTER_PORT the same on every rank?"
                    ) from e
                time.sleep(0.05)

    def _request(self, op: bytes, key: str, value: bytes = b"") -> tuple[bytes, bytes]:
        with self._lock:
            try:
                _send_frame(self._sock, op, key.encode(), value)
                return _recv_part(self._sock), _recv_part(self._sock)
            except (ConnectionError, OSError) as e:
                raise FlowError(
                    f"rank {self.rank}: lost the store at {self.host}:{self.port} during {op.decode()} {key!r} "
                    f"({e}); rank 0, which hosts the store, has probably exited"
                ) from e

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (bytes) under ``key``, replacing any previous value."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise FlowError(f"store.set({key!r}, ...) needs bytes, got {type(value).__name__}")
        self._request(_SET, key, bytes(value))

    def try_get(self, key: str) -> bytes | None:
        """The value under ``key``, or None when it is not set (does not wait)."""
        status, value = self._request(_GET, key)
        return value if status == _OK else None

    def get(self, key: str, timeout: float = 300.0, from_rank: int | None = None,
            stale_after: float = 5.0) -> bytes:
        """The value under ``key``, waiting until some rank sets it; FlowError after ``timeout`` seconds.

        With ``from_rank`` (the rank that will set it) the wait also watches that rank's heartbeat: when it is
        older than ``stale_after`` seconds the rank is reported dead within seconds, not after ``timeout``.
        """
        start = time.monotonic()
        deadline = start + timeout
        next_check = start + 1.0
        delay = 0.0005
        while True:
            value = self.try_get(key)
            if value is not None:
                return value
            now = time.monotonic()
            if now >= deadline:
                raise FlowError(f"rank {self.rank}: timed out after {timeout:.1f} s waiting for store key {key!r}"
                                + (f" from rank {from_rank}" if from_rank is not None else ""))
            if from_rank is not None and now >= next_check:
                next_check = now + 1.0
                beat = self.try_get(f"heartbeat/{from_rank}")
                if beat is not None and time.time() - float(beat.decode()) > stale_after:
                    raise FlowError(
                        f"rank {self.rank}: rank {from_rank} stopped (its last heartbeat is "
                        f"{time.time() - float(beat.decode()):.1f} s old) while this rank waited for its data; "
                        "the job cannot continue: restart it (from the last checkpoint)"
                    )
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def wait(self, keys: Iterable[str], timeout: float = 300.0) -> None:
        """Block until every key is set; the FlowError after ``timeout`` lists the keys still missing."""
        keys = list(keys)
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            missing = [k for k in keys if self.try_get(k) is None]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise FlowError(f"rank {self.rank}: timed out after {timeout:.1f} s waiting for store keys {missing}")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it was present."""
        return self._request(_DEL, key)[0] == _OK

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer under ``key`` (0 when absent) and return the new value."""
        return int(self._request(_ADD, key, str(int(amount)).encode())[1])

    def close(self) -> None:
        """Close the connection."""
        try:
            self._sock.close()
        except OSError:
            pass


class Heartbeat:
    """A daemon thread that writes ``heartbeat/<rank>`` (the wall-clock time) every ``interval`` seconds.

    :func:`barrier` reads these keys to tell a rank that died (stale heartbeat) from one that is only slow.
    It has its own connection so that a rank blocked in a long ``get`` keeps beating. ``secret`` as for
    :class:`StoreClient` (default: ``FLOWGRAPH_STORE_SECRET``).
    """

    def __init__(self, host: str, port: int, rank: int, interval: float = 0.5, secret: bytes | None = None) -> None:
        self._client = StoreClient(host, port, rank, secret=secret)
        self._rank, self._interval = rank, interval
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="flowgraph-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self._client.set(f"heartbeat/{self._rank}", repr(time.time()).encode())

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat()
            except FlowError:
                return

    def stop(self) -> None:
        """Stop beating and close the connection."""
        self._stop.set()
        self._thread.join(timeout=2 * self._interval + 1)
        self._client.close()


def barrier(store: StoreClient, rank: int, world_size: int, name: str, timeout: float = 300.0,
            stale_after: float = 5.0) -> None:
    """Wait until all ``world_size`` ranks reached the barrier ``name`` (each call must use a fresh name).

    On timeout the FlowError names the missing ranks, with the age of their last heartbeat when they have one,
    instead of hanging: a rank whose heartbeat is older than ``stale_after`` seconds is reported as dead.
    """
    store.set(f"barrier/{name}/{rank}", b"1")
    keys = {r: f"barrier/{name}/{r}" for r in range(world_size)}
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        missing = [r for r, k in keys.items() if store.try_get(k) is None]
        if not missing:
            return
        if time.monotonic() >= deadline:
            now = time.time()
            parts = []
            for r in missing:
                beat = store.try_get(f"heartbeat/{r}")
                if beat is None:
                    parts.append(f"rank {r} (no heartbeat: never started or not initialised)")
                else:
                    age = now - float(beat.decode())
                    state = "presumed dead" if age > stale_after else "alive but not at the barrier"
                    parts.append(f"rank {r} (last heartbeat {age:.1f} s ago: {state})")
            raise FlowError(
                f"rank {rank}: barrier {name!r} timed out after {timeout:.1f} s; missing: " + ", ".join(parts)
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
