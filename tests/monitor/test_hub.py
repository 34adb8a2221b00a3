"""The event hub: reading by cursor gives every epoch exactly once, whatever the interleaving; urgent
events wake the watching loops; epochs never wake them."""

from __future__ import annotations

import asyncio
import json
import threading

from flowgraph.monitor.hub import EventHub, Message


def epochs_of(messages: list[Message]) -> list[int]:
    return [json.loads(m.data)["epoch"] for m in messages]


def test_reading_after_a_cursor_while_publishing_gives_each_epoch_exactly_once():
    hub = EventHub()
    for i in range(5):
        hub.publish_epoch({"epoch": i + 1})
    publisher = threading.Thread(target=lambda: [hub.publish_epoch({"epoch": i + 1}) for i in range(5, 3000)])
    received: list[int] = []
    cursor = -1
    publisher.start()
    while publisher.is_alive() or hub.read(cursor).epochs:
        update = hub.read(cursor)
        received += epochs_of(update.epochs)
        if update.epochs:
            cursor = update.epochs[-1].id
    publisher.join()
    assert received == list(range(1, 3001))


def test_a_cursor_resumes_after_the_last_epoch_seen():
    hub = EventHub()
    for i in range(10):
        hub.publish_epoch({"epoch": i + 1})
    assert epochs_of(hub.read(6).epochs) == [8, 9, 10]
    assert hub.read(9).epochs == []
    assert hub.read(500).epochs == []  # a cursor from the future (another run) gets nothing yet


def test_metadata_is_sent_once_per_version_and_complete_and_close_are_seen():
    hub = EventHub()
    assert hub.read(-1).meta is None
    hub.publish_meta({"status": "running"})
    first = hub.read(-1, 0)
    assert json.loads(first.meta.data) == {"status": "running"}
    assert hub.read(-1, first.meta_version).meta is None
    hub.publish_complete({"status": "completed"})
    hub.close()
    last = hub.read(-1, first.meta_version)
    assert json.loads(last.complete.data) == {"status": "completed"}
    assert last.closed
    hub.reopen()
    assert not hub.read(-1).closed


def test_urgent_events_wake_the_watching_loop_and_epochs_do_not():
    hub = EventHub()

    async def scenario() -> list[str]:
        woken: list[str] = []
        loop = asyncio.get_running_loop()
        hub.watch(loop, lambda: woken.append("woken"))
        publisher = threading.Thread(target=lambda: [hub.publish_epoch({"epoch": i}) for i in range(100)])
        publisher.start()
        publisher.join()
        await asyncio.sleep(0.05)
        epochs_woke = len(woken)
        threading.Thread(target=lambda: hub.publish_complete({"status": "completed"})).start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(woken) > epochs_woke:
                break
        hub.unwatch(loop)
        return [str(epochs_woke), *woken[epochs_woke:]]

    assert asyncio.run(scenario()) == ["0", "woken"]


def test_history_and_meta_json():
    hub = EventHub()
    assert hub.history_json() == b"[]"
    assert hub.meta_json() == "{}"
    hub.publish_epoch({"epoch": 1, "metrics": {"loss": None}})
    hub.publish_meta({"status": "running"})
    assert json.loads(hub.history_json()) == [{"epoch": 1, "metrics": {"loss": None}}]
    assert json.loads(hub.meta_json()) == {"status": "running"}
    assert hub.complete_json() is None


def test_a_message_is_one_sse_frame_and_its_data_is_sliced_from_it():
    message = Message("epoch", '{"epoch":1,"name":"caf\\u00e9"}', id=7)
    assert message.frame == b'id: 7\r\nevent: epoch\r\ndata: {"epoch":1,"name":"caf\\u00e9"}\r\n\r\n'
    assert json.loads(message.data) == {"epoch": 1, "name": "café"}
    multi = Message("note", "two\nlines")
    assert multi.frame == b"event: note\r\ndata: two\r\ndata: lines\r\n\r\n"
    assert multi.data == "two\nlines"
