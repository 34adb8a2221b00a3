"""The event hub between the training thread and the dashboard server's event loop.

The training thread publishes; each SSE client is a subscriber with its own bounded ``asyncio.Queue`` on
the server's loop. Publishing never blocks: under one lock it appends to the history and schedules a
``put_nowait`` on each subscriber's loop with ``call_soon_threadsafe``. A subscriber whose queue is full
(a slow or stalled client) is dropped: its stream ends and the browser reconnects later, resuming from the
``Last-Event-ID`` it saw, so it still misses nothing.

Joining takes the snapshot of the history and registers the subscriber under the same lock, so every
epoch reaches a client exactly once: either in its snapshot or through its queue, never both, never neither.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Message:
    """One server-sent event: its type (``epoch``, ``meta``, ``complete``), JSON data and optional id."""

    event: str
    data: str
    id: int | None = None


class _Stop:
    """Sentinel queued to end a subscriber's stream: ``reason`` is ``dropped`` or ``closed``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def encode(value: Any) -> str:
    """Compact JSON; the monitor's objects never hold NaN or infinity (they become null earlier)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


@dataclass(eq=False)
class Subscriber:
    """One live SSE client: its loop, its bounded queue, and whether it was dropped for falling behind."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Message | _Stop]
    on_drop: Callable[[], None] | None = None
    dropped: bool = False
    stopped: bool = field(default=False)

    def deliver(self, item: Message | _Stop) -> None:
        """Runs on the subscriber's loop: enqueue without waiting; on a full queue, drop the client."""
        if self.stopped:
            return
        if isinstance(item, _Stop):
            self._stop(item)
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped = True
            self._stop(_Stop("dropped"))
            if self.on_drop is not None:
                self.on_drop()

    def _stop(self, item: _Stop) -> None:
        """End the stream: after what is queued when closing, at once when the client is dropped."""
        self.stopped = True
        if item.reason == "dropped" or self.queue.full():
            while not self.queue.empty():  # make room for the sentinel; this client is leaving anyway
                self.queue.get_nowait()
        self.queue.put_nowait(item)


@dataclass(frozen=True)
class Snapshot:
    """What a joining client is sent first: past epochs, current metadata, and the final event if done."""

    epochs: list[Message]
    meta: Message | None
    complete: Message | None


class EventHub:
    """Thread-safe history of epoch events plus fan-out to live subscribers."""

    def __init__(self, queue_size: int = 1024) -> None:
        self._lock = threading.Lock()
        self._epochs: list[Message] = []
        self._meta: Message | None = None
        self._complete: Message | None = None
        self._closed = False
        self._subscribers: set[Subscriber] = set()
        self.queue_size = queue_size
        self.dropped_count = 0  # clients dropped so far for falling behind

    # -- training-thread side ------------------------------------------------------------------------------

    def publish_epoch(self, epoch: dict[str, Any]) -> None:
        """Append an epoch object to the history and send it to every live client."""
        with self._lock:
            message = Message("epoch", encode(epoch), id=len(self._epochs))
            self._epochs.append(message)
            self._broadcast(message)

    def publish_meta(self, meta: dict[str, Any]) -> None:
        """Replace the run's metadata (model, status, timing) and send it to every live client."""
        with self._lock:
            message = Message("meta", encode(meta))
            self._meta = message
            self._broadcast(message)

    def publish_complete(self, final: dict[str, Any]) -> None:
        """Send the final ``complete`` event; clients joining later receive it after the history."""
        with self._lock:
            message = Message("complete", encode(final))
            self._complete = message
            self._broadcast(message)

    def close(self) -> None:
        """End every live stream (after what was already queued) and refuse new subscribers' live part."""
        with self._lock:
            self._closed = True
            self._broadcast(_Stop("closed"))
            self._subscribers.clear()

    def reopen(self) -> None:
        """Accept live subscribers again after :meth:`close` (a server started anew)."""
        with self._lock:
            self._closed = False

    def _broadcast(self, item: Message | _Stop) -> None:
        for subscriber in list(self._subscribers):
            if subscriber.stopped:  # dropped on its loop since the last publish: stop scheduling for it
                self._forget(subscriber)
                continue
            try:
                subscriber.loop.call_soon_threadsafe(subscriber.deliver, item)
            except RuntimeError:  # its loop is closed: the server is gone
                self._subscribers.discard(subscriber)

    # -- server-loop side ----------------------------------------------------------------------------------

    def subscribe(self) -> tuple[Subscriber, Snapshot]:
        """Register a client on the running loop and take its snapshot, atomically."""
        loop = asyncio.get_running_loop()
        subscriber = Subscriber(loop, asyncio.Queue(maxsize=self.queue_size), on_drop=self._count_drop)
        with self._lock:
            snapshot = Snapshot(list(self._epochs), self._meta, self._complete)
            if self._closed:
                subscriber.deliver(_Stop("closed"))
            else:
                self._subscribers.add(subscriber)
        return subscriber, snapshot

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Forget a client (its stream ended or it disconnected)."""
        with self._lock:
            self._forget(subscriber)

    def _forget(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    def _count_drop(self) -> None:
        with self._lock:
            self.dropped_count += 1

    # -- readers -------------------------------------------------------------------------------------------

    def history_json(self) -> str:
        """The JSON array of every epoch object so far."""
        with self._lock:
            return "[" + ",".join(message.data for message in self._epochs) + "]"

    def meta_json(self) -> str:
        """The current metadata object as JSON (``{}`` before any)."""
        with self._lock:
            return self._meta.data if self._meta is not None else "{}"

    def complete_json(self) -> str | None:
        """The final event's JSON, or None while training runs."""
        with self._lock:
            return None if self._complete is None else self._complete.data

    @property
    def subscriber_count(self) -> int:
        """How many clients are connected now."""
        with self._lock:
            return len(self._subscribers)
