"""A server-sent-events client for the dashboard's ``/events`` stream, in the standard library only.

Used by the terminal dashboard (``python -m flowgraph.monitor.tui URL``) and usable alone::

    from flowgraph.monitor.sse_client import EventSource

    for event in EventSource("http://127.0.0.1:3000"):
        print(event.event, event.id, event.data)      # meta, epoch (id 0, 1, ...), ..., complete

:class:`SSEParser` turns lines into events as the SSE specification says (``event``/``data``/``id``/``retry``
fields, comments skipped, an event dispatched at a blank line, CRLF, LF or CR line ends).
:class:`EventSource` connects with ``http.client``, and when the stream breaks before ``complete`` it
reconnects after the server's ``retry`` delay sending ``Last-Event-ID``: the server resumes after the last
epoch received, so every epoch arrives exactly once across reconnections. It stops after ``complete``.
(urllib would do for one connection; ``http.client`` gives the per-read timeout and the request headers
directly, and is what urllib uses underneath.)
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from flowgraph.errors import FlowError

__all__ = ["EventSource", "SSEEvent", "SSEParser", "events_url"]


@dataclass(frozen=True)
class SSEEvent:
    """One event: its type (``meta``, ``epoch``, ``complete``), its JSON data decoded (the text itself when it
    is not JSON) and its id (``None`` when the event had none)."""

    event: str
    data: Any
    id: str | None


class SSEParser:
    """Lines in, events out (the SSE specification's parsing), remembering ``last_event_id`` and ``retry_ms``."""

    def __init__(self) -> None:
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None
        self._name = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed_line(self, line: str) -> SSEEvent | None:
        """Take one line (without its line end); return the event a blank line completes, else None."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (the server's pings)
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
            self.last_event_id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def feed(self, lines: Iterable[str]) -> Iterator[SSEEvent]:
        """Every event the lines complete."""
        for line in lines:
            event = self.feed_line(line)
            if event is not None:
                yield event

    def _dispatch(self) -> SSEEvent | None:
        name, data, event_id = self._name or "message", self._data, self._id
        self._name, self._data, self._id = "", [], None
        if not data:
            return None
        text = "\n".join(data)
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        return SSEEvent(name, value, event_id)


def events_url(url: str) -> str:
    """The ``/events`` URL of a dashboard given by its address (``http://host:port`` or ``.../events``)."""
    if not isinstance(url, str) or "://" not in url:
        raise FlowError(f"the dashboard URL must look like 'http://127.0.0.1:3000', got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlowError(f"the dashboard URL must be http://host:port (or https://), got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/events"):
        path += "/events"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _lines(response: http.client.HTTPResponse) -> Iterator[str]:
    """The response body's lines without their ends (CRLF, LF, or CR inside what ``readline`` returns)."""
    while True:
        raw = response.readline()
        if not raw:
            return
        text = raw.decode("utf-8", errors="replace")
        if text.endswith("\n"):
            text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
        yield from text.split("\r")


class EventSource:
    """Iterate over a dashboard's events, reconnecting with ``Last-Event-ID`` until ``complete``.

    Args:
        url: the dashboard's address (``http://127.0.0.1:3000``) or its ``/events`` URL.
        last_event_id: resume after this epoch id (None: from the start, every past epoch).
        timeout: seconds a connection attempt or a read may take; the server sends a comment every 15 s on
            an idle stream, so a longer silence means the connection is dead (it is then reopened).
        give_up_after: seconds of failing to reconnect after which iteration raises a ``FlowError``.
        on_status: called with ``"connected"`` or ``"reconnecting"`` when that changes (the terminal
            dashboard shows it).
        retry_ms: milliseconds to wait before reconnecting; None: what the server's ``retry`` field says
            (the dashboard sends 2000), 1000 before it said anything.
    """

    def __init__(self, url: str, last_event_id: int | str | None = None, *, timeout: float = 30.0,
                 give_up_after: float = 60.0, on_status: Callable[[str], None] | None = None,
                 retry_ms: int | None = None) -> None:
        self.url = events_url(url)
        self.parser = SSEParser()
        if last_event_id is not None:
            self.parser.last_event_id = str(last_event_id)
        self.timeout = timeout
        self.give_up_after = give_up_after
        self.on_status = on_status
        self.retry_ms = retry_ms
        self.connections = 0  # how many times a stream was opened (tests check the reconnections)
        self.completed = False
        self._conn: http.client.HTTPConnection | None = None

    @property
    def last_event_id(self) -> str | None:
        """The id of the last event received with one (what a reconnection sends)."""
        return self.parser.last_event_id

    def close(self) -> None:
        """Close the connection (iteration ends at the next read)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _delay(self) -> float:
        ms = self.retry_ms if self.retry_ms is not None else self.parser.retry_ms
        return (1000 if ms is None else ms) / 1000

    def _open(self) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.timeout)
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.parser.last_event_id is not None:
            headers["Last-Event-ID"] = self.parser.last_event_id
        try:
            conn.request("GET", parts.path or "/events", headers=headers)
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if response.status != 200:
            conn.close()
            raise FlowError(f"{self.url} answered {response.status} {response.reason}; is it a flowgraph "
                            "dashboard (Monitor.serve)?")
        self._conn = conn
        self.connections += 1
        return response

    def __iter__(self) -> Iterator[SSEEvent]:
        failing_since: float | None = None
        status = None
        while not self.completed:
            try:
                response = self._open()
            except (OSError, http.client.HTTPException) as error:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self.give_up_after:
                    raise FlowError(f"cannot reach the dashboard at {self.url} for {self.give_up_after:.0f} s "
                                    f"({error}); is the training still running?") from error
                if status != "reconnecting" and self.on_status is not None:
                    self.on_status("reconnecting")
                status = "reconnecting"
                time.sleep(self._delay())
                continue
            failing_since = None
            if status != "connected" and self.on_status is not None:
                self.on_status("connected")
            status = "connected"
            try:
                for event in self.parser.feed(_lines(response)):
                    yield event
                    if event.event == "complete":
                        self.completed = True
                        break
            except (OSError, http.client.HTTPException, ValueError):
                pass  # a broken or timed-out stream: reconnect below (ValueError: closed under us)
            finally:
                self.close()
            if not self.completed:
                self.parser = _carry_over(self.parser)
                if self.on_status is not None:
                    self.on_status("reconnecting")
                status = "reconnecting"
                time.sleep(self._delay())


def _carry_over(parser: SSEParser) -> SSEParser:
    """A fresh parser for a new connection (a half-received event is dropped) with the id and retry kept."""
    fresh = SSEParser()
    fresh.last_event_id, fresh.retry_ms = parser.last_event_id, parser.retry_ms
    return fresh
