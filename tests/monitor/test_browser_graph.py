"""The dashboard's graph picture in headless Chromium: drawn in the page by the vendored viz.js when the
server has no Graphviz, one SVG node per graph node, and a click shows a node's path, parameters and state."""

from __future__ import annotations

import re
import shutil

import pytest

from . import test_browser

browser = test_browser.browser  # the suite's headless Chromium and page fixtures
browser_page = test_browser.browser_page

pytestmark = pytest.mark.browser


def _model():
    import flowgraph as fg
    from flowgraph import nn
    from flowgraph.builder import FlowBuilder, MergeOp

    fg.manual_seed(0)
    encoder = (FlowBuilder.from_(nn.Linear(8, 16)).through(nn.GELU())
               .also(nn.Sequential(nn.Linear(16, 16), nn.Tanh())).tag("hidden").label("encoder").build())
    graph = (FlowBuilder.from_(encoder).tag("encoded")
             .split(nn.Linear(16, 16), nn.Linear(16, 16)).merge(MergeOp.MEAN)
             .loop_body(nn.Tanh()).for_n(2)
             .gate(nn.SoftmaxRouter(16, 2), [nn.Linear(16, 16), nn.Linear(16, 16)])
             .through(nn.Linear(16, 2)).tag("head").label("demo").build())
    graph.freeze("encoder")
    return graph


def _node_ids(dot: str) -> list[str]:
    return re.findall(r'id="fg:([^"]+)"', dot)


@pytest.fixture
def no_dot(monkeypatch, tmp_path):
    """Graphviz's ``dot`` program out of reach (an empty PATH for this process)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("dot") is None


def test_graph_is_drawn_in_the_browser_without_dot(no_dot, served, browser_page):
    from playwright.sync_api import expect

    page, errors = browser_page
    graph = _model()
    with pytest.raises(Exception, match="dot"):
        graph.svg()  # really unavailable
    mon = served(3)
    mon.watch(graph)
    assert mon._meta()["graph"]["kind"] == "dot"
    page.goto(mon.url)
    picture = page.locator("#graph svg.graph-svg")
    expect(picture).to_be_visible(timeout=30_000)
    assert page.locator("#graph").get_attribute("data-renderer") == "browser"
    ids = _node_ids(graph.dot())
    assert len(ids) == len(graph.node_details()) >= 10
    drawn = picture.locator("g.node").evaluate_all("nodes => nodes.map(n => n.id)")
    assert sorted(drawn) == sorted("fg:" + i for i in ids)  # one SVG node per graph node

    page.locator('[id="fg:encoder.from_0"]').click()
    panel = page.locator("#graph-panel")
    expect(panel).to_have_attribute("data-path", "encoder.from_0")
    assert panel.locator('[data-field="parameters"] dd').inner_text() == "144"  # Linear(8, 16)
    assert panel.locator('[data-field="frozen"] dd').inner_text() == "frozen"
    page.locator('[id="fg:head"]').click()
    expect(panel).to_have_attribute("data-path", "head")
    assert panel.locator('[data-field="frozen"] dd').inner_text() == "trainable"
    assert panel.locator('[data-field="parameters"] dd').inner_text() == "34"
    assert not errors


def test_profile_heat_and_time_in_the_panel(no_dot, served, browser_page):
    from playwright.sync_api import expect

    import flowgraph as fg

    page, errors = browser_page
    graph = _model().enable_profiling()
    graph(fg.randn(4, 8))
    mon = served(3)
    mon.watch(graph)
    page.goto(mon.url)
    picture = page.locator("#graph svg.graph-svg")
    expect(picture).to_be_visible(timeout=30_000)
    fills = picture.locator('[id="fg:gate_0"] polygon').first.get_attribute("fill")
    assert fills and fills.lower() not in ("none", "white", "#ffffff")  # heat-coloured
    page.locator('[id="fg:gate_0"]').click()
    time_text = page.locator('#graph-panel [data-field="time"] dd').inner_text()
    assert re.match(r"\d+\.\d{3} ms \(\d+% of the forward\)", time_text)
    assert not errors


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot for the server-side fast path")
def test_server_svg_is_inlined_and_clickable(served, browser_page):
    from playwright.sync_api import expect

    page, errors = browser_page
    graph = _model()
    mon = served(3)
    mon.watch(graph)
    page.goto(mon.url)
    picture = page.locator("#graph svg.graph-svg")
    expect(picture).to_be_visible()
    assert page.locator("#graph").get_attribute("data-renderer") == "server"
    assert picture.locator("g.node").count() == len(graph.node_details())
    page.locator('[id="fg:encoder.hidden"]').click()
    expect(page.locator("#graph-panel")).to_have_attribute("data-path", "encoder.hidden")
    assert not errors


def test_offline_report_draws_the_dot_without_graphviz(no_dot, make_monitor, browser_page, tmp_path):
    from playwright.sync_api import expect

    page, errors = browser_page
    graph = _model()
    mon = make_monitor(2)
    mon.watch(graph)
    mon.log(0, 0.1, {"loss": 1.0})
    report = mon.save_html(tmp_path / "report.html")
    assert "viz_layout" in report.read_text()  # viz.js inlined: the file needs no network
    page.goto(report.as_uri())
    picture = page.locator("#graph svg.graph-svg")
    expect(picture).to_be_visible(timeout=30_000)
    assert picture.locator("g.node").count() == len(graph.node_details())
    page.locator('[id="fg:head"]').click()
    expect(page.locator("#graph-panel")).to_have_attribute("data-path", "head")
    assert not errors
