"""Fixtures for the monitor tests: a stand-in graph, monitors that always shut down, an SSE reader."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from flowgraph.monitor import Monitor

DOT_SOURCE = """digraph flowgraph {
  rankdir=TB;
  node [shape=box, style="rounded,filled", fillcolor="#eef2ff", color="#3b5bdb", fontname="Helvetica"];
  input [shape=ellipse, fillcolor="#ffffff"]; linear1 [label="Linear(2, 16)"]; gelu [label="GELU"];
  norm [label="LayerNorm(16)"]; residual [label="also: Linear(16, 16)"]; add [shape=circle, label="+"];
  linear2 [label="Linear(16, 2)"]; output [shape=ellipse, fillcolor="#ffffff"];
  input -> linear1 -> gelu -> norm -> residual -> add; norm -> add; add -> linear2 -> output;
}
"""


class FakeParameter:
    """What the monitor needs of a parameter tensor: numel() and requires_grad."""

    def __init__(self, numel: int, requires_grad: bool) -> None:
        self._numel = numel
        self.requires_grad = requires_grad

    def numel(self) -> int:
        return self._numel


class FakeGraph:
    """A duck-typed stand-in for flowgraph's Graph (the real one lives in another layer)."""

    def __init__(self, label: str | None = "classifier", device: str = "cpu", svg_works: bool = True) -> None:
        self.label = label
        self.device = device
        self.svg_works = svg_works
        self.metrics: dict[str, object] = {}
        self.svg_calls = 0

    def latest_metrics(self) -> dict[str, object]:
        return dict(self.metrics)

    def parameters(self):
        return [
            FakeParameter(32, True),
            FakeParameter(16, True),
            FakeParameter(256, False),
            FakeParameter(34, True),
        ]

    def structural_hash(self) -> str:
        return "3f9a1c0de4b2"

    def dot(self) -> str:
        return DOT_SOURCE

    def svg(self) -> str:
        self.svg_calls += 1
        if not self.svg_works or shutil.which("dot") is None:
            raise RuntimeError("Graphviz's dot program was not found; install graphviz")
        return subprocess.run(
            ["dot", "-Tsvg"], input=DOT_SOURCE, capture_output=True, text=True, check=True
        ).stdout


@pytest.fixture
def fake_graph() -> FakeGraph:
    return FakeGraph()


@pytest.fixture
def make_monitor() -> Iterator:
    """Build monitors that are closed (server stopped) at the end of the test, whatever happens."""
    made: list[Monitor] = []

    def make(total_epochs: int = 10, **kwargs) -> Monitor:
        kwargs.setdefault("quiet", True)
        mon = Monitor(total_epochs, **kwargs)
        made.append(mon)
        return mon

    yield make
    for mon in made:
        mon.close()
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("flowgraph-monitor")]
    assert not leftover, f"server threads left running: {leftover}"


@pytest.fixture
def served(make_monitor) -> Iterator:
    """A monitor serving on 127.0.0.1 with a free port."""

    def make(total_epochs: int = 10, **kwargs) -> Monitor:
        mon = make_monitor(total_epochs, **kwargs)
        mon.serve(port=0)
        return mon

    return make


@dataclass
class Event:
    event: str
    data: object
    id: str | None


def sse_events(response) -> Iterator[Event]:
    """Parse a streaming httpx response into SSE events (comments and pings skipped)."""
    name, data, event_id = "message", [], None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Event(name, json.loads("\n".join(data)), event_id)
            name, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                event_id = value


def metrics_for(epoch: int) -> dict[str, object]:
    """A plausible set of metrics for epoch ``epoch`` (zero-based), mixing floats, ints and a 0-d array."""
    return {
        "loss": 1.0 / (epoch + 1),
        "val_loss": np.float32(1.2 / (epoch + 1)),
        "acc": np.array(0.5 + 0.04 * epoch),
        "steps": 100,
    }
