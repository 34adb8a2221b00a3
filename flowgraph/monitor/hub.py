"""The event hub between the training thread and the dashboard server's event loop.

The training thread publishes; the server pulls. Publishing an epoch appends it to the history under a
lock and bumps a version number: it never blocks, never waits for a client and never wakes the server
thread (for fast epochs that would cost the training thread a switch each time). The server's streams
read what is newer than what they sent (:meth:`EventHub.read`), when the server's feed sees the version
change (it looks a few times a second) or at once for ``meta``, ``complete`` and closing, which the hub
signals to the loops watching it with ``call_soon_threadsafe``.

Each client keeps a cursor, the id of the last epoch it was sent; a late client starts at -1, a
reconnecting browser at its ``Last-Event-ID``. Reading "everything after the cursor" under the lock makes
every epoch reach a client exactly once, however the reads interleave with publishing.

The history is the only copy of the epochs the monitor keeps in memory (:class:`~.history.EpochHistory`:
the bytes sent to browsers, bounded for very long runs).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .history import EpochHistory, Message

__all__ = ["EventHub", "Message", "Update", "encode"]


def encode(value: Any) -> str:
    """Compact JSON; the monitor's objects never hold NaN or infinity (they become null earlier)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Update:
    """What a client has not been sent yet (:meth:`EventHub.read`).

    Attributes:
        epochs: the epochs after its cursor, oldest first.
        meta: the metadata, when newer than the version it has (else None).
        meta_version: the metadata version now.
        complete: the final event once the run finished (else None).
        closed: the server is stopping: end the stream after this update.
        version: the hub's version when read; wait for it to change before reading again.
    """

    epochs: list[Message]
    meta: Message | None
    meta_version: int
    complete: Message | None
    closed: bool
    version: int


class EventHub:
    """Thread-safe history of epoch events, the run's metadata and its final event, read by cursor.

    Args:
        history_limit: at most this many epochs are held (see :class:`~.history.EpochHistory`).
    """

    def __init__(self, history_limit: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._history = EpochHistory(history_limit)
        self._meta: Message | None = None
        self._meta_version = 0
        self._complete: Message | None = None
        self._closed = False
        self._version = 0
        self._watchers: dict[asyncio.AbstractEventLoop, Callable[[], None]] = {}

    # -- training-thread side ------------------------------------------------------------------------------

    def publish_epoch(self, epoch: dict[str, Any]) -> Message:
        """Append an epoch object to the history and return its message; clients get it at their next read."""
        data = encode(epoch)
        with self._lock:
            message = Message("epoch", data, id=self._history.count)
            self._history.append(message)
            self._version += 1
        return message

    def publish_meta(self, meta: dict[str, Any]) -> None:
        """Replace the run's metadata (model, status, timing); live clients are told at once."""
        data = encode(meta)
        with self._lock:
            self._meta = Message("meta", data)
            self._meta_version += 1
            self._version += 1
            self._notify()

    def publish_complete(self, final: dict[str, Any]) -> None:
        """Record the final ``complete`` event; live clients are told at once, later ones get it last."""
        data = encode(final)
        with self._lock:
            self._complete = Message("complete", data)
            self._version += 1
            self._notify()

    def close(self) -> None:
        """Tell every stream to end after sending what it has not sent yet (the server is stopping)."""
        with self._lock:
            self._closed = True
            self._version += 1
            self._notify()

    def reopen(self) -> None:
        """Let streams run again after :meth:`close` (a server started anew)."""
        with self._lock:
            self._closed = False
            self._version += 1

    def _notify(self) -> None:
        """Wake the watching loops now (called under the lock)."""
        for loop, wake in list(self._watchers.items()):
            try:
                loop.call_soon_threadsafe(wake)
            except RuntimeError:  # that loop is closed: its server is gone
                del self._watchers[loop]

    # -- server-loop side ----------------------------------------------------------------------------------

    def watch(self, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> None:
        """Have ``wake`` run on ``loop`` whenever metadata, ``complete`` or closing is published."""
        with self._lock:
            self._watchers[loop] = wake

    def unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop calling the watcher of ``loop``."""
        with self._lock:
            self._watchers.pop(loop, None)

    def read(self, cursor: int, meta_version: int = 0) -> Update:
        """Everything a client whose last epoch id is ``cursor`` (-1: none) and whose metadata version is
        ``meta_version`` (0: none) has not been sent, atomically."""
        with self._lock:
            return Update(
                epochs=self._history.after(cursor),
                meta=self._meta if self._meta_version > meta_version else None,
                meta_version=self._meta_version,
                complete=self._complete,
                closed=self._closed,
                version=self._version,
            )

    @property
    def version(self) -> int:
        """Bumped by every publish; a reader waits for it to change."""
        return self._version  # one int read: atomic under the GIL, and a stale value only delays a read

    # -- readers -------------------------------------------------------------------------------------------

    def epoch_messages(self) -> list[Message]:
        """The epochs held, oldest first: all of them, or for a run longer than the history's recent window
        the newest in full and older ones thinned."""
        with self._lock:
            return self._history.messages()

    def epochs(self) -> list[dict[str, Any]]:
        """The epochs held as new dicts (decoded from their JSON), oldest first."""
        return [json.loads(message.data_bytes) for message in self.epoch_messages()]

    def history_json(self) -> bytes:
        """The JSON array of the epoch objects held (UTF-8)."""
        return b"[" + b",".join(message.data_bytes for message in self.epoch_messages()) + b"]"

    @property
    def epoch_count(self) -> int:
        """Epochs published so far, held or thinned out."""
        with self._lock:
            return self._history.count

    @property
    def thinned(self) -> bool:
        """True once the history left some epoch out (see :class:`~.history.EpochHistory`)."""
        with self._lock:
            return self._history.thinned

    def meta_json(self) -> str:
        """The current metadata object as JSON (``{}`` before any)."""
        with self._lock:
            return self._meta.data if self._meta is not None else "{}"

    def complete_json(self) -> str | None:
        """The final event's JSON, or None while training runs."""
        with self._lock:
            return None if self._complete is None else self._complete.data
