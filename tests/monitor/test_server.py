"""The live dashboard server, exercised over real HTTP on 127.0.0.1 with httpx."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from flowgraph.errors import FlowError

from .conftest import metrics_for, sse_events

TIMEOUT = httpx.Timeout(10.0)


def test_serve_returns_a_working_url_and_routes(served, fake_graph):
    mon = served(10)
    assert mon.url == f"http://127.0.0.1:{mon.port}"
    fake_graph.metrics = {"loss": 0.5}
    mon.log(0, 0.25, fake_graph)
    with httpx.Client(base_url=mon.url, timeout=TIMEOUT) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "static/dashboard.js" in page.text
        assert client.get("/static/dashboard.js").status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200
        assert client.get("/static/secret.py").status_code == 404
        graph = client.get("/graph.svg")
        if fake_graph.svg_calls and graph.status_code == 200:
            assert graph.headers["content-type"].startswith("image/svg+xml")
            assert "<svg" in graph.text
        meta = client.get("/api/meta").json()
        assert meta["model"]["label"] == "classifier"
        assert meta["model"]["parameters"] == {"total": 338, "trainable": 82, "frozen": 256}
        assert meta["status"] == "running"
        for response in (page, meta_response := client.get("/api/meta")):
            assert "access-control-allow-origin" not in response.headers
        assert "default-src 'none'" in meta_response.headers["content-security-policy"]


def test_history_matches_logged_epochs(served):
    mon = served(5)
    sent = [mon.log(e, 0.1, metrics_for(e)) for e in range(3)]
    history = httpx.get(mon.url + "/api/history", timeout=TIMEOUT).json()
    assert history == sent
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[0]["metrics"]["acc"] == pytest.approx(0.5)


def test_late_client_gets_every_past_epoch_once_then_live_ones(served):
    mon = served(20)
    for epoch in range(7):
        mon.log(epoch, 0.01, metrics_for(epoch))
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", mon.url + "/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
        first = next(events)
        assert first.event == "meta"
        past = [next(events) for _ in range(7)]
        assert [e.event for e in past] == ["epoch"] * 7
        assert [e.data["epoch"] for e in past] == list(range(1, 8))
        assert [e.id for e in past] == [str(i) for i in range(7)]
        for epoch in range(7, 10):
            mon.log(epoch, 0.01, metrics_for(epoch))
        live = [next(events) for _ in range(3)]
        assert [e.data["epoch"] for e in live] == [8, 9, 10]
        mon.finish()
        rest = list(events)  # the stream must end after `complete`
    assert [e.event for e in rest] == ["meta", "complete"]
    assert rest[-1].data["status"] == "completed"
    assert rest[-1].data["epochs"] == 10


def test_joining_while_epochs_are_logged_loses_and_repeats_nothing(served):
    mon = served(400)
    stop = threading.Event()

    def train():
        for epoch in range(400):
            if stop.is_set():
                return
            mon.log(epoch, 0.001, {"loss": float(epoch)})
        mon.finish(keep_serving=True)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        time.sleep(0.02)  # join in the middle of the run
        with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", mon.url + "/events") as response:
            epochs = [e.data["epoch"] for e in sse_events(response) if e.event == "epoch"]
    finally:
        stop.set()
        trainer.join(10)
    assert epochs == list(range(1, 401))


def test_last_event_id_resumes_after_the_last_seen_epoch(served):
    mon = served(10)
    for epoch in range(5):
        mon.log(epoch, 0.01, {"loss": 1.0})
    mon.finish(keep_serving=True)
    headers = {"Last-Event-ID": "2"}
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream("GET", mon.url + "/events", headers=headers) as r,
    ):
        events = list(sse_events(r))
    assert [e.data["epoch"] for e in events if e.event == "epoch"] == [4, 5]
    assert events[-1].event == "complete"


def test_fifty_concurrent_clients_receive_every_epoch(served):
    mon = served(30)
    ready = threading.Barrier(51, timeout=20)

    def client_run() -> list[int]:
        with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", mon.url + "/events") as response:
            ready.wait()
            seen = []
            for event in sse_events(response):
                if event.event == "epoch":
                    seen.append(event.data["epoch"])
                elif event.event == "complete":
                    return seen
        return seen

    with ThreadPoolExecutor(max_workers=50) as pool:
        futures = [pool.submit(client_run) for _ in range(50)]
        try:
            ready.wait()
            for epoch in range(30):
                mon.log(epoch, 0.01, metrics_for(epoch))
        finally:
            mon.finish(keep_serving=True)
        results = [f.result(timeout=30) for f in futures]
    assert all(r == list(range(1, 31)) for r in results), [len(r) for r in results]


def read_like_a_browser(url: str, limit: int = 50) -> tuple[list[int], int]:
    """Follow /events to `complete`, reconnecting with Last-Event-ID whenever the server drops us (a dropped
    client's connection is reset, which a browser's EventSource answers by reconnecting).

    Returns the epoch numbers received and how many connections it took.
    """
    received: list[int] = []
    last_id = None
    with httpx.Client(timeout=TIMEOUT) as client:
        for connection in range(1, limit + 1):
            headers = {} if last_id is None else {"Last-Event-ID": last_id}
            try:
                with client.stream("GET", url + "/events", headers=headers) as response:
                    for event in sse_events(response):
                        if event.event == "epoch":
                            received.append(event.data["epoch"])
                            last_id = event.id
                        elif event.event == "complete":
                            return received, connection
            except (httpx.ReadError, httpx.RemoteProtocolError):
                continue  # reset by the server: reconnect
    raise AssertionError(f"no complete after {limit} connections")


def test_a_stalled_client_neither_blocks_training_nor_starves_others(served):
    mon = served(300, client_queue_size=8)
    stalled = socket.socket()
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, before connecting
        stalled.settimeout(5)
        stalled.connect(("127.0.0.1", mon.port))
        stalled.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{mon.port}\r\n\r\n".encode())
        # ~40 KB per event, ~12 MB in all: more than the kernel's socket buffers (4 MiB at most by default)
        big = {f"layer{i:04d}.block.attention.some_rather_long_metric_name": i / 7 for i in range(600)}
        with ThreadPoolExecutor(max_workers=1) as pool:
            reader = pool.submit(read_like_a_browser, mon.url)
            slowest = 0.0
            for epoch in range(300):
                start = time.perf_counter()
                mon.log(epoch, 0.001, big)
                slowest = max(slowest, time.perf_counter() - start)
            mon.finish(keep_serving=True)
            received, connections = reader.result(timeout=30)
        # a bound about not blocking, not about speed
        assert slowest < 2.0
        # the reader may itself have been dropped (8 epochs behind while blocked) but resumed without loss
        # or repetition
        assert received == list(range(1, 301))
        # the stalled client was dropped (beyond the reader's own drops, one per reconnection), its socket
        # closed: the server holds no connection for it
        for _ in range(200):
            stats = mon._server.stats()
            if stats["dropped"] >= connections and stats["open_streams"] == 0:
                break
            time.sleep(0.05)
        assert stats["dropped"] >= connections
        assert stats["open_streams"] == 0
    finally:
        stalled.close()


def test_complete_ends_streams_for_clients_that_join_after_finish(served):
    mon = served(3)
    for epoch in range(3):
        mon.log(epoch, 0.01, {"loss": 0.1})
    mon.finish(keep_serving=True)
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", mon.url + "/events") as response:
        events = list(sse_events(response))
    assert [e.event for e in events] == ["meta", "epoch", "epoch", "epoch", "complete"]
    assert events[0].data["status"] == "completed"


def test_close_ends_open_streams_and_stops_the_thread(served):
    mon = served(3)
    mon.log(0, 0.01, {"loss": 0.1})
    url = mon.url
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", url + "/events") as response:
        events = sse_events(response)
        assert next(events).event == "meta"
        assert next(events).event == "epoch"
        mon.close()
        assert list(events) == []
    assert mon.url is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/api/history", timeout=2)


def test_port_in_use_is_a_clear_flow_error(make_monitor):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    try:
        mon = make_monitor(5)
        with pytest.raises(FlowError, match=rf"port {port} .*in use.*port=0"):
            mon.serve(port=port)
        assert mon.url is None
    finally:
        blocker.close()


def test_uvicorn_startup_failure_is_surfaced(make_monitor, monkeypatch):
    import uvicorn

    async def broken_startup(self, sockets=None):
        raise RuntimeError("startup exploded")

    monkeypatch.setattr(uvicorn.Server, "startup", broken_startup)
    mon = make_monitor(5)
    with pytest.raises(FlowError, match="failed to start.*startup exploded"):
        mon.serve(port=0)


def test_bad_port_and_double_serve_are_flow_errors(served, make_monitor):
    with pytest.raises(FlowError, match="0..65535"):
        make_monitor(5).serve(port=70000)
    mon = served(5)
    with pytest.raises(FlowError, match="already serving"):
        mon.serve(port=0)


def test_foreign_host_header_is_refused(served):
    mon = served(5)
    response = httpx.get(mon.url + "/api/history", headers={"Host": "attacker.example"}, timeout=TIMEOUT)
    assert response.status_code == 400
    assert httpx.get(f"http://localhost:{mon.port}/api/history", timeout=TIMEOUT).status_code == 200


def test_graph_svg_falls_back_to_dot_source(served):
    from .conftest import FakeGraph

    graph = FakeGraph(svg_works=False)
    graph.metrics = {"loss": 1.0}
    mon = served(5)
    mon.log(0, 0.1, graph)
    assert httpx.get(mon.url + "/graph.svg", timeout=TIMEOUT).status_code == 404
    meta = httpx.get(mon.url + "/api/meta", timeout=TIMEOUT).json()
    assert meta["graph"]["kind"] == "dot"
    assert "digraph" in meta["graph"]["dot"]
    assert "Graphviz" in meta["graph"]["error"]
    source = httpx.get(mon.url + "/graph.dot", timeout=TIMEOUT)  # what the page renders itself (viz.js)
    assert source.status_code == 200
    assert source.headers["content-type"].startswith("text/vnd.graphviz")
    assert "digraph" in source.text
    script = httpx.get(mon.url + "/static/viz-global.js", timeout=TIMEOUT)  # vendored: no CDN
    assert script.status_code == 200 and "renderSVGElement" in script.text
    assert "'wasm-unsafe-eval'" in script.headers["content-security-policy"]


def test_graph_dot_is_404_without_a_graph(served):
    mon = served(5)
    assert httpx.get(mon.url + "/graph.dot", timeout=TIMEOUT).status_code == 404


def test_serving_again_after_close_streams_live_epochs(served):
    mon = served(5)
    mon.log(0, 0.01, {"loss": 1.0})
    mon.close()
    mon.serve(port=0)
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("GET", mon.url + "/events") as response:
        events = sse_events(response)
        assert [next(events).event, next(events).data["epoch"]] == ["meta", 1]
        mon.log(1, 0.01, {"loss": 0.5})
        assert next(events).data["epoch"] == 2
        mon.finish()
        assert [e.event for e in events] == ["meta", "complete"]
