"""The per-step progress bar shown inside long epochs (tqdm, when installed and enabled)."""

from __future__ import annotations

import importlib
from typing import IO, Any


class StepProgress:
    """One tqdm bar at a time, driven by ``update(done, total)``; a no-op when disabled or tqdm is missing."""

    def __init__(self, enabled: bool, stream: IO[str]) -> None:
        self._tqdm: Any = None
        if enabled:
            try:
                self._tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                self._tqdm = None
        self._stream = stream
        self._bar: Any = None

    @property
    def enabled(self) -> bool:
        """True when bars are drawn."""
        return self._tqdm is not None

    @property
    def active(self) -> bool:
        """True while a bar is on screen."""
        return self._bar is not None

    def update(self, done: int, total: int | None, desc: str) -> None:
        """Show ``done`` of ``total`` steps finished (``total`` None: an open-ended counter)."""
        if self._tqdm is None:
            return
        bar = self._bar
        if bar is None or bar.total != total or done < bar.n:
            self.close()
            bar = self._bar = self._tqdm(
                total=total, desc=desc, unit="step", leave=False, file=self._stream, dynamic_ncols=True
            )
        bar.update(done - bar.n)
        if total is not None and done >= total:
            self.close()

    def write(self, line: str) -> None:
        """Print a line without tearing the bar (tqdm moves it below the line)."""
        if self._tqdm is not None and self._bar is not None:
            self._tqdm.write(line, file=self._stream)
        else:
            print(line, file=self._stream, flush=True)

    def close(self) -> None:
        """Remove the current bar, if any."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
