"""The dashboard server: a Starlette app with server-sent events, run by uvicorn on a background thread.

Imported only by ``Monitor.serve()``, so ``import flowgraph.monitor`` does not need starlette or uvicorn.
The event stream is a plain ASGI app (:class:`EventStream`) rather than sse-starlette's
``EventSourceResponse``: that response runs four tasks per client and a cancel scope per write, which made a
flood of connections cost the server thread (and through the GIL, training) about 1.4 times as much CPU;
writing ``text/event-stream`` frames needs no library, so sse-starlette is no longer a dependency.
The socket is bound here before uvicorn starts, which turns "port in use" into a clear
:class:`~flowgraph.errors.FlowError`, makes ``port=0`` report the port it got, and leaves no window in
which another process could take the port.

The server shares the training process and its console, so it must never slow training down or print
into it because of what a browser does. uvicorn's HTTP protocol is subclassed (:class:`DashboardProtocol`)
to bound what a connection may hold and to close misbehaving ones at once, quietly:

* a request head must arrive within ``header_timeout`` seconds of connecting (or of the previous
  response): slow-header ("slowloris") connections are closed;
* at most ``max_connections`` connections are open; one more makes room by closing the connection that
  has waited longest for its request head, so idle sockets cannot lock a browser out;
* requests start at a bounded rate (``admit_rate`` per second after a burst), so a flood of connections
  takes a bounded share of the process (the GIL) from training; a request whose client left while it
  waited is skipped;
* a client that stopped reading is dropped once its writes are blocked on a full socket buffer and it is
  ``max_lag`` epochs behind, or after ``send_timeout`` seconds blocked, whichever comes first; its
  browser reconnects and resumes with ``Last-Event-ID``;
* closing a dropped connection is an abort (RST): the socket is released at once instead of staying
  ESTABLISHED behind unsent data;
* what uvicorn's protocol logs goes to the ``flowgraph.monitor.server`` logger as one line at most per
  event (no traceback); client misbehaviour is logged at DEBUG level only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import ipaddress
import json
import logging
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from flowgraph.errors import FlowError

from .hub import EventHub, Message, encode
from .page import asset_text, dashboard_html

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# viz-global.js: @viz-js/viz (MIT; Graphviz compiled to WebAssembly, inlined), vendored with its LICENSE
# (static/viz-js-LICENSE.txt): the page renders /graph.dot with it when the server has no Graphviz.
_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "viz-global.js": "text/javascript"}
_SNAPSHOT_BATCH = 32  # past epochs per write while replaying the history; the loop runs between writes
_CONNECTION_KEY = "flowgraph.connection"  # the scope key under which a request finds its connection

_LOG = logging.getLogger("flowgraph.monitor.server")


@dataclass(frozen=True)
class Limits:
    """What one dashboard connection may hold; the defaults suit a handful of browsers on a training host.

    Args:
        header_timeout: seconds to send a complete request head, after connecting or after a response.
        keep_alive: seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``).
        send_timeout: seconds a write may wait for a client that stopped reading before it is dropped.
        max_connections: open connections at most; one more closes the longest-waiting idle one.
        max_header_bytes: the largest request head accepted: h11's ``max_incomplete_event_size`` while it
            arrives (400), and checked once complete (431).
        max_lag: epochs a client whose writes are blocked may fall behind before it is dropped.
        admit_rate, admit_burst: requests start at most ``admit_rate`` per second once ``admit_burst`` have
            started at once (a browser makes five on loading the page); the others wait their turn, and
            one whose client left meanwhile is skipped. Starting a request costs the server thread about
            a millisecond, taken from the training thread: a flood of connections cannot take more.
        stall: at ``finish()``, seconds a stream may stay blocked on a send before it is dropped.
        drain: at shutdown, seconds open streams get to send what they have before they are closed.
        write_interval: how often the server looks for new epochs; each client gets those published
            meanwhile in one write (a dashboard needs no more, and the training thread never wakes the
            server). Metadata, ``complete`` and closing are sent at once.
    """

    header_timeout: float = 10.0
    keep_alive: float = 5.0
    send_timeout: float = 10.0
    max_connections: int = 256
    max_header_bytes: int = 16 * 1024
    max_lag: int = 1024
    admit_rate: float = 20.0
    admit_burst: int = 20
    stall: float = 0.5
    drain: float = 0.5
    write_interval: float = 0.5


class _ProtocolLog:
    """Stands in for uvicorn's ``uvicorn.error`` logger inside the protocol: one line at most per event.

    Server faults (an exception in the app) are errors without their traceback; what clients do (an
    invalid request, an unsupported upgrade) is DEBUG. Everything goes to ``flowgraph.monitor.server``.
    """

    level = logging.INFO  # uvicorn writes its per-connection TRACE lines only when level <= TRACE (5)

    def _line(self, level: int, msg: object, args: tuple[Any, ...], exc_info: Any) -> None:
        if not _LOG.isEnabledFor(level):
            return
        text = (str(msg) % args if args else str(msg)).strip().rstrip(".")
        if isinstance(exc_info, BaseException):
            text += f": {type(exc_info).__name__}: {exc_info}".rstrip(": ")
        _LOG.log(level, "dashboard server: %s", text)

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """Any level (uvicorn's TRACE lines are below DEBUG and never shown)."""
        self._line(level, msg, args, exc_info)

    def debug(self, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """Debug lines."""
        self._line(logging.DEBUG, msg, args, exc_info)

    def info(self, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """Informational lines: kept at DEBUG, the console is the training's."""
        self._line(logging.DEBUG, msg, args, exc_info)

    def warning(self, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """Client misbehaviour (invalid request, unsupported upgrade): DEBUG."""
        self._line(logging.DEBUG, msg, args, exc_info)

    def error(self, msg: object, *args: Any, exc_info: Any = None, **_: Any) -> None:
        """A fault of the server or the app: one ERROR line, no traceback."""
        self._line(logging.ERROR, msg, args, exc_info)


_PROTOCOL_LOG = _ProtocolLog()


class DashboardProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout, a connection cap, paced request starts and quiet,
    immediate drops (see the module text).

    The limits and the admission come from the class attributes :attr:`limits` and :attr:`admission`
    (:class:`DashboardServer` makes a subclass per server). Each request finds its connection in
    ``scope["flowgraph.connection"]``.
    """

    limits: ClassVar[Limits] = Limits()
    admission: ClassVar[Admission]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _PROTOCOL_LOG  # type: ignore[assignment]
        self.app = functools.partial(_serve_request, self.app, self)
        self.waiting_since: float | None = None  # when it began waiting for a request head
        self.sending_since: float | None = None  # when a write began waiting on a full buffer
        self.drop_reason: str | None = None
        self._header_timer: asyncio.TimerHandle | None = None

    # -- connection life -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_request()
        if len(self.connections) > self.limits.max_connections:
            live = sum(1 for c in self.connections if getattr(c, "drop_reason", None) is None)
            if live > self.limits.max_connections:  # dropped ones leave within a loop iteration
                self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self.waiting_since = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.waiting_since is not None and self.cycle is not None and not self.cycle.response_complete:
            self.request_started()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self._await_request()

    # -- limits --------------------------------------------------------------------------------------------

    def request_started(self) -> None:
        """A complete request head arrived: the header timer stops."""
        self.waiting_since = None
        self._cancel_header_timer()

    @property
    def gone(self) -> bool:
        """True once the client left or the connection was dropped."""
        cycle = self.cycle
        return (
            self.drop_reason is not None
            or self.transport is None
            or self.transport.is_closing()
            or (cycle is not None and cycle.disconnected)
        )

    async def closed_quietly(self, reason: str) -> None:
        """Drop the connection and wait until uvicorn knows it is gone, so a request that ends without a
        complete response is not reported as an error."""
        cycle = self.cycle
        self.drop(reason)
        for _ in range(8):  # the abort's connection_lost runs within a loop iteration or two
            if cycle is None or cycle.disconnected:
                return
            await asyncio.sleep(0)

    def drop(self, reason: str) -> None:
        """Close the connection at once (an abort, RST), whatever is buffered; quiet (one DEBUG line)."""
        if self.drop_reason is not None or self.transport is None:
            return
        self.drop_reason = reason
        self._cancel_header_timer()
        _LOG.debug("dashboard server: dropped %s (%s)", _peer(self.client), reason)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _await_request(self) -> None:
        self.waiting_since = self.loop.time()
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_timed_out)

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.waiting_since is not None:
            self.drop("no request head within the header timeout")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _make_room(self) -> None:
        waiting = [
            c for c in self.connections
            if c is not self and getattr(c, "waiting_since", None) is not None and c.drop_reason is None
        ]
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since)  # type: ignore[attr-defined]
            oldest.drop("connection limit: the longest-waiting idle connection")  # type: ignore[attr-defined]
        else:
            self.drop("connection limit: every connection is busy")


class Admission:
    """Lets requests start at most ``rate`` per second after a burst of ``burst``, first come first served.

    Waiting requests are released one token at a time by a task on the server loop; one whose client left
    meanwhile is skipped without using a token, so a flood of connect-and-leave clients does not delay a
    browser that stays.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._stamp: float | None = None
        self._waiting: deque[tuple[asyncio.Future[bool], DashboardProtocol]] = deque()
        self._releaser: asyncio.Task[None] | None = None

    def _refill(self, now: float) -> None:
        if self._stamp is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def admit(self, connection: DashboardProtocol) -> bool:
        """Wait for this request's turn; False when its client left while it waited."""
        loop = asyncio.get_running_loop()
        self._refill(loop.time())
        if not self._waiting and self._tokens >= 1:
            self._tokens -= 1
            return True
        turn: asyncio.Future[bool] = loop.create_future()
        self._waiting.append((turn, connection))
        if self._releaser is None or self._releaser.done():
            self._releaser = loop.create_task(self._release(), name="flowgraph-monitor-admission")
        return await turn

    async def _release(self) -> None:
        loop = asyncio.get_running_loop()
        waiting = self._waiting
        while waiting:
            while waiting and (waiting[0][0].done() or waiting[0][1].gone):
                turn, _ = waiting.popleft()
                if not turn.done():
                    turn.set_result(False)
            if not waiting:
                return
            self._refill(loop.time())
            if self._tokens >= 1:
                self._tokens -= 1
                turn, _ = waiting.popleft()
                turn.set_result(True)
            else:
                await asyncio.sleep((1 - self._tokens) / self.rate)


async def _serve_request(app: Any, connection: DashboardProtocol, scope: Any, receive: Any, send: Any) -> None:
    """Run one request once admitted, with its connection in the scope and a send that drops a client that
    stopped reading. A request whose client left before its turn ends quietly without running the app."""
    connection.request_started()
    head = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
    head += sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))
    if head > connection.limits.max_header_bytes:
        await send({"type": "http.response.start", "status": 431,
                    "headers": [(b"content-type", b"text/plain"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b"request head too large"})
        return
    if not await connection.admission.admit(connection):
        await connection.closed_quietly("left: before its turn")
        return
    scope[_CONNECTION_KEY] = connection
    flow = connection.flow
    timeout = connection.limits.send_timeout

    async def send_or_drop(message: Any) -> None:
        if flow.write_paused and connection.drop_reason is None:
            connection.sending_since = connection.loop.time()
            try:
                with anyio.move_on_after(timeout):
                    await flow.drain()
            finally:
                connection.sending_since = None
            if flow.write_paused:
                connection.drop(f"stalled: not reading for {timeout:g}s")
        await send(message)  # returns at once once the connection is gone

    await app(scope, receive, send_or_drop)


def _peer(client: tuple[str, int] | None) -> str:
    return "a client" if client is None else f"{client[0]}:{client[1]}"


class StreamTracker:
    """Counts open event streams, and streams that ended before ``complete`` whose browser will come back.

    ``finish()`` keeps the server up while a stream is open or such a browser is owed its ``complete``
    (until it resumes with ``Last-Event-ID``, or ``grace`` seconds after it left), at most ``grace``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0
        self.streams = 0  # streams served so far
        self._owed: deque[float] = deque(maxlen=4096)  # when each owed stream ended (time.monotonic)

    def opened(self) -> None:
        """A stream started."""
        with self._lock:
            self.open += 1
            self.streams += 1

    def closed(self, *, finished: bool, resumed: bool, owed: bool) -> None:
        """A stream ended: after ``complete`` (``finished``), or before it (``owed``: its browser returns)."""
        with self._lock:
            self.open -= 1
            if finished and resumed and self._owed:
                self._owed.popleft()
            elif not finished and owed:
                self._owed.append(time.monotonic())

    def settled(self, grace: float) -> bool:
        """True when no stream is open and no browser that left less than ``grace`` s ago is owed ``complete``."""
        with self._lock:
            horizon = time.monotonic() - grace
            while self._owed and self._owed[0] < horizon:
                self._owed.popleft()
            return self.open == 0 and not self._owed


@dataclass(eq=False)
class _Reader:
    """One open stream as the feed sees it: its connection and the id of the last epoch written to it."""

    connection: DashboardProtocol | None
    cursor: int


class LiveFeed:
    """Wakes one server's streams when the hub has something new for them.

    Epochs are polled: every ``write_interval`` seconds, while streams are open, a task on the server loop
    compares the hub's version with the last it saw and wakes the streams if it changed, so each client
    gets the epochs of that interval in one write and the training thread never wakes the server.
    Metadata, ``complete`` and closing wake the streams at once (the hub calls :meth:`wake` on this loop).
    The same task drops a client whose writes are blocked while it is more than ``max_lag`` epochs behind.
    """

    def __init__(self, hub: EventHub, limits: Limits, ping: float = 15.0) -> None:
        self.hub = hub
        self.limits = limits
        self.ping = ping  # seconds between comment lines on an idle stream (proxies close silent ones)
        self.readers: set[_Reader] = set()
        self.dropped_count = 0  # streams that ended because their connection was dropped
        self._event: asyncio.Event | None = None
        self._ticker: asyncio.Task[None] | None = None

    def join(self, connection: DashboardProtocol | None, cursor: int) -> _Reader:
        """Register a stream (on the server loop); the feed's task runs while any stream is open."""
        reader = _Reader(connection, cursor)
        self.readers.add(reader)
        if self._ticker is None or self._ticker.done():
            loop = asyncio.get_running_loop()
            self.hub.watch(loop, self.wake)
            # The version is read here, before the stream reads the hub, not when the task first runs: an
            # epoch published in between (the training thread holding the GIL while this thread waits) would
            # otherwise count as seen, and a stream already waiting for it would sleep until the next ping.
            self._ticker = loop.create_task(self._tick(self.hub.version), name="flowgraph-monitor-feed")
        return reader

    def leave(self, reader: _Reader) -> None:
        """Forget a stream that ended; the feed's task ends with the last stream."""
        self.readers.discard(reader)
        reason = reader.connection.drop_reason if reader.connection is not None else None
        if reason is not None and not reason.startswith("left"):  # dropped by the server, not left
            self.dropped_count += 1
        if not self.readers and self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def wake(self) -> None:
        """Wake every stream waiting in :meth:`changed` (runs on the server loop)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def changed(self, version: int) -> None:
        """Wait until the hub's version differs from ``version`` and the feed noticed, or the feed woke the
        streams for another reason (a client left, a ping is due)."""
        if self.hub.version != version:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()

    async def _tick(self, seen: int) -> None:
        """Every ``write_interval``: wake the streams when the hub's version moved past ``seen`` (the version
        when the first stream joined), a client left or a ping is due; drop laggards."""
        loop = asyncio.get_running_loop()
        next_ping = loop.time() + self.ping
        while True:
            await asyncio.sleep(self.limits.write_interval)
            version = self.hub.version
            gone = any(r.connection is not None and r.connection.gone for r in self.readers)
            ping = loop.time() >= next_ping
            if ping:
                next_ping = loop.time() + self.ping
            if version != seen or gone or ping:  # a stream whose client left ends when woken
                seen = version
                self.wake()
            self._drop_laggards()

    def _drop_laggards(self) -> None:
        newest = self.hub.epoch_count - 1
        for reader in list(self.readers):
            connection = reader.connection
            if (
                connection is not None
                and connection.sending_since is not None
                and newest - reader.cursor > self.limits.max_lag
            ):
                connection.drop(f"fell behind: {newest - reader.cursor} epochs while not reading")


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _allowed_hosts(host: str) -> list[str]:
    """Host headers accepted: a loopback server refuses other names (a defence against DNS rebinding)."""
    if is_loopback(host):
        return ["127.0.0.1", "localhost", "::1", "[::1]", host]
    return ["*"]


def build_app(
    hub: EventHub,
    graph_svg: Callable[[], str | None],
    host: str,
    retry_ms: int = 2000,
    tracker: StreamTracker | None = None,
    feed: LiveFeed | None = None,
    graph_dot: Callable[[], str | None] | None = None,
) -> Any:
    """The Starlette app: ``/``, ``/events``, ``/api/history``, ``/api/meta``, ``/graph.svg``, ``/graph.dot``,
    assets.

    ``tracker`` and ``feed`` are shared with the :class:`DashboardServer` that runs the app; ``graph_dot``
    gives the DOT source that the page renders itself (vendored viz.js) when ``/graph.svg`` has nothing.
    """
    streams = tracker if tracker is not None else StreamTracker()
    live = feed if feed is not None else LiveFeed(hub, Limits())

    async def index(request: Request) -> Response:
        return HTMLResponse(dashboard_html(), headers=_SECURITY_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return PlainTextResponse(f"no asset {name!r}", status_code=404)
        headers = _SECURITY_HEADERS
        if name == "viz-global.js":  # 1.3 MB that never changes within a version: let the browser keep it
            headers = dict(_SECURITY_HEADERS)
            headers["Cache-Control"] = "public, max-age=86400"
        return Response(asset_text(name), media_type=_ASSETS[name], headers=headers)

    async def history(request: Request) -> Response:
        return Response(hub.history_json(), media_type="application/json", headers=_SECURITY_HEADERS)

    async def meta(request: Request) -> Response:
        return Response(hub.meta_json(), media_type="application/json", headers=_SECURITY_HEADERS)

    async def graph(request: Request) -> Response:
        svg = graph_svg()
        if svg is None:
            return PlainTextResponse(
                "no graph SVG: pass a graph to Monitor.watch() or Monitor.log() (needs Graphviz's dot)",
                status_code=404,
                headers=_SECURITY_HEADERS,
            )
        headers = dict(_SECURITY_HEADERS)
        headers["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
        return Response(svg, media_type="image/svg+xml", headers=headers)

    async def graph_source(request: Request) -> Response:
        dot = graph_dot() if graph_dot is not None else None
        if dot is None:
            return PlainTextResponse(
                "no graph DOT: pass a graph to Monitor.watch() or Monitor.log()",
                status_code=404,
                headers=_SECURITY_HEADERS,
            )
        return Response(dot, media_type="text/vnd.graphviz; charset=utf-8", headers=_SECURITY_HEADERS)

    routes = [
        Route("/", index),
        Route("/static/{name}", asset),
        Route("/events", EventStream(live, streams, retry_ms), methods=["GET", "HEAD"]),
        Route("/api/history", history),
        Route("/api/meta", meta),
        Route("/graph.svg", graph),
        Route("/graph.dot", graph_source),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=_allowed_hosts(host))]
    return Starlette(routes=routes, middleware=middleware)


def _last_event_id(request: Request) -> int | None:
    """The id of the last epoch a reconnecting browser received (``Last-Event-ID``), or None."""
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _fresh_clock(meta: Message) -> Message:
    """The metadata with ``now`` set to the time of sending, so a late client can tick the elapsed time."""
    data = json.loads(meta.data)
    data["now"] = time.time()
    return Message(meta.event, encode(data), meta.id)


class EventStream:
    """The ``/events`` endpoint, a plain ASGI app: one task per client and nothing else.

    (sse-starlette's response runs four tasks per client and a cancel scope per write; with it, a flood of
    connections cost the server thread about 1.4 times as much CPU.) The stream ends at ``complete``,
    when the server closes, or once its client is gone: a write to a client that left returns at once
    and the stream stops there; an idle one is woken by the feed, which notices within
    ``write_interval``. A comment line every ``feed.ping`` seconds keeps proxies from closing an idle stream.
    """

    def __init__(self, feed: LiveFeed, tracker: StreamTracker, retry_ms: int = 2000) -> None:
        self.feed = feed
        self.tracker = tracker
        self.retry_ms = retry_ms

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Answer one ``GET /events`` (``HEAD``: the headers only)."""
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-accel-buffering", b"no")]
        headers += [(name.lower().encode(), value.encode()) for name, value in _SECURITY_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        connection = scope.get(_CONNECTION_KEY)
        last_seen = _last_event_id(Request(scope))
        stream = _stream(self.feed, last_seen, self.retry_ms, connection, self.tracker)
        try:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if connection is not None and connection.gone:
                    break
            if connection is not None and connection.gone:
                await connection.closed_quietly("left: during its stream")
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await stream.aclose()


async def _stream(
    feed: LiveFeed,
    last_seen: int | None,
    retry_ms: int,
    connection: DashboardProtocol | None,
    tracker: StreamTracker,
) -> AsyncIterator[bytes]:
    """One client's events: metadata, the epochs after ``last_seen`` (all for a new client), live ones as
    the feed wakes it, until ``complete``.

    Many epochs (a late client's history) are written in batches with the event loop running between two
    writes, so a client that left is noticed after one write instead of the whole history being pushed
    into a dead socket.
    """
    hub = feed.hub
    loop = asyncio.get_running_loop()
    reader = feed.join(connection, -1 if last_seen is None else last_seen)
    tracker.opened()
    finished = False
    closed = False
    try:
        meta_version = 0
        chunks = [f"retry: {retry_ms}\r\n\r\n".encode()]
        first = True
        while True:
            update = hub.read(reader.cursor, meta_version)
            if update.meta is not None:
                chunks.append(_fresh_clock(update.meta).frame if first else update.meta.frame)
                meta_version = update.meta_version
            first = False
            epochs = update.epochs
            for start in range(0, len(epochs), _SNAPSHOT_BATCH):
                batch = epochs[start : start + _SNAPSHOT_BATCH]
                chunks.extend(message.frame for message in batch)
                yield b"".join(chunks)
                chunks = []
                reader.cursor = batch[-1].id if batch[-1].id is not None else reader.cursor
                if start + _SNAPSHOT_BATCH < len(epochs):
                    await asyncio.sleep(0)  # let the loop notice a client that left
                    if connection is not None and connection.gone:
                        return
            if update.complete is not None:
                chunks.append(update.complete.frame)
                yield b"".join(chunks)
                finished = True
                return
            if chunks:
                yield b"".join(chunks)
                chunks = []
            if update.closed or (connection is not None and connection.gone):
                closed = update.closed
                return
            wrote = loop.time()
            await feed.changed(update.version)
            if hub.version == update.version and loop.time() - wrote >= feed.ping * 0.9:
                yield b": ping\r\n\r\n"
    finally:
        feed.leave(reader)
        stalled = connection is not None and (connection.drop_reason or "").startswith("stalled")
        tracker.closed(finished=finished, resumed=last_seen is not None, owed=not (closed or stalled))


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; a :class:`FlowError` naming the port when it is taken."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise FlowError(f"Monitor.serve: port must be an int in 0..65535 (0 picks a free one), got {port!r}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise FlowError(
            f"Monitor.serve: cannot resolve host {host!r} ({error}); use '127.0.0.1' (this machine only) "
            "or '0.0.0.0' (every interface)"
        ) from error
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise FlowError(
                f"Monitor.serve: port {port} on {host} is already in use; pass another port, "
                f"e.g. mon.serve(port={port + 1 if 0 < port < 65535 else 0}), or port=0 to pick a free one"
            ) from error
        raise FlowError(f"Monitor.serve: cannot listen on {host}:{port}: {error}") from error
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server with a shutdown that never waits on, cancels or logs a stalled client."""

    limits: Limits = Limits()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop listening, let open streams send what is queued for ``limits.drain`` s, abort the rest."""
        loop = asyncio.get_running_loop()
        for server in self.servers:
            server.close()
        connections = self.server_state.connections
        for connection in list(connections):
            with contextlib.suppress(Exception):  # h11 refuses in odd states; the abort below still ends it
                connection.shutdown()  # idle keep-alive connections close now, busy ones after their response
        deadline = loop.time() + self.limits.drain
        while connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(connections):
            connection.drop("server shutting down")  # type: ignore[union-attr]
        deadline = loop.time() + 2.0
        while self.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self.server_state.tasks):  # never seen; a stuck app must not keep the thread alive
            task.cancel()


class DashboardServer:
    """uvicorn serving the dashboard app on its own thread and event loop.

    Args:
        app: the ASGI app (:func:`build_app`).
        sock: the listening socket (:func:`bind_socket`).
        host: the host it listens on (for messages).
        limits: what each connection may hold (:class:`Limits`).
        tracker: the app's :class:`StreamTracker`, for :meth:`linger`.
        feed: the app's :class:`LiveFeed`, for :meth:`stats`.
    """

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        host: str,
        limits: Limits | None = None,
        tracker: StreamTracker | None = None,
        feed: LiveFeed | None = None,
    ) -> None:
        self.host = host
        self.port = int(sock.getsockname()[1])
        self.limits = limits if limits is not None else Limits()
        self.tracker = tracker if tracker is not None else StreamTracker()
        self.feed = feed
        self._sock = sock
        admission = Admission(self.limits.admit_rate, self.limits.admit_burst)
        protocol = type("DashboardProtocol", (DashboardProtocol,), {"limits": self.limits, "admission": admission})
        config = uvicorn.Config(
            app,
            http=protocol,
            log_config=None,  # leave the user's logging configuration alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            proxy_headers=False,  # nothing proxies a training dashboard; never trust X-Forwarded-For
            server_header=False,
            timeout_keep_alive=int(self.limits.keep_alive) or 1,
            h11_max_incomplete_event_size=self.limits.max_header_bytes,
        )
        self._server = _Server(config)
        self._server.limits = self.limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"flowgraph-monitor:{self.port}", daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self._sock])

        try:
            asyncio.run(serve())
        except BaseException as error:  # noqa: BLE001 - reported to the thread that called start()
            self._error = error
        finally:
            if self.feed is not None and self._loop is not None:
                self.feed.hub.unwatch(self._loop)
            with contextlib.suppress(OSError):
                self._sock.close()

    def start(self, timeout: float = 15.0) -> None:
        """Start the thread; return once the server accepts connections, or raise why it could not."""
        self._thread.start()
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive() or waited >= timeout:
                self.stop()
                reason = repr(self._error) if self._error else f"it did not start within {timeout:.0f}s"
                raise FlowError(
                    f"Monitor.serve: the dashboard server on {self.host}:{self.port} failed to start: "
                    f"{reason}; try another port or host"
                ) from (self._error if isinstance(self._error, Exception) else None)
            self._thread.join(0.01)
            waited += 0.01

    @property
    def running(self) -> bool:
        """True while the server thread runs."""
        return self._thread.is_alive()

    @property
    def connection_count(self) -> int:
        """Open connections now (streams, requests and idle keep-alive ones)."""
        return len(self._server.server_state.connections)

    def stats(self) -> dict[str, int]:
        """Counts for diagnostics and load tests: open connections, open and served streams, streams the feed
        holds, streams whose connection was dropped, request tasks, and all tasks on the server's loop."""
        loop = self._loop
        tasks = -1
        if loop is not None and self.running:

            async def count() -> int:
                return len(asyncio.all_tasks())

            with contextlib.suppress(Exception):
                tasks = asyncio.run_coroutine_threadsafe(count(), loop).result(5.0)
        return {
            "connections": self.connection_count,
            "open_streams": self.tracker.open,
            "streams_served": self.tracker.streams,
            "readers": len(self.feed.readers) if self.feed is not None else 0,
            "dropped": self.feed.dropped_count if self.feed is not None else 0,
            "request_tasks": len(self._server.server_state.tasks),
            "loop_tasks": tasks,
        }

    def linger(self, grace: float) -> float:
        """Keep serving after ``complete`` until every open stream ended and no browser that left recently is
        owed ``complete``, at most ``grace`` seconds; a stream blocked on a send for ``limits.stall`` s is
        dropped meanwhile. Returns the seconds waited."""
        loop = self._loop
        if grace <= 0 or loop is None or not self.running:
            return 0.0
        start = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(self._linger(grace), loop)
        try:
            future.result(grace + 5.0)
        except (TimeoutError, RuntimeError, concurrent.futures.CancelledError):  # the loop ended meanwhile
            future.cancel()
        return time.monotonic() - start

    async def _linger(self, grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline and not self._server.should_exit:
            now = loop.time()
            for connection in list(self._server.server_state.connections):
                since = getattr(connection, "sending_since", None)
                if since is not None and now - since > self.limits.stall:
                    connection.drop("stalled: not reading at the end of the run")  # type: ignore[union-attr]
            if self.tracker.settled(grace):
                return
            await asyncio.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask uvicorn to exit and wait for the thread: open streams get ``limits.drain`` s, then are closed."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()
