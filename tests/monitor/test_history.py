"""The epoch history is held once and bounded: recent epochs in full, older ones thinned evenly."""

from __future__ import annotations

import json

import pytest

from flowgraph.errors import FlowError
from flowgraph.monitor import Monitor
from flowgraph.monitor.history import EpochHistory, Message


def fill(limit: int, count: int) -> EpochHistory:
    history = EpochHistory(limit)
    for i in range(count):
        history.append(Message("epoch", str(i), id=i))
    return history


def test_a_short_run_is_held_in_full():
    history = fill(100, 50)
    assert [m.id for m in history.messages()] == list(range(50))
    assert not history.thinned


@pytest.mark.parametrize("count", [1_001, 10_000, 200_000])
def test_a_long_run_holds_at_most_the_limit_recent_in_full_older_evenly(count):
    limit = 1000
    history = fill(limit, count)
    ids = [m.id for m in history.messages()]
    assert len(ids) <= limit
    assert history.thinned and history.count == count
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    recent = ids[-history.recent_size:]
    assert recent == list(range(count - history.recent_size, count))
    older = ids[: len(ids) - history.recent_size]
    assert older[0] == 0  # the start of the run stays
    gaps = {b - a for a, b in zip(older, older[1:])}
    assert gaps == {history.stride}  # evenly spaced


def test_after_returns_what_a_client_has_not_seen_thinned_part_included():
    history = fill(10, 100)
    held = [m.id for m in history.messages()]
    assert [m.id for m in history.after(97)] == [98, 99]
    assert [m.id for m in history.after(99)] == []
    assert [m.id for m in history.after(-1)] == held
    assert [m.id for m in history.after(10)] == [i for i in held if i > 10]


def test_the_limit_is_checked():
    with pytest.raises(ValueError, match=">= 2"):
        EpochHistory(1)
    with pytest.raises(FlowError, match="history_limit"):
        Monitor(10, history_limit=0)


def test_a_monitor_holds_each_epoch_once_and_at_most_history_limit(tmp_path):
    mon = Monitor(50_000, quiet=True, history_limit=200)
    mon._sampler.sample = lambda device=None: {}
    for epoch in range(50_000):
        mon.log(epoch, 0.001, {"loss": 1.0 / (epoch + 1)})
    history = mon.history
    assert len(history) <= 200 and mon.epochs_logged == 50_000
    assert history[-1]["epoch"] == 50_000 and history[0]["epoch"] == 1
    assert not hasattr(mon, "_history")  # the hub's JSON is the only copy
    final = mon.finish()
    assert final["epochs"] == 50_000
    assert final["final_metrics"] == {"loss": pytest.approx(1 / 50_000)}
    assert final["mean_epoch_seconds"] == pytest.approx(0.001)
    report = mon.save_html(tmp_path / "r.html").read_text()
    assert len(json.loads(mon._hub.history_json())) == len(history)
    assert '"epoch":50000' in report
