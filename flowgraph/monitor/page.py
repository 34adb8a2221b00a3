"""The dashboard page: the packaged static files, and the self-contained report built from them."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

_CSS_LINK = '<link rel="stylesheet" href="static/dashboard.css">'
_JS_SCRIPT = '<script src="static/dashboard.js"></script>'


@cache
def asset_text(name: str) -> str:
    """A file of ``flowgraph/monitor/static/`` as text (shipped as package data)."""
    return resources.files("flowgraph.monitor").joinpath("static", name).read_text(encoding="utf-8")


def dashboard_html() -> str:
    """The live dashboard page; it loads its script and style from ``static/`` and data from ``/events``."""
    return asset_text("index.html")


def _script_safe(text: str) -> str:
    """Text that cannot close or confuse the ``<script>`` element it is embedded in."""
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def report_html(data: dict[str, Any]) -> str:
    """The dashboard with its style, script and ``data`` inlined: a single file that opens offline.

    ``data`` holds ``meta``, ``epochs``, ``complete`` and ``graph_svg``; the script renders it instead of
    connecting to a server. A graph with DOT source but no SVG (no Graphviz where the run was) gets the
    vendored viz.js inlined too (about 1.3 MB), so the report draws the diagram offline.
    """
    page = asset_text("index.html")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    style = "<style>\n" + asset_text("dashboard.css") + "\n</style>"
    graph = (data.get("meta") or {}).get("graph") or {}
    viz = ""
    if graph.get("kind") == "dot" and not data.get("graph_svg"):
        viz = f"<script>\n{_script_safe(asset_text('viz-global.js'))}\n</script>\n"
    script = (
        f'<script type="application/json" id="flowgraph-report">{payload}</script>\n'
        f"{viz}<script>\n{_script_safe(asset_text('dashboard.js'))}\n</script>"
    )
    if _CSS_LINK not in page or _JS_SCRIPT not in page:
        raise RuntimeError("flowgraph/monitor/static/index.html lost its stylesheet or script tag")
    page = page.replace(_CSS_LINK, style).replace(_JS_SCRIPT, script)
    return page.replace("<title>flowgraph monitor</title>", "<title>flowgraph training report</title>")
