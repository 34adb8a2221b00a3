"""The dashboard server: a Starlette app with SSE, run by uvicorn on a background thread.

Imported only by ``Monitor.serve()``, so ``import flowgraph.monitor`` does not need starlette, uvicorn or
sse-starlette. The socket is bound here before uvicorn starts, which turns "port in use" into a clear
:class:`~flowgraph.errors.FlowError`, makes ``port=0`` report the port it got, and leaves no window in
which another process could take the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from flowgraph.errors import FlowError

from .hub import EventHub, Message, _Stop, encode
from .page import asset_text, dashboard_html

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_SNAPSHOT_BATCH = 8  # past epochs sent between two yields to the event loop


class _QuietDisconnects(logging.Filter):
    """Drops asyncio's "socket.send() raised exception." lines: a dashboard client that left is normal and must
    not print into the training console (one line per write until the stream notices)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "socket.send() raised exception" not in record.getMessage()


_QUIET = _QuietDisconnects()


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


def build_app(hub: EventHub, graph_svg: Callable[[], str | None], host: str, retry_ms: int = 2000) -> Any:
    """The Starlette app: ``/``, ``/events``, ``/api/history``, ``/api/meta``, ``/graph.svg``, assets."""

    async def index(request: Request) -> Response:
        return HTMLResponse(dashboard_html(), headers=_SECURITY_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return PlainTextResponse(f"no asset {name!r}", status_code=404)
        return Response(asset_text(name), media_type=_ASSETS[name], headers=_SECURITY_HEADERS)

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

    async def events(request: Request) -> Response:
        last_seen = _last_event_id(request)
        return EventSourceResponse(_stream(hub, last_seen, retry_ms), ping=15, send_timeout=10)

    routes = [
        Route("/", index),
        Route("/static/{name}", asset),
        Route("/events", events),
        Route("/api/history", history),
        Route("/api/meta", meta),
        Route("/graph.svg", graph),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=_allowed_hosts(host))]
    return Starlette(routes=routes, middleware=middleware)


def _last_event_id(request: Request) -> int:
    """The id of the last epoch a reconnecting browser received (``Last-Event-ID``), or -1."""
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def _fresh_clock(meta: Message) -> Message:
    """The metadata with ``now`` set to the time of sending, so a late client can tick the elapsed time."""
    data = json.loads(meta.data)
    data["now"] = time.time()
    return Message(meta.event, encode(data), meta.id)


def _sse(message: Message, retry_ms: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"event": message.event, "data": message.data}
    if message.id is not None:
        event["id"] = str(message.id)
    if retry_ms is not None:
        event["retry"] = retry_ms
    return event


async def _stream(hub: EventHub, last_seen: int, retry_ms: int) -> AsyncIterator[dict[str, Any]]:
    """One client's events: metadata, the past epochs it has not seen, then live ones until ``complete``."""
    subscriber, snapshot = hub.subscribe()
    try:
        first = True
        if snapshot.meta is not None:
            yield _sse(_fresh_clock(snapshot.meta), retry_ms)
            first = False
        for i, message in enumerate(snapshot.epochs):
            if message.id is not None and message.id > last_seen:
                yield _sse(message, retry_ms if first else None)
                first = False
            if i % _SNAPSHOT_BATCH == _SNAPSHOT_BATCH - 1:
                # Let the event loop run: a client that left is noticed (the response cancels this generator)
                # instead of the whole history being pushed into a dead socket, one asyncio warning per write.
                await asyncio.sleep(0)
        if snapshot.complete is not None:
            yield _sse(snapshot.complete)
            return
        while True:
            item = await subscriber.queue.get()
            if isinstance(item, _Stop):
                return
            yield _sse(item)
            if item.event == "complete":
                return
    finally:
        hub.unsubscribe(subscriber)


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


class DashboardServer:
    """uvicorn serving the dashboard app on its own thread and event loop."""

    def __init__(self, app: Any, sock: socket.socket, host: str) -> None:
        self.host = host
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        config = uvicorn.Config(
            app,
            log_config=None,  # leave the user's logging configuration alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
            # A dashboard has a handful of clients: bound what slow or idle connections can hold.
            timeout_keep_alive=5,
            limit_concurrency=256,
            h11_max_incomplete_event_size=16 * 1024,
        )
        self._server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"flowgraph-monitor:{self.port}", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as error:  # noqa: BLE001 - reported to the thread that called start()
            self._error = error
        finally:
            with contextlib.suppress(OSError):
                self._sock.close()

    def start(self, timeout: float = 15.0) -> None:
        """Start the thread; return once the server accepts connections, or raise why it could not."""
        logging.getLogger("asyncio").addFilter(_QUIET)
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

    def stop(self, timeout: float = 5.0) -> None:
        """Ask uvicorn to exit and wait for the thread (open streams get ``timeout_graceful_shutdown``)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()
        logging.getLogger("asyncio").removeFilter(_QUIET)
