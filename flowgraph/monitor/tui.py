"""The terminal dashboard: the browser dashboard's run view drawn with ``rich``, for machines reached by ssh.

Attach to a running dashboard from any terminal::

    python -m flowgraph.monitor.tui http://127.0.0.1:3000

or show it in the training process itself with ``Monitor(total_epochs, tui=True)``. Both draw the same view
(:func:`render`): the title and status, the epoch counter with a progress bar, elapsed time and ETA, one row
per metric with its latest, lowest and highest value and a unicode sparkline of the whole run, and the
last epoch's resources. Attached, the view reads the ``/events`` stream (:class:`~.sse_client.EventSource`):
a late attach first gets every past epoch once, a dropped connection resumes with ``Last-Event-ID``, and
the program exits after ``complete`` with the final view left on screen.

Needs ``rich`` (``pip install 'flowgraph[tui]'``).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .console import format_bytes, format_duration, format_eta, format_metric
from .sse_client import EventSource

__all__ = ["DashboardState", "TerminalDashboard", "attach", "main", "render", "render_text", "sparkline"]

SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int) -> str:
    """The values as a line of ``width`` block characters at most (lowest ▁, highest █; a gap for null).

    A longer series is drawn in ``width`` buckets, each the mean of its values, so the line always shows the
    whole run."""
    if width < 1 or not values:
        return ""
    if len(values) > width:
        buckets = []
        for i in range(width):
            part = [v for v in values[i * len(values) // width:(i + 1) * len(values) // width] if _finite(v)]
            buckets.append(sum(part) / len(part) if part else None)
        values = buckets
    finite = [v for v in values if _finite(v)]
    if not finite:
        return " " * len(values)
    low, high = min(finite), max(finite)
    top = len(SPARK_BARS) - 1
    chars = []
    for v in values:
        if not _finite(v):
            chars.append(" ")
        elif high == low:
            chars.append(SPARK_BARS[top // 2])
        else:
            chars.append(SPARK_BARS[round((v - low) / (high - low) * top)])
    return "".join(chars)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class DashboardState:
    """What the dashboard knows of the run: the metadata, the epoch objects (one per epoch number), the final
    object, and whether the stream is connected. Fed event by event (:meth:`apply`)."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.epochs: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.connection = "connecting"
        self._numbers: set[int] = set()
        self._lock = threading.Lock()

    def apply(self, event: str, data: Any) -> None:
        """Take one event of the ``/events`` stream (``meta``, ``epoch`` or ``complete``); others are ignored.

        An epoch already held (same ``epoch`` number) is not added again."""
        if not isinstance(data, dict):
            return
        with self._lock:
            if event == "meta":
                self.meta = data
            elif event == "epoch":
                number = data.get("epoch")
                if isinstance(number, int) and number not in self._numbers:
                    self._numbers.add(number)
                    self.epochs.append(data)
            elif event == "complete":
                self.final = data

    def snapshot(self) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None, str]:
        """``(meta, epochs, final, connection)`` as of now (a refresh thread may draw while events arrive)."""
        with self._lock:
            return dict(self.meta), list(self.epochs), self.final, self.connection


def _bar(done: int, total: int, width: int) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "█" * filled + "░" * (width - filled)


def render(state: DashboardState, width: int = 100) -> RenderableType:
    """The dashboard view of ``state`` for a terminal ``width`` columns wide."""
    meta, epochs, final, connection = state.snapshot()
    last = epochs[-1] if epochs else None
    total = int(meta.get("total") or (last or {}).get("total") or (final or {}).get("total") or 0)
    status = (final or {}).get("status") or meta.get("status") or "waiting"
    if connection == "reconnecting" and final is None:
        status = f"{status}, reconnecting"
    title = Text.assemble((str(meta.get("title") or "training"), "bold"), "  ", (status, _status_style(status)))
    done = int(last["epoch"]) if last else 0
    elapsed = final["elapsed"] if final else sum(float(e.get("seconds") or 0) for e in epochs)
    eta = None if final or not last or done >= total else last.get("eta")
    counter = Text(f"epoch {done}/{total}  {_bar(done, total, max(10, min(40, width - 50)))}  "
                   f"elapsed {format_duration(elapsed)}"
                   + ("" if final or done >= total else f"  ETA {format_eta(eta)}"))
    parts: list[RenderableType] = [title, counter]
    names: list[str] = []
    for e in epochs:
        for name in e.get("metrics") or {}:
            if name not in names:
                names.append(name)
    if names:
        curve = max(8, width - 52)
        table = Table(box=None, pad_edge=False, show_edge=False, expand=False)
        table.add_column("metric", style="cyan", no_wrap=True)
        for column in ("last", "min", "max"):
            table.add_column(column, justify="right", no_wrap=True)
        table.add_column(f"curve ({len(epochs)} epochs)", no_wrap=True, style="green")
        for name in names:
            series = [(e.get("metrics") or {}).get(name) for e in epochs]
            finite = [v for v in series if _finite(v)]
            table.add_row(name[:24], format_metric(series[-1] if _finite(series[-1]) else None),
                          format_metric(min(finite)) if finite else "-", format_metric(max(finite)) if finite else "-",
                          sparkline(series, curve))
        parts.append(table)
    resources = _resources(last.get("resources") if last else None)
    if resources:
        parts.append(Text(resources, style="dim"))
    if final is not None:
        mean = final.get("mean_epoch_seconds")
        parts.append(Text(f"{final.get('status')} after {final.get('epochs')}/{final.get('total')} epochs in "
                          f"{format_duration(final.get('elapsed'))}"
                          + (f" ({format_duration(mean)}/epoch)" if mean is not None else ""), style="bold"))
    return Group(*parts)


def _status_style(status: str) -> str:
    if status.startswith("completed"):
        return "green"
    if status.startswith("running"):
        return "yellow" if "reconnecting" in status else "blue"
    return "red"


def _resources(res: dict[str, Any] | None) -> str:
    if not res:
        return ""
    parts = []
    if "cpu" in res:
        parts.append(f"cpu {res['cpu']:.0f}%")
    if "ram_used" in res and "ram_total" in res:
        parts.append(f"ram {format_bytes(res['ram_used'])}/{format_bytes(res['ram_total'])}")
    if "gpu" in res:
        parts.append(f"gpu {res['gpu']:.0f}%")
    if "vram_used" in res and "vram_total" in res:
        parts.append(f"vram {format_bytes(res['vram_used'])}/{format_bytes(res['vram_total'])}")
    return "  ".join(parts)


def render_text(state: DashboardState, width: int = 100) -> str:
    """The view as plain text (no colours), ``width`` columns: what tests and logs compare."""
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, force_terminal=False)
    console.print(render(state, width))
    return console.export_text()


class TerminalDashboard:
    """The live view in a terminal: feed it events, it redraws (``refresh_per_second``) until :meth:`close`.

    ``Monitor(tui=True)`` feeds it from the training loop; :func:`attach` from a dashboard's ``/events``.
    On a stream that is not a terminal (a log file) only the final view is written, at :meth:`close`.
    """

    def __init__(self, stream: IO[str] | None = None, refresh_per_second: float = 4.0,
                 width: int | None = None) -> None:
        self.state = DashboardState()
        self.console = Console(file=stream if stream is not None else sys.stdout, width=width)
        self._live = Live(console=self.console, refresh_per_second=refresh_per_second, auto_refresh=True,
                          get_renderable=lambda: render(self.state, self.console.width), transient=False)
        self._started = False
        self._closed = False

    def apply(self, event: str, data: Any) -> None:
        """Take one event (``meta``, ``epoch``, ``complete``); the next redraw shows it."""
        if not self._started and not self._closed:
            self._live.start()
            self._started = True
        self.state.apply(event, data)

    def set_connection(self, status: str) -> None:
        """``"connected"`` or ``"reconnecting"``, shown next to the run's status."""
        self.state.connection = status

    def close(self) -> None:
        """Draw the final view and stop redrawing (the view stays on screen)."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            self._live.start()
        self._live.refresh()
        self._live.stop()
        if not self.console.is_terminal:
            self.console.line()  # rich leaves a non-terminal stream at the end of the view's last line


def attach(url: str, *, last_event_id: int | None = None, stream: IO[str] | None = None,
           refresh_per_second: float = 4.0, give_up_after: float = 60.0) -> dict[str, Any] | None:
    """Draw the dashboard at ``url`` in the terminal until the run completes; return the final object
    (None when the stream ended otherwise, e.g. Ctrl-C)."""
    view = TerminalDashboard(stream, refresh_per_second)
    source = EventSource(url, last_event_id, give_up_after=give_up_after, on_status=view.set_connection)
    try:
        for event in source:
            view.apply(event.event, event.data)
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
        view.close()
    return view.state.final


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flowgraph.monitor.tui URL``: 0 after ``complete``, 1 when the run was not seen to finish."""
    parser = argparse.ArgumentParser(prog="python -m flowgraph.monitor.tui",
                                     description="Show a running flowgraph dashboard in the terminal.")
    parser.add_argument("url", help="the dashboard's address, e.g. http://127.0.0.1:3000")
    parser.add_argument("--last-event-id", type=int, default=None,
                        help="start after this epoch id instead of from the first epoch")
    parser.add_argument("--give-up-after", type=float, default=60.0,
                        help="seconds without reaching the dashboard before giving up (default 60)")
    args = parser.parse_args(argv)
    final = attach(args.url, last_event_id=args.last_event_id, give_up_after=args.give_up_after)
    return 0 if final is not None else 1


if __name__ == "__main__":
    sys.exit(main())
