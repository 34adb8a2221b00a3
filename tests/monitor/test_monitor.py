"""Monitor without a server: epoch objects, console lines, the ETA rule, progress bars, finishing."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from flowgraph.errors import FlowError
from flowgraph.monitor import Monitor
from flowgraph.monitor.console import epoch_line, format_bytes, format_duration, format_eta, format_metric
from flowgraph.monitor.eta import EtaEstimator

from .conftest import FakeGraph, metrics_for


def test_epoch_object_shape(make_monitor):
    mon = make_monitor(100)
    record = mon.log(2, 0.25, {"loss": 0.1234, "bad": float("nan"), "inf": math.inf, "n": 3})
    assert record["epoch"] == 3
    assert record["total"] == 100
    assert record["seconds"] == 0.25
    assert record["eta"] == pytest.approx(0.25 * 97)
    assert record["metrics"] == {"loss": 0.1234, "bad": None, "inf": None, "n": 3.0}
    assert set(record) == {"epoch", "total", "seconds", "eta", "metrics", "resources"}
    json.dumps(record, allow_nan=False)  # strict JSON: no NaN anywhere
    resources = record["resources"]
    assert 0 <= resources["cpu"] <= 100
    assert 0 < resources["ram_used"] <= resources["ram_total"]
    assert "gpu" not in resources and "vram_used" not in resources  # no NVML here: left out, not faked


def test_values_from_tensors_and_numpy_scalars(make_monitor):
    mon = make_monitor(10)
    record = mon.log(0, 0.1, metrics_for(0))
    assert record["metrics"] == {"loss": 1.0, "val_loss": pytest.approx(1.2), "acc": 0.5, "steps": 100.0}
    assert all(type(v) is float for v in record["metrics"].values())


def test_console_line_and_summary():
    out = io.StringIO()
    mon = Monitor(100, stream=out, progress_bar=False)
    mon.log(2, 0.25, {"loss": 0.1234})
    mon.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("epoch   3/100 loss=0.1234 [0.25s ETA 24s]")
    assert lines[0].endswith("GiB") or "ram" in lines[0]
    assert lines[-1].startswith("training completed after 1/100 epochs in ")
    assert "loss=0.1234" in lines[-1]


def test_quiet_prints_nothing():
    out = io.StringIO()
    mon = Monitor(3, stream=out, quiet=True)
    mon.log(0, 0.1, {"loss": 1.0})
    mon.finish()
    assert out.getvalue() == ""


def test_eta_is_a_moving_average_of_recent_epochs(make_monitor):
    mon = make_monitor(100, eta_window=3)
    mon.log(0, 30.0, {"loss": 1.0})  # a slow first epoch (warm-up) ...
    for epoch in range(1, 4):
        record = mon.log(epoch, 1.0, {"loss": 1.0})
    # ... no longer counts once it leaves the window: 96 epochs left at 1 s each
    assert record["eta"] == pytest.approx(96.0)
    mon2 = make_monitor(10)
    assert mon2.log(9, 5.0, {"loss": 1.0})["eta"] == 0.0


def test_eta_estimator_rule():
    eta = EtaEstimator(window=2)
    assert eta.remaining(5) is None
    eta.update(4.0)
    assert eta.remaining(5) == 20.0
    eta.update(2.0)
    eta.update(2.0)
    assert eta.seconds_per_epoch == 2.0
    assert eta.remaining(0) == 0.0
    with pytest.raises(FlowError, match="eta_window"):
        EtaEstimator(window=0)


def test_formatting():
    assert format_duration(0.25) == "0.25s"
    assert format_duration(75) == "1m15s"
    assert format_duration(3 * 3600 + 120) == "3h02m"
    assert format_duration(None) == "?"
    assert format_eta(24.4) == "24s"
    assert format_metric(0.12345) == "0.1235"
    assert format_metric(1e-6) == "1.000e-06"
    assert format_metric(None) == "nan"
    assert format_bytes(1536) == "1.5KiB"
    line = epoch_line(100, 100, {"loss": 0.5}, 1.0, 0.0, {})
    assert "ETA" not in line  # nothing left after the last epoch


def test_step_progress_bar_and_iterator():
    out = io.StringIO()
    mon = Monitor(2, stream=out)
    items = list(mon.steps(range(5)))
    assert items == [0, 1, 2, 3, 4]
    for step in range(4):
        mon.progress(step, 4)
    mon.log(0, 0.1, {"loss": 1.0})
    mon.finish()
    text = out.getvalue()
    assert "epoch 1/2" in text and "step" in text  # tqdm drew a bar labelled with the epoch in progress
    assert "epoch 1/2 loss=1.0000" in text


def test_progress_bar_can_be_turned_off():
    out = io.StringIO()
    mon = Monitor(2, stream=out, progress_bar=False)
    assert list(mon.steps(iter(range(3)))) == [0, 1, 2]
    mon.progress(0, 10)
    assert out.getvalue() == ""
    mon.close()


def test_graph_metadata_read_by_duck_typing(make_monitor):
    graph = FakeGraph(label="encoder", device="cpu")
    graph.metrics = {"loss": np.float64(0.5), "encoder.scan.loss": 0.25}
    mon = make_monitor(5)
    record = mon.log(0, 0.1, graph, extra={"lr": 1e-3})
    assert record["metrics"] == {"loss": 0.5, "encoder.scan.loss": 0.25, "lr": 1e-3}
    meta = mon._meta()
    assert meta["model"] == {
        "label": "encoder",
        "parameters": {"total": 338, "trainable": 82, "frozen": 256},
        "structural_hash": "3f9a1c0de4b2",
        "device": "cpu",
    }
    assert meta["title"] == "encoder"
    assert meta["graph"]["kind"] in ("svg", "dot")
    mon.log(1, 0.1, graph)
    assert graph.svg_calls <= 1  # the picture is taken once, not per epoch


def test_a_minimal_graph_needs_only_latest_metrics(make_monitor):
    class Minimal:
        def latest_metrics(self):
            return {"loss": 1.0}

    mon = make_monitor(5)
    assert mon.log(0, 0.1, Minimal())["metrics"] == {"loss": 1.0}
    assert mon._meta()["model"] == {}
    assert mon._meta()["graph"] == {"kind": "none"}


def test_failing_metadata_is_a_warning_not_a_crash(make_monitor):
    class Flaky(FakeGraph):
        def structural_hash(self):
            raise RuntimeError("no hash yet")

    graph = Flaky()
    graph.metrics = {"loss": 1.0}
    mon = make_monitor(5)
    with pytest.warns(RuntimeWarning, match="structural_hash"):
        mon.log(0, 0.1, graph)
    assert "structural_hash" not in mon._meta()["model"]


def test_watch_sets_the_picture_before_any_log(make_monitor):
    mon = make_monitor(5)
    mon.watch(FakeGraph(svg_works=False))
    assert mon._meta()["graph"]["kind"] == "dot"


class ProfiledGraph(FakeGraph):
    """A graph-like object with a per-node profile, node details and a profile-aware dot()."""

    def __init__(self) -> None:
        super().__init__(svg_works=False)
        self.seconds = 0.001
        self.dot_calls = 0

    def profile(self) -> dict[str, float]:
        return {"head": self.seconds}

    def dot(self, profile: bool = False) -> str:
        self.dot_calls += 1
        colour = f' [fillcolor="#ff{int(255 * (1 - min(self.seconds, 1.0))):02x}00"]' if profile else ""
        return f'digraph g {{ "head"{colour}; }}'

    def node_details(self, profile: bool = False) -> list[dict]:
        entry = {"id": "head", "path": "head", "parameters": 34, "frozen": "trainable"}
        if profile:
            entry["seconds"] = self.seconds
        return [entry]


def test_a_profiled_graph_picture_follows_its_profile(make_monitor, monkeypatch):
    from flowgraph.monitor import monitor as monitor_module

    graph = ProfiledGraph()
    graph.metrics = {"loss": 1.0}
    mon = make_monitor(5)
    mon.log(0, 0.1, graph)
    first = mon._meta()["graph"]
    assert first["kind"] == "dot" and "fillcolor" in first["dot"]
    assert first["nodes"] == [{"id": "head", "path": "head", "parameters": 34, "frozen": "trainable",
                               "seconds": 0.001}]
    graph.seconds = 0.5
    mon.log(1, 0.1, graph)  # within PROFILE_REFRESH_SECONDS: not re-read
    assert mon._meta()["graph"] == first
    monkeypatch.setattr(monitor_module, "PROFILE_REFRESH_SECONDS", 0.0)
    mon.log(2, 0.1, graph)
    assert mon._meta()["graph"]["nodes"][0]["seconds"] == 0.5
    assert mon._meta()["graph"]["dot"] != first["dot"]


def test_an_unprofiled_graph_picture_is_read_once(make_monitor, monkeypatch):
    from flowgraph.monitor import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "PROFILE_REFRESH_SECONDS", 0.0)
    graph = ProfiledGraph()
    graph.profile = lambda: {}  # profiling off
    graph.metrics = {"loss": 1.0}
    mon = make_monitor(5)
    for epoch in range(3):
        mon.log(epoch, 0.1, graph)
    assert graph.dot_calls == 1
    assert "fillcolor" not in mon._meta()["graph"]["dot"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.log(5, 0.1, {"loss": 1.0}), r"zero-based index 0\.\.4"),
        (lambda m: m.log(-1, 0.1, {"loss": 1.0}), "zero-based"),
        (lambda m: m.log(0, -1.0, {"loss": 1.0}), "seconds must be a finite"),
        (lambda m: m.log(0, "fast", {"loss": 1.0}), "seconds must be a number"),
        (lambda m: m.log(0, 0.1, [1, 2]), "expected a dict"),
        (lambda m: m.log(0, 0.1, {"loss": "low"}), "metric 'loss'.*not a number"),
        (lambda m: m.log(0, 0.1, {3: 1.0}), "non-empty strings"),
        (lambda m: m.finish("crashed"), "completed, interrupted, terminated, failed"),
        (lambda m: m.progress(-1, 10), "zero-based"),
    ],
)
def test_misuse_raises_flow_error(make_monitor, call, match):
    with pytest.raises(FlowError, match=match):
        call(make_monitor(5))


def test_bad_constructor_arguments():
    with pytest.raises(FlowError, match="total_epochs"):
        Monitor(0)
    with pytest.raises(FlowError, match="total_epochs"):
        Monitor(2.5)  # type: ignore[arg-type]


def test_log_after_finish_is_an_error_and_finish_is_idempotent(make_monitor):
    mon = make_monitor(5)
    mon.log(0, 0.1, {"loss": 1.0})
    final = mon.finish()
    assert final["status"] == "completed" and final["epochs"] == 1
    assert mon.finish("interrupted") is final
    assert mon.status == "completed"
    with pytest.raises(FlowError, match="already finished"):
        mon.log(1, 0.1, {"loss": 1.0})


def test_import_is_cheap_and_needs_no_server_packages():
    code = (
        "import sys\n"
        "import flowgraph\n"
        "before = set(sys.modules)\n"
        "import flowgraph.monitor\n"
        "server = {'starlette', 'uvicorn', 'sse_starlette'} & set(sys.modules)\n"
        "optional = {'tqdm', 'psutil', 'pynvml'} & (set(sys.modules) - before)\n"
        "print(sorted(server | optional))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
    blocked = (
        "import sys\n"
        "for name in ('starlette', 'uvicorn', 'sse_starlette'):\n"
        "    sys.modules[name] = None\n"
        "from flowgraph.monitor import Monitor\n"
        "from flowgraph.errors import FlowError\n"
        "mon = Monitor(2, quiet=True)\n"
        "mon.log(0, 0.1, {'loss': 1.0})\n"
        "try:\n"
        "    mon.serve(port=0)\n"
        "except FlowError as e:\n"
        "    print('FlowError', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60, check=True
    )
    assert "FlowError" in result.stdout and "flowgraph[monitor]" in result.stdout
