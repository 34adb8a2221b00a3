"""The ETA rule: a moving average of the most recent epoch times times the epochs left."""

from __future__ import annotations

from collections import deque

from flowgraph.errors import FlowError


class EtaEstimator:
    """Estimates the time left from the last ``window`` epoch durations.

    Wall time since the start is deliberately not used: a slow first epoch (compilation, caches, data
    loading) or a change of pace (a learning-rate phase, a curriculum step) would distort it for the
    whole run. A moving average over recent epochs adapts within ``window`` epochs.

    >>> eta = EtaEstimator(window=3)
    >>> eta.update(2.0); eta.update(1.0); eta.update(1.0); eta.update(1.0)
    >>> eta.remaining(epochs_left=10)
    10.0
    """

    def __init__(self, window: int = 10) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise FlowError(f"Monitor: eta_window must be a positive int (epochs averaged), got {window!r}")
        self._recent: deque[float] = deque(maxlen=window)

    def update(self, seconds: float) -> None:
        """Record the duration of one finished epoch."""
        self._recent.append(float(seconds))

    @property
    def seconds_per_epoch(self) -> float | None:
        """The moving-average epoch time, or None before the first epoch."""
        if not self._recent:
            return None
        return sum(self._recent) / len(self._recent)

    def remaining(self, epochs_left: int) -> float | None:
        """Seconds expected for ``epochs_left`` more epochs; None before any epoch was recorded."""
        average = self.seconds_per_epoch
        if average is None:
            return None
        return average * max(0, epochs_left)
