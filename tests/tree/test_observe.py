"""Observation: record, collect, flush, latest_metrics order, history, trends, eta, plot_html."""

import math

import pytest

import flowgraph as fg
from flowgraph.errors import FlowError, PathError


def test_record_flush_latest_metrics_deterministic_order(model):
    model.record_at("encoder.scan.loss", 0.3)
    model.record("loss", 0.5)
    model.record_at("encoder.aux", 1.0)
    model.record("loss", 1.5)
    assert model.latest_metrics() == {}
    flushed = model.flush()
    assert flushed == {"loss": 1.0, "encoder.aux": 1.0, "encoder.scan.loss": 0.3}
    assert list(model.latest_metrics()) == ["loss", "encoder.aux", "encoder.scan.loss"]
    model.record("loss", fg.tensor(2.0))
    model.flush()
    assert model.history("loss") == [1.0, 2.0]
    assert model.history("encoder.scan.loss") == [0.3]


def test_collect_scalarises_tagged_outputs(model):
    x = fg.randn(8, 4)
    model.eval()
    out = model(x)
    got = model.collect(["classifier", "norm"], reduce="mean")
    assert got["classifier"] == pytest.approx(out.mean().item(), rel=1e-5)
    model.flush()
    assert "classifier" in model.latest_metrics()
    with pytest.raises(FlowError, match="no value for that tag"):
        model.collect("nope")
    with pytest.raises(FlowError, match="reduce must be"):
        model.collect("norm", reduce="median")


def test_trends_through_the_tree(model):
    for v in [1.0, 0.8, 0.6, 0.5]:
        model.record("loss", v)
        model.record_at("encoder.scan.acc", 1 - v, mode="max")
        model.flush()
    assert model.trend("loss").improving()
    assert model.trend_at("encoder.scan.acc").improving()
    assert model.trends("loss", "encoder.scan.acc").all_improving()
    assert model.trend("loss").latest == 0.5
    with pytest.raises(FlowError):
        model.trend("nothing")
    with pytest.raises(PathError):
        model.trend("encodr.scan.acc")


def test_eta_from_flush_times(model):
    assert math.isnan(model.eta(10))
    for _ in range(3):
        model.record("loss", 1.0)
        model.flush()
    assert model.eta(10) >= 0


def test_plot_html_is_self_contained(model, tmp_path):
    for v in [1.0, 0.5]:
        model.record("loss", v)
        model.flush()
    path = model.plot_html(tmp_path / "p.html", ["loss"])
    text = open(path).read()
    assert "<svg" in text and "polyline" in text and "http" not in text.replace("http://www.w3.org", "")
