"""The event hub: atomic snapshot-and-subscribe, bounded queues, dropping clients that fall behind."""

from __future__ import annotations

import asyncio
import json
import threading

from flowgraph.monitor.hub import EventHub, Message, _Stop


async def drain(queue: asyncio.Queue) -> list:
    await asyncio.sleep(0.01)  # let call_soon_threadsafe callbacks run
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def test_snapshot_then_queue_holds_each_epoch_exactly_once():
    hub = EventHub(queue_size=10_000)
    for i in range(5):
        hub.publish_epoch({"epoch": i + 1})

    async def scenario():
        publisher = threading.Thread(
            target=lambda: [hub.publish_epoch({"epoch": i + 1}) for i in range(5, 2000)]
        )
        publisher.start()
        await asyncio.sleep(0)
        subscriber, snapshot = hub.subscribe()
        publisher.join()
        live = [m for m in await drain(subscriber.queue) if isinstance(m, Message)]
        return [json.loads(m.data)["epoch"] for m in snapshot.epochs + live]

    assert asyncio.run(scenario()) == list(range(1, 2001))


def test_full_queue_drops_the_client_and_ends_its_stream():
    hub = EventHub(queue_size=3)

    async def scenario():
        subscriber, _ = hub.subscribe()
        for i in range(10):
            hub.publish_epoch({"epoch": i})
        items = await drain(subscriber.queue)
        return subscriber, items

    subscriber, items = asyncio.run(scenario())
    assert subscriber.dropped
    assert len(items) == 1 and isinstance(items[0], _Stop) and items[0].reason == "dropped"
    assert hub.dropped_count == 1
    hub.publish_epoch({"epoch": 99})  # the stopped subscriber is forgotten on the next publish
    assert hub.subscriber_count == 0


def test_close_lets_queued_events_through_before_ending():
    hub = EventHub(queue_size=10)

    async def scenario():
        subscriber, _ = hub.subscribe()
        hub.publish_epoch({"epoch": 1})
        hub.publish_complete({"status": "completed"})
        hub.close()
        return await drain(subscriber.queue)

    items = asyncio.run(scenario())
    assert [getattr(i, "event", None) for i in items] == ["epoch", "complete", None]
    assert isinstance(items[-1], _Stop) and items[-1].reason == "closed"


def test_history_and_meta_json():
    hub = EventHub()
    assert hub.history_json() == "[]"
    assert hub.meta_json() == "{}"
    hub.publish_epoch({"epoch": 1, "metrics": {"loss": None}})
    hub.publish_meta({"status": "running"})
    assert json.loads(hub.history_json()) == [{"epoch": 1, "metrics": {"loss": None}}]
    assert json.loads(hub.meta_json()) == {"status": "running"}
    assert hub.complete_json() is None
