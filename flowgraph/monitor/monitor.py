"""The training monitor: console lines with an adaptive ETA, a live dashboard, an HTML report and a CSV."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from flowgraph.errors import FlowError

from .console import epoch_line, format_duration, format_metric
from .eta import EtaEstimator
from .hub import EventHub
from .page import report_html
from .progress import StepProgress
from .resources import ResourceSampler
from .source import (
    GraphMetadata,
    GraphPicture,
    MetadataReader,
    MetricSource,
    has_profile,
    is_graph,
    read_metrics,
    read_picture,
)

T = TypeVar("T")

#: A logged graph with a profile (``enable_profiling()``) has its picture's heat re-read at most this often.
PROFILE_REFRESH_SECONDS = 5.0

STATUSES = ("completed", "interrupted", "terminated", "failed")


_CSV_FIXED = ("epoch", "total", "seconds", "eta")
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM


class Terminated(SystemExit):
    """Raised in the main thread when the process gets SIGTERM (what launchers, Slurm and Kubernetes send)
    inside ``with Monitor(...)``: the run unwinds like a Ctrl-C (``finally`` blocks run, the report and CSV
    are written, status ``terminated``), then the process exits with status 143 and no traceback.

    A ``SystemExit``, not a ``KeyboardInterrupt`` nor an ``Exception``: ``except Exception`` in a training
    loop does not swallow it, and it is not mistaken for a Ctrl-C.
    """

    def __init__(self) -> None:
        super().__init__(SIGTERM_EXIT_CODE)


def _raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler installed by ``with Monitor(...)``."""
    raise Terminated()


class Monitor:
    """Watches a training run: one console line per epoch, a live dashboard, a report at the end.

    ``epoch`` passed to :meth:`log` is the zero-based loop index (``for epoch in range(total_epochs)``);
    the console, the dashboard and the epoch objects show the one-based number, ``epoch 3/100`` for index 2.

    >>> mon = Monitor(total_epochs=100, report_path="report.html")   # doctest: +SKIP
    >>> mon.serve(port=3000)                       # live dashboard on http://127.0.0.1:3000
    >>> for epoch in range(100):
    ...     start = time.perf_counter()
    ...     for batch in mon.steps(loader):        # a per-step progress bar inside the epoch
    ...         ...
    ...     g.flush()
    ...     mon.log(epoch, time.perf_counter() - start, g)   # or a dict: {"loss": 0.12, "val/loss": 0.15}
    >>> mon.finish()                               # summary, final 'complete' event, report written

    Used as a context manager, a Ctrl-C (``KeyboardInterrupt``) still ends the run properly: the report is
    written and dashboards receive ``complete`` with status ``interrupted``.

    Args:
        total_epochs: the number of epochs planned (the ``N`` of ``epoch k/N`` and of the ETA).
        report_path: where :meth:`finish` writes the self-contained HTML report; None for no report.
        quiet: no console output at all (no epoch lines, no progress bars, no summary).
        progress_bar: draw a tqdm bar for :meth:`progress` / :meth:`steps` (when tqdm is installed).
        eta_window: how many recent epochs the ETA's moving average covers.
        stream: where console lines and bars go (default ``sys.stderr``).
        title: a title for the dashboard (default: the graph's label, else ``"training"``).
        client_queue_size: how many epochs a dashboard client that stopped reading may fall behind before
            it is dropped (its browser reconnects and resumes where it left off).
        history_limit: epochs held in memory at most (for the dashboard, :attr:`history`, the report): a
            longer run keeps the newest ``history_limit / 2`` in full and thins older ones evenly.
        csv_path: where :meth:`finish` writes the CSV of every epoch, whatever the status (also after a
            Ctrl-C or SIGTERM); epochs are spooled to a hidden file beside it while the run goes on, so the
            CSV holds every epoch however long the run. None for no CSV (:meth:`export_csv` still works).
        tui: draw a live terminal dashboard in ``stream`` (a metric table with a sparkline per metric, the
            epoch counter, ETA and resources; :mod:`flowgraph.monitor.tui`, needs ``rich``) instead of a line
            per epoch and the step bar. The same view attaches to a served run from another terminal with
            ``python -m flowgraph.monitor.tui URL``.
    """

    def __init__(
        self,
        total_epochs: int,
        *,
        report_path: str | os.PathLike[str] | None = None,
        quiet: bool = False,
        progress_bar: bool = True,
        eta_window: int = 10,
        stream: IO[str] | None = None,
        title: str | None = None,
        client_queue_size: int = 1024,
        history_limit: int = 10_000,
        csv_path: str | os.PathLike[str] | None = None,
        tui: bool = False,
    ) -> None:
        if not isinstance(total_epochs, int) or isinstance(total_epochs, bool) or total_epochs < 1:
            raise FlowError(f"Monitor: total_epochs must be a positive int, got {total_epochs!r}")
        if not isinstance(client_queue_size, int) or client_queue_size < 1:
            raise FlowError(f"Monitor: client_queue_size must be a positive int, got {client_queue_size!r}")
        if not isinstance(history_limit, int) or isinstance(history_limit, bool) or history_limit < 2:
            raise FlowError(f"Monitor: history_limit must be an int >= 2, got {history_limit!r}")
        if not isinstance(tui, bool):
            raise FlowError(f"Monitor: tui must be True or False, got {tui!r}")
        if tui and quiet:
            raise FlowError("Monitor: tui=True draws the terminal dashboard and quiet=True prints nothing; "
                            "choose one")
        from ..distributed import is_main_process

        #: False on ranks other than 0 of a ``flowgraph.distributed`` process group: there the monitor keeps
        #: its history but prints nothing, serves no dashboard and writes no report or export.
        self.main_process = is_main_process()
        quiet = quiet or not self.main_process
        self.total_epochs = total_epochs
        for name, value in (("report_path", report_path), ("csv_path", csv_path)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise FlowError(f"Monitor: {name} must be a str, an os.PathLike or None, got {value!r}")
        self.report_path = None if report_path is None or not self.main_process else Path(report_path)
        self.csv_path = None if csv_path is None or not self.main_process else Path(csv_path)
        for name, target in (("report_path", self.report_path), ("csv_path", self.csv_path)):
            if target is None:
                continue
            if not target.parent.is_dir():
                raise FlowError(
                    f"Monitor: {name} {str(target)!r} is in a folder that does not exist; create "
                    f"{str(target.parent)!r} first or pass another path"
                )
            if target.is_dir():
                raise FlowError(f"Monitor: {name} {str(target)!r} is a directory; pass a file path in it")
        self.title = title
        self.quiet = quiet
        self._stream = stream if stream is not None else sys.stderr
        self._eta = EtaEstimator(eta_window)
        self._hub = EventHub(history_limit=history_limit)
        self._client_queue_size = client_queue_size
        self._sampler = ResourceSampler()
        self._metadata_reader = MetadataReader()
        self._tui: Any = None
        if tui and self.main_process:
            try:
                from .tui import TerminalDashboard
            except ImportError as error:
                raise FlowError("Monitor(tui=True) draws with rich, which is not installed: "
                                "pip install 'flowgraph[tui]'") from error
            self._tui = TerminalDashboard(self._stream)
        self._progress = StepProgress(enabled=progress_bar and not quiet and self._tui is None,
                                      stream=self._stream)
        self._count = 0  # epochs logged (the hub holds them, thinned for very long runs)
        self._seconds_total = 0.0
        self._last_record: dict[str, Any] | None = None
        self._spool: IO[str] | None = None  # every epoch as a JSON line, when csv_path is set
        self._spool_path: Path | None = None
        self._csv_written = False
        self._metadata = GraphMetadata()
        self._picture = GraphPicture()
        self._watched = False
        self._picture_at = 0.0  # when the picture was last read (a profiled graph's heat is re-read)
        self._started_at = time.time()
        self._clock_start = time.perf_counter()
        self._status = "running"
        self._final: dict[str, Any] | None = None
        self._server: Any = None
        self._url: str | None = None
        self._grace = 5.0
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._publish_meta()

    # -- graph ---------------------------------------------------------------------------------------------

    def watch(self, graph: object) -> None:
        """Show ``graph`` on the dashboard: its picture and metadata.

        The picture is ``g.svg()`` when Graphviz's ``dot`` is installed, else ``g.dot()``, which the page draws
        itself with the vendored viz.js; both carry profile heat when the graph holds a profile, and
        ``g.node_details()`` feeds the panel a click on a node opens (path, parameters, frozen state, time).
        Calling ``watch`` again re-reads them (e.g. after a profiled forward)."""
        self._watched = True
        self._picture = read_picture(graph)
        self._picture_at = time.monotonic()
        self._metadata = self._metadata_reader.read(graph)
        self._publish_meta()

    # -- the training loop ---------------------------------------------------------------------------------

    def log(
        self,
        epoch: int,
        seconds: float,
        metrics: Mapping[str, Any] | MetricSource,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record one finished epoch, print its line and push it to the dashboard.

        Args:
            epoch: the zero-based epoch index, ``0 <= epoch < total_epochs``.
            seconds: how long the epoch took (wall-clock seconds, measured by the caller).
            metrics: a dict ``name -> value`` or a graph with ``latest_metrics()``; values may be floats,
                ints or 0-d tensors. Non-finite values are kept as ``None`` (null in JSON, empty in CSV).
            extra: more metrics merged after the graph's, e.g. ``{"lr": scheduler.get_last_lr()[0]}``.

        Returns:
            The epoch object, as sent to the dashboard.
        """
        if self._final is not None:
            raise FlowError(f"Monitor.log(epoch={epoch!r}): the run already finished; create a new Monitor")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < self.total_epochs:
            raise FlowError(
                f"Monitor.log: epoch must be the zero-based index 0..{self.total_epochs - 1} "
                f"(total_epochs={self.total_epochs}), got {epoch!r}; "
                "loop with `for epoch in range(total_epochs)` or raise total_epochs"
            )
        try:
            seconds = float(seconds)
        except (TypeError, ValueError) as error:
            raise FlowError(
                f"Monitor.log(epoch={epoch}): seconds must be a number, got {seconds!r}"
            ) from error
        if not math.isfinite(seconds) or seconds < 0:
            raise FlowError(
                f"Monitor.log(epoch={epoch}): seconds must be a finite duration >= 0, got {seconds!r}"
            )
        self._progress.close()
        values = read_metrics(metrics)
        if extra is not None:
            values.update(read_metrics(extra, where="Monitor.log(extra=...)"))

        device = None
        if is_graph(metrics):
            meta_before = (self._metadata, self._picture)
            if not self._watched:
                self._watched = True
                self._picture = read_picture(metrics)
                self._picture_at = time.monotonic()
            elif has_profile(metrics) and time.monotonic() - self._picture_at >= PROFILE_REFRESH_SECONDS:
                self._picture = read_picture(metrics)  # the node heat follows the latest profiled forward
                self._picture_at = time.monotonic()
            self._metadata = self._metadata_reader.read(metrics)
            device = self._metadata.device
            if (self._metadata, self._picture) != meta_before:
                self._publish_meta()

        self._eta.update(seconds)
        number = epoch + 1
        eta = self._eta.remaining(self.total_epochs - number)
        record = {
            "epoch": number,
            "total": self.total_epochs,
            "seconds": seconds,
            "eta": None if eta is None else round(eta, 3),
            "metrics": values,
            "resources": self._sampler.sample(device),
        }
        self._count += 1
        self._seconds_total += seconds
        self._last_record = record
        message = self._hub.publish_epoch(record)
        if self._tui is not None:
            self._tui.apply("epoch", record)
        if self.csv_path is not None:
            self._spool_epoch(message.data)
        if not self.quiet and self._tui is None:
            line = epoch_line(number, self.total_epochs, values, seconds, eta, record["resources"])
            self._progress.write(line)
        return record

    def progress(self, step: int, total_steps: int | None = None) -> None:
        """Advance the per-step bar: call after finishing step ``step`` (zero-based) of ``total_steps``.

        The bar closes itself after the last step and at the next :meth:`log`. Turn bars off with
        ``Monitor(..., progress_bar=False)``.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise FlowError(f"Monitor.progress: step must be a zero-based int >= 0, got {step!r}")
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise FlowError(
                f"Monitor.progress: total_steps must be a positive int or None, got {total_steps!r}"
            )
        self._progress.update(step + 1, total_steps, self._step_description())

    def steps(self, iterable: Iterable[T], total: int | None = None) -> Iterator[T]:
        """Iterate over ``iterable`` (e.g. a data loader) with a per-step progress bar.

        ``total`` defaults to ``len(iterable)`` when it has one.
        """
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        done = 0
        for item in iterable:
            yield item
            done += 1
            self._progress.update(done, total, self._step_description())
        self._progress.close()

    def _step_description(self) -> str:
        return f"epoch {self._count + 1}/{self.total_epochs}"

    # -- ending the run ------------------------------------------------------------------------------------

    def finish(self, status: str = "completed", *, keep_serving: bool = False) -> dict[str, Any]:
        """End the run: print a summary, send ``complete`` to dashboards, write the report and the CSV, stop
        the server.

        The server stops once every open dashboard stream has received ``complete`` and no browser that
        dropped out in the last ``grace`` seconds (``serve(grace=...)``, default 5) is still to resume with
        ``Last-Event-ID``; at most ``grace`` seconds, usually at once.

        Args:
            status: ``"completed"``, ``"interrupted"`` (Ctrl-C), ``"terminated"`` (SIGTERM) or ``"failed"``.
            keep_serving: leave the dashboard server running (showing the final state) until :meth:`close`.

        Returns:
            The final object sent with ``complete``. A second call returns it again and does nothing else.
        """
        if status not in STATUSES:
            raise FlowError(f"Monitor.finish: status must be one of {', '.join(STATUSES)}; got {status!r}")
        if self._final is not None:
            return self._final
        self._progress.close()
        self._status = status
        elapsed = self.elapsed
        last = self._last_record
        self._final = {
            "status": status,
            "epochs": self._count,
            "total": self.total_epochs,
            "elapsed": round(elapsed, 3),
            "mean_epoch_seconds": round(self._seconds_total / self._count, 6) if self._count else None,
            "final_metrics": dict(last["metrics"]) if last is not None else {},
        }
        self._sampler.close()
        self._publish_meta()
        self._hub.publish_complete(self._final)
        if self._tui is not None:
            self._tui.apply("complete", self._final)
            self._tui.close()
        if not self.quiet:
            self._progress.write(self._summary_line())
        problems: list[str] = []
        cause: Exception | None = None
        if self.report_path is not None:
            try:
                self.save_html(self.report_path)
                if not self.quiet:
                    self._progress.write(f"report: {self.report_path}")
            except (OSError, FlowError) as error:
                problems.append(f"could not write the report to {str(self.report_path)!r}: {error}")
                cause = error
        if self.csv_path is not None:
            try:
                self._write_final_csv(self.csv_path)
                if not self.quiet:
                    self._progress.write(f"csv: {self.csv_path}")
            except (OSError, FlowError) as error:
                kept = f" (every epoch is kept in {str(self._spool_path)!r})" if self._spool_path else ""
                problems.append(f"could not write the CSV to {str(self.csv_path)!r}: {error}{kept}")
                cause = error
        if not keep_serving:
            try:
                if self._server is not None:
                    self._server.linger(self._grace)
            finally:
                self.close()
        if problems:
            raise FlowError("Monitor.finish: " + "; ".join(problems)) from cause
        return self._final

    def _summary_line(self) -> str:
        final = self._final or {}
        words = {"completed": "completed", "interrupted": "interrupted", "terminated": "terminated (SIGTERM)",
                 "failed": "failed"}
        line = (
            f"training {words[self._status]} after {final.get('epochs', 0)}/{self.total_epochs} epochs "
            f"in {format_duration(final.get('elapsed'))}"
        )
        if final.get("mean_epoch_seconds") is not None:
            line += f" ({format_duration(final['mean_epoch_seconds'])}/epoch)"
        metrics = final.get("final_metrics") or {}
        if metrics:
            line += ": " + " ".join(f"{name}={format_metric(value)}" for name, value in metrics.items())
        return line

    def close(self) -> None:
        """Stop the dashboard server at once and end open streams; safe to call more than once.

        Unlike :meth:`finish`, it does not wait for browsers to receive ``complete``.
        """
        self._progress.close()
        if self._tui is not None:
            self._tui.close()
        server, self._server = self._server, None
        if server is not None:
            self._hub.close()
            server.stop()

    def __enter__(self) -> Monitor:
        """``with Monitor(...) as mon:`` ends the run properly however the block is left.

        In the main thread, while SIGTERM has its default action, the block installs a handler that raises
        :class:`Terminated`: the run ends like a Ctrl-C (status ``terminated``, report and CSV written) and
        the process then exits with status 143. A SIGTERM handler of your own is left alone. The handler
        that was there before is restored when the block ends.
        """
        self._install_sigterm()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Finish (``interrupted`` on Ctrl-C, ``terminated`` on SIGTERM, ``failed`` on another exception) and stop
        the server; the SIGTERM handler that was there before is restored."""
        self._restore_sigterm()
        try:
            if self._final is None:
                if exc_type is None:
                    self.finish()
                else:
                    status = ("terminated" if issubclass(exc_type, Terminated) else
                              "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")
                    try:
                        self.finish(status)
                    except FlowError as error:  # do not hide the exception that ended training
                        warnings.warn(str(error), RuntimeWarning, stacklevel=2)
        finally:
            self.close()

    def _install_sigterm(self) -> None:
        if self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
                return  # the program handles SIGTERM itself (or ignores it): leave that alone
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
            self._sigterm_installed = True
        except (ValueError, OSError):  # not settable here (embedded interpreters)
            pass

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed:
            return
        self._sigterm_installed = False
        previous = self._previous_sigterm if self._previous_sigterm is not None else signal.SIG_DFL
        self._previous_sigterm = None
        try:
            signal.signal(signal.SIGTERM, previous)
        except (ValueError, OSError):  # left the main thread's control somehow; nothing better to do
            pass

    # -- the dashboard server ------------------------------------------------------------------------------

    def serve(self, port: int = 3000, host: str = "127.0.0.1", *, grace: float = 5.0) -> str:
        """Start the live dashboard on ``http://host:port`` in a background thread; return its URL.

        Returns only once the server accepts connections. ``port=0`` picks a free port (see :attr:`url`).
        On ranks other than 0 of a distributed run it starts nothing and returns ``""``.
        The default host only accepts connections from this machine; ``host="0.0.0.0"`` exposes the
        dashboard (training metrics, model structure) to the whole network, without authentication.
        ``grace``: at :meth:`finish`, how long at most the server stays up for a browser that dropped out
        near the end to resume and receive ``complete`` (0: stop at once).

        Raises:
            FlowError: the port is in use, the host is invalid, the server failed to start, or the
                server packages (``pip install 'flowgraph[monitor]'``) are missing.
        """
        if not self.main_process:
            return ""  # rank 0 serves the dashboard
        if self._server is not None:
            raise FlowError(f"Monitor.serve: already serving on {self._url}; call close() first")
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
            raise FlowError(f"Monitor.serve: grace must be seconds in 0..3600, got {grace!r}")
        try:
            from . import server as server_module
        except ImportError as error:
            raise FlowError(
                f"Monitor.serve: the dashboard needs starlette and uvicorn ({error}); "
                "install them with pip install 'flowgraph[monitor]'"
            ) from error
        sock = server_module.bind_socket(host, port)
        self._hub.reopen()
        limits = server_module.Limits(max_lag=self._client_queue_size)
        tracker = server_module.StreamTracker()
        feed = server_module.LiveFeed(self._hub, limits)
        app = server_module.build_app(self._hub, lambda: self._picture.svg, host, tracker=tracker, feed=feed,
                                      graph_dot=lambda: self._picture.dot)
        server = server_module.DashboardServer(app, sock, host, limits=limits, tracker=tracker, feed=feed)
        server.start()
        self._server = server
        self._grace = float(grace)
        self._url = _url_for(host, server.port)
        if not self.quiet:
            self._progress.write(f"dashboard: {self._url}")
            if not server_module.is_loopback(host):
                self._progress.write(
                    f"warning: the dashboard listens on {host}, reachable from other machines, with no "
                    "authentication; use host='127.0.0.1' unless that is intended"
                )
        return self._url

    @property
    def url(self) -> str | None:
        """The dashboard's URL while serving (``http://127.0.0.1:PORT``), else None."""
        return self._url if self._server is not None else None

    @property
    def port(self) -> int | None:
        """The port the dashboard listens on while serving, else None."""
        return None if self._server is None else int(self._server.port)

    # -- state ---------------------------------------------------------------------------------------------

    @property
    def history(self) -> list[dict[str, Any]]:
        """The epoch objects held in memory, oldest first (new dicts): every epoch logged, unless the run has
        more than ``history_limit / 2`` epochs; then the newest ``history_limit / 2`` and older ones thinned
        evenly (``csv_path`` keeps every epoch on disk)."""
        return self._hub.epochs()

    @property
    def epochs_logged(self) -> int:
        """How many epochs :meth:`log` recorded, whether or not all are still held in :attr:`history`."""
        return self._count

    @property
    def status(self) -> str:
        """``running`` until :meth:`finish`, then the status it was given."""
        return self._status

    @property
    def elapsed(self) -> float:
        """Seconds since the monitor was created, or until it finished."""
        if self._final is not None:
            return float(self._final["elapsed"])
        return time.perf_counter() - self._clock_start

    def _meta(self) -> dict[str, Any]:
        model = self._metadata.to_json()
        return {
            "title": self.title or model.get("label") or "training",
            "total": self.total_epochs,
            "status": self._status,
            "started_at": self._started_at,
            "elapsed": round(self.elapsed, 3),
            "now": time.time(),
            "model": model,
            "graph": self._picture.to_json(),
        }

    def _publish_meta(self) -> None:
        meta = self._meta()
        self._hub.publish_meta(meta)
        if self._tui is not None:
            self._tui.apply("meta", meta)

    # -- exports -------------------------------------------------------------------------------------------

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the dashboard with its epochs embedded: one HTML file that opens offline, no server.

        It holds the epochs of :attr:`history` (all of them unless the run outgrew ``history_limit``).
        On ranks other than 0 of a distributed run nothing is written (the path is returned)."""
        target = Path(path)
        if not self.main_process:
            return target
        data = {
            "meta": self._meta(),
            "epochs": self._hub.epochs(),
            "complete": self._final,
            "graph_svg": self._picture.svg,
        }
        _write_text(target, report_html(data), "Monitor.save_html")
        return target

    def export_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write one row per epoch: ``epoch, total, seconds, eta``, one column per metric, then resources.

        Metric columns are in order of first appearance, so a metric that starts later or is only logged
        by a subtree gets its own column; cells where it is missing (or was not finite) are empty.
        Resource columns are named ``resource.cpu``, ``resource.ram_used``, ... On ranks other than 0 of a
        distributed run nothing is written (the path is returned).

        Every epoch is written when ``csv_path`` was given (from the spool, or a copy of the CSV written by
        :meth:`finish`) or when the run fits in ``history_limit / 2`` epochs; otherwise the epochs held in
        memory (older ones thinned), with a ``RuntimeWarning`` saying so.
        """
        target = Path(path)
        if not self.main_process:
            return target
        if self._spool is not None and self._spool_path is not None:
            self._spool.flush()
            spool = self._spool_path
            _write_csv(target, lambda: _read_spool(spool), "Monitor.export_csv")
            return target
        if self._hub.thinned and self._csv_written and self.csv_path is not None and self.csv_path.is_file():
            if target.resolve() != self.csv_path.resolve():
                try:
                    shutil.copyfile(self.csv_path, target)
                except OSError as error:
                    raise FlowError(f"Monitor.export_csv: cannot write {str(target)!r}: {error}") from error
            return target
        records = self._hub.epochs()
        if self._hub.thinned:
            warnings.warn(
                f"Monitor.export_csv: {len(records)} of the {self._count} epochs are held in memory (older ones "
                "thinned); pass csv_path= to Monitor to keep every epoch, or raise history_limit",
                RuntimeWarning,
                stacklevel=2,
            )
        _write_csv(target, lambda: records, "Monitor.export_csv")
        return target

    def _spool_epoch(self, line: str) -> None:
        """Append one epoch's JSON to the spool beside ``csv_path`` (created at the first epoch)."""
        if self._spool is None:
            if self._spool_path is not None or self.csv_path is None:
                return  # the spool failed earlier: the CSV will come from memory
            directory = self.csv_path.parent
            try:
                fd, name = tempfile.mkstemp(prefix=f".{self.csv_path.name}.", suffix=".epochs.jsonl", dir=directory)
                self._spool = os.fdopen(fd, "w", encoding="utf-8")
                self._spool_path = Path(name)
            except OSError as error:
                self._spool_path = Path(os.devnull)
                warnings.warn(
                    f"Monitor: cannot keep the epochs for the CSV in {str(directory)!r} ({error}); the CSV will "
                    "hold the epochs kept in memory",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
        try:
            self._spool.write(line + "\n")
            self._spool.flush()
        except OSError as error:
            warnings.warn(
                f"Monitor: writing the epoch spool {str(self._spool_path)!r} failed ({error}); the CSV will "
                "hold the epochs kept in memory",
                RuntimeWarning,
                stacklevel=3,
            )
            self._close_spool(remove=False)

    def _close_spool(self, *, remove: bool) -> None:
        spool, self._spool = self._spool, None
        if spool is not None:
            with contextlib.suppress(OSError):
                spool.close()
        if remove and self._spool_path is not None and self._spool_path.name != os.devnull:
            with contextlib.suppress(OSError):
                self._spool_path.unlink()
            self._spool_path = None

    def _write_final_csv(self, target: Path) -> None:
        """At :meth:`finish`: the CSV from the spool (every epoch), else from memory; the spool is removed."""
        if self._spool is not None and self._spool_path is not None:
            spool = self._spool_path
            self._close_spool(remove=False)
            _write_csv(target, lambda: _read_spool(spool), "Monitor.finish")
            self._close_spool(remove=True)
        else:
            self.export_csv(target)
        self._csv_written = True


def _read_spool(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _write_csv(target: Path, records: Callable[[], Iterable[dict[str, Any]]], where: str) -> None:
    """Two passes over ``records()``: the columns (in order of first appearance), then the rows."""
    metric_names: dict[str, None] = {}
    resource_names: dict[str, None] = {}
    for record in records():
        metric_names.update(dict.fromkeys(record["metrics"]))
        resource_names.update(dict.fromkeys(record["resources"]))
    metric_columns = {name: f"metric.{name}" if name in _CSV_FIXED else name for name in metric_names}
    header = [*_CSV_FIXED, *metric_columns.values(), *(f"resource.{name}" for name in resource_names)]
    try:
        with target.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for record in records():
                row = [_cell(record[key]) for key in _CSV_FIXED]
                row.extend(_cell(record["metrics"].get(name)) for name in metric_names)
                row.extend(_cell(record["resources"].get(name)) for name in resource_names)
                writer.writerow(row)
    except OSError as error:
        raise FlowError(f"{where}: cannot write {str(target)!r}: {error}") from error


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def _write_text(target: Path, text: str, where: str) -> None:
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        raise FlowError(f"{where}: cannot write {str(target)!r}: {error}") from error


def _url_for(host: str, port: int) -> str:
    """The URL a local browser should open: a wildcard host is reached through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
