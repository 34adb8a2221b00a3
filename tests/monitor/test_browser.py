"""The dashboard in a real browser: headless Chromium driven by Playwright (never `playwright install`).

Run with FLOWGRAPH_UPDATE_SCREENSHOT=1 to refresh docs/images/dashboard.png from this test's screenshot.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import pytest

from .conftest import FakeGraph

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"headless browser test needs Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api", reason="headless browser test needs playwright")
    sync_api.expect.set_options(timeout=10_000)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def browser_page(browser):
    """A fresh page, and the list of script errors and failed loads it reports."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="light")
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.set_default_timeout(10_000)
        yield page, errors
    finally:
        context.close()


def training_metrics(epoch: int) -> dict[str, float]:
    """Smooth, plausible curves for a classifier with an adaptive-computation encoder."""
    t = epoch + 1
    wobble = 0.015 * math.sin(t * 1.7)
    return {
        "loss": 1.9 * math.exp(-t / 7) + 0.08 + wobble,
        "val_loss": 1.95 * math.exp(-t / 8) + 0.14 + 1.5 * wobble,
        "train/acc": 0.97 - 0.6 * math.exp(-t / 6) + wobble / 3,
        "val/acc": 0.93 - 0.6 * math.exp(-t / 7) + wobble / 2,
        "encoder.scan.loss": 0.6 * math.exp(-t / 10) + 0.02,
        "encoder.scan.halt_rate": 0.35 + 0.4 * (1 - math.exp(-t / 9)),
        "lr": 1e-3 * 0.5 * (1 + math.cos(math.pi * epoch / 40)),
    }


def test_dashboard_shows_past_and_live_epochs(served, browser_page, tmp_path):
    from playwright.sync_api import expect

    page, errors = browser_page
    graph = FakeGraph(label="classifier")
    mon = served(40)
    for epoch in range(24):
        started = time.perf_counter()
        while time.perf_counter() - started < 0.02:  # some real work, so the CPU curve has something to show
            sum(i * i for i in range(2000))
        graph.metrics = training_metrics(epoch)
        mon.log(epoch, 0.42 + 0.03 * math.sin(epoch), graph)

    page.goto(mon.url)
    rows = page.locator("#epochs tbody tr")
    rows.nth(23).wait_for()  # every past epoch, from the snapshot
    assert rows.count() == 24
    assert rows.first.get_attribute("data-epoch") == "24"  # newest first

    graph.metrics = training_metrics(24)
    mon.log(24, 0.43, graph)  # a live epoch arrives
    expect(rows).to_have_count(25)
    assert rows.first.get_attribute("data-epoch") == "25"
    assert page.locator("#epoch-done").inner_text() == "25"
    assert page.locator("#status").inner_text().lower() == "running"
    assert page.locator("#eta").inner_text() not in ("", "–")

    titles = page.locator(".chart-head h3").all_inner_texts()
    for expected in ("loss", "acc", "encoder.scan", "lr", "Utilisation (%)", "Epoch time (s)"):
        assert expected in titles or any(t.startswith(expected) for t in titles), (expected, titles)
    legend = page.locator('[data-chart="metric:loss"] .legend button').all_inner_texts()
    assert legend == ["loss", "val_loss"]
    group_of = "name => window.flowgraphMonitor.groupOf(name)"
    assert page.evaluate(group_of, "val/acc") == "acc"
    assert page.evaluate(group_of, "loss_train") == "loss"
    assert page.evaluate(group_of, "encoder.scan.loss") == "encoder.scan"

    toggle = page.locator('[data-chart="metric:loss"] .legend button').first
    toggle.click()
    assert toggle.get_attribute("aria-pressed") == "false"
    toggle.click()
    log_button = page.locator('[data-chart="metric:loss"] .toggle')
    log_button.click()
    assert log_button.get_attribute("aria-pressed") == "true"
    log_button.click()

    assert "classifier" in page.locator("#model").inner_text()
    assert "338" in page.locator("#model").inner_text()
    picture = page.locator("#graph svg.graph-svg")  # Graphviz's SVG, or the DOT drawn in the page by viz.js
    expect(picture).to_be_visible()
    assert page.locator("#graph").get_attribute("data-renderer") == ("server" if shutil.which("dot") else "browser")
    assert picture.locator("g.node").count() >= 3

    page.locator('[data-chart="metric:loss"] canvas').hover()  # show a tooltip in the screenshot
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("FLOWGRAPH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)

    mon.finish(keep_serving=True)
    expect(page.locator("#status")).to_have_attribute("data-status", "completed")
    assert errors == []


def test_saved_report_opens_offline(make_monitor, browser_page, tmp_path):
    page, errors = browser_page
    graph = FakeGraph(label="report-model", svg_works=False)
    mon = make_monitor(10)
    for epoch in range(6):
        graph.metrics = training_metrics(epoch)
        mon.log(epoch, 0.2, graph)
    mon.finish("interrupted")
    path = mon.save_html(tmp_path / "report.html")
    offline = lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort()
    page.route("**/*", offline)  # any network request would fail the page
    page.goto(path.as_uri())
    page.locator("#epochs tbody tr").nth(5).wait_for()
    assert page.locator("#epochs tbody tr").count() == 6
    assert page.locator("#status").inner_text().lower() == "interrupted"
    # Graphviz "failed" where the run was: the report draws the DOT itself with its inlined viz.js, offline
    expect_svg = page.locator("#graph svg.graph-svg")
    expect_svg.wait_for()
    assert page.locator("#graph").get_attribute("data-renderer") == "browser"
    assert expect_svg.locator("g.node").count() >= 3
    assert page.locator(".chart-head h3").count() >= 4
    assert errors == []
