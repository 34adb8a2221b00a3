"""CSV export, the self-contained HTML report, and ending a run by Ctrl-C or an exception."""

from __future__ import annotations

import csv
import json
import re
import threading

import httpx
import pytest

from flowgraph.errors import FlowError
from flowgraph.monitor import Monitor

from .conftest import FakeGraph, sse_events


def embedded_data(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="flowgraph-report">(.*?)</script>', html, re.S)
    assert match, "the report has no embedded data"
    return json.loads(match.group(1))


def test_csv_columns_follow_metric_names(make_monitor, tmp_path):
    mon = make_monitor(4)
    mon.log(0, 0.5, {"loss": 1.0})
    mon.log(1, 0.25, {"loss": 0.5, "val_loss": 0.75})  # appears later
    mon.log(2, 0.25, {"loss": float("nan"), "encoder.scan.loss": 0.1})  # only from a subtree; loss not finite
    mon.log(3, 0.25, {"epoch": 7.0})  # a metric named like a fixed column
    path = mon.export_csv(tmp_path / "training.csv")
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0].keys())
    assert header[:7] == ["epoch", "total", "seconds", "eta", "loss", "val_loss", "encoder.scan.loss"]
    assert header[7] == "metric.epoch"
    assert [h for h in header if h.startswith("resource.")][:3] == [
        "resource.cpu",
        "resource.ram_used",
        "resource.ram_total",
    ]
    assert [r["epoch"] for r in rows] == ["1", "2", "3", "4"]
    assert rows[0]["loss"] == "1.0" and rows[0]["val_loss"] == "" and rows[0]["encoder.scan.loss"] == ""
    assert rows[1]["val_loss"] == "0.75"
    assert rows[2]["loss"] == "" and rows[2]["encoder.scan.loss"] == "0.1"
    assert rows[3]["metric.epoch"] == "7.0" and rows[3]["loss"] == ""
    assert float(rows[0]["seconds"]) == 0.5 and rows[0]["total"] == "4"
    assert float(rows[0]["resource.ram_total"]) > 0


def test_csv_with_no_epochs_has_only_a_header(make_monitor, tmp_path):
    path = make_monitor(3).export_csv(tmp_path / "empty.csv")
    assert path.read_text().strip() == "epoch,total,seconds,eta"


def test_html_report_is_self_contained(make_monitor, tmp_path):
    graph = FakeGraph()
    mon = make_monitor(5)
    for epoch in range(3):
        graph.metrics = {"loss": 1.0 / (epoch + 1), "val/loss": None, "note": float("inf")}
        mon.log(epoch, 0.2, graph)
    html = mon.save_html(tmp_path / "report.html").read_text()
    assert "<title>flowgraph training report</title>" in html
    assert 'src="static/' not in html and 'href="static/' not in html  # nothing to fetch
    assert "http://" not in html.replace("http://www.w3.org", "")  # no CDN, no server
    assert "<style>" in html and "function groupOf" in html
    data = embedded_data(html)
    assert [e["epoch"] for e in data["epochs"]] == [1, 2, 3]
    assert data["epochs"][0]["metrics"] == {"loss": 1.0, "val/loss": None, "note": None}
    assert data["meta"]["model"]["label"] == "classifier"
    assert data["complete"] is None  # saved mid-run
    if data["meta"]["graph"]["kind"] == "svg":
        assert data["graph_svg"].lstrip().startswith("<")


def test_report_embeds_text_that_looks_like_html_safely(make_monitor, tmp_path):
    mon = make_monitor(2, title="</script><script>alert(1)</script>")
    mon.log(0, 0.1, {"</script>": 1.0})
    html = mon.save_html(tmp_path / "r.html").read_text()
    assert html.count("</script>") == 2  # the data and the code elements; the title cannot close either
    assert embedded_data(html)["meta"]["title"] == "</script><script>alert(1)</script>"


def test_finish_writes_the_report(tmp_path):
    path = tmp_path / "out" / "report.html"
    path.parent.mkdir()
    mon = Monitor(3, report_path=path, quiet=True)
    mon.log(0, 0.1, {"loss": 1.0})
    mon.finish()
    data = embedded_data(path.read_text())
    assert data["complete"]["status"] == "completed"
    assert data["meta"]["status"] == "completed"


def test_unwritable_report_path_is_a_flow_error(tmp_path):
    with pytest.raises(FlowError, match="report_path .* is in a folder that does not exist"):
        Monitor(3, report_path=tmp_path / "missing-dir" / "report.html", quiet=True)
    folder = tmp_path / "removed-during-the-run"
    folder.mkdir()
    mon = Monitor(3, report_path=folder / "report.html", quiet=True)
    folder.rmdir()
    with pytest.raises(FlowError, match="could not write the report"):
        mon.finish()
    with pytest.raises(FlowError, match="cannot write"):
        mon.export_csv(tmp_path / "missing-dir" / "x.csv")


def test_ctrl_c_still_writes_the_report_and_sends_interrupted(tmp_path):
    path = tmp_path / "report.html"
    seen: list = []
    connected = threading.Event()

    def listen(url):
        with httpx.Client(timeout=10) as client, client.stream("GET", url + "/events") as response:
            for event in sse_events(response):
                seen.append(event)
                if event.event == "meta":
                    connected.set()

    listener = None
    with pytest.raises(KeyboardInterrupt):
        with Monitor(10, report_path=path, quiet=True) as mon:
            mon.serve(port=0)
            listener = threading.Thread(target=listen, args=(mon.url,))
            listener.start()
            assert connected.wait(10)
            mon.log(0, 0.1, {"loss": 1.0})
            raise KeyboardInterrupt
    listener.join(10)
    assert not listener.is_alive()
    assert mon.status == "interrupted" and mon.url is None
    assert seen[-1].event == "complete" and seen[-1].data["status"] == "interrupted"
    assert [e.data["epoch"] for e in seen if e.event == "epoch"] == [1]
    assert embedded_data(path.read_text())["complete"]["status"] == "interrupted"


def test_an_exception_marks_the_run_failed(tmp_path):
    with pytest.raises(ValueError):
        with Monitor(3, quiet=True) as mon:
            mon.log(0, 0.1, {"loss": 1.0})
            raise ValueError("bad batch")
    assert mon.status == "failed"


def test_context_manager_finishes_a_normal_run():
    with Monitor(1, quiet=True) as mon:
        mon.log(0, 0.1, {"loss": 1.0})
    assert mon.status == "completed"
    assert mon.history[0]["metrics"] == {"loss": 1.0}


def test_report_inlines_the_graph_renderer_only_without_an_svg(make_monitor, tmp_path):
    graph = FakeGraph(svg_works=False)  # no SVG: the report carries viz.js and draws the DOT itself
    graph.metrics = {"loss": 1.0}
    mon = make_monitor(2)
    mon.log(0, 0.1, graph)
    html = mon.save_html(tmp_path / "dot.html").read_text()
    assert embedded_data(html)["meta"]["graph"]["kind"] == "dot"
    assert "viz_layout" in html  # the vendored Graphviz (WebAssembly)
    assert "http://" not in html.replace("http://www.w3.org", "")  # still nothing fetched
    plain = make_monitor(2)
    plain.log(0, 0.1, {"loss": 1.0})  # no graph at all: no renderer
    assert "viz_layout" not in plain.save_html(tmp_path / "plain.html").read_text()
