"""Trends over epoch values: slope, stalled, improving, converged, and groups of trends.

Definitions (the same for every metric):

* ``slope(n)``: least-squares slope of the last ``n`` epoch values against ``0..n-1`` (``n=0``: all values;
  fewer than 2 points: 0).
* ``stalled(n, tol)``: ``|slope(n)| < tol``; with ``relative=True`` the tolerance scales with the mean
  magnitude of the window (``tol * |mean|``), so one threshold serves losses of any scale.
* ``improving(n)``: ``slope < 0`` for a trend made with ``mode="min"`` (the default: lower is better) and
  ``slope > 0`` for ``mode="max"`` (accuracy, reward).
* ``converged(n, tol)``: population variance of the last ``n`` values ``< tol`` (``relative=True``:
  ``< tol * mean**2``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import FlowError


class Trend:
    """The epoch history of one metric, with the queries above. ``mode`` is ``"min"`` or ``"max"``."""

    __slots__ = ("name", "values", "mode")

    def __init__(self, values: Sequence[float], mode: str = "min", name: str = ""):
        if mode not in ("min", "max"):
            raise FlowError(f"trend {name!r}: mode must be 'min' (lower is better) or 'max', got {mode!r}")
        self.name = name
        self.values = [float(v) for v in values]
        self.mode = mode

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        latest = f"{self.latest:.6g}" if self.values else "none"
        return f"Trend({self.name!r}, {len(self.values)} epochs, latest={latest}, mode={self.mode!r})"

    def last(self, n: int = 0) -> list[float]:
        """The last ``n`` values (all when ``n <= 0``)."""
        return list(self.values[-n:]) if n > 0 else list(self.values)

    @property
    def latest(self) -> float:
        """The most recent epoch value (NaN when empty)."""
        return self.values[-1] if self.values else math.nan

    def mean(self, n: int = 0) -> float:
        """Mean of the last ``n`` values (NaN when empty)."""
        w = self.last(n)
        return sum(w) / len(w) if w else math.nan

    def min(self, n: int = 0) -> float:
        """Minimum of the last ``n`` values."""
        w = self.last(n)
        return min(w) if w else math.nan

    def max(self, n: int = 0) -> float:
        """Maximum of the last ``n`` values."""
        w = self.last(n)
        return max(w) if w else math.nan

    def best(self) -> float:
        """The best value so far by this trend's mode."""
        return self.min() if self.mode == "min" else self.max()

    def slope(self, n: int = 0) -> float:
        """Least-squares slope of the last ``n`` values against ``0..n-1``."""
        w = self.last(n)
        k = len(w)
        if k < 2:
            return 0.0
        xm = (k - 1) / 2.0
        ym = sum(w) / k
        num = sum((i - xm) * (y - ym) for i, y in enumerate(w))
        den = sum((i - xm) ** 2 for i in range(k))
        return num / den

    def stalled(self, n: int = 0, tol: float = 1e-4, relative: bool = False) -> bool:
        """True when the slope's magnitude is below ``tol`` (times ``|mean|`` with ``relative``)."""
        limit = tol * abs(self.mean(n)) if relative else tol
        return len(self.last(n)) >= 2 and abs(self.slope(n)) < limit

    def improving(self, n: int = 0) -> bool:
        """True when the slope points the good way for this trend's mode."""
        s = self.slope(n)
        return s < 0 if self.mode == "min" else s > 0

    def variance(self, n: int = 0) -> float:
        """Population variance of the last ``n`` values."""
        w = self.last(n)
        if not w:
            return math.nan
        m = sum(w) / len(w)
        return sum((v - m) ** 2 for v in w) / len(w)

    def converged(self, n: int = 0, tol: float = 1e-6, relative: bool = False) -> bool:
        """True when the variance of the last ``n`` values is below ``tol`` (times ``mean**2`` with ``relative``)."""
        if len(self.last(n)) < 2:
            return False
        limit = tol * self.mean(n) ** 2 if relative else tol
        return self.variance(n) < limit


class TrendGroup:
    """Several trends queried together: ``g.trends("loss", "val_loss").all_improving(5)``."""

    def __init__(self, trends: Sequence[Trend]):
        self.trends = list(trends)

    def __iter__(self):
        return iter(self.trends)

    def __len__(self) -> int:
        return len(self.trends)

    def __getitem__(self, i: int) -> Trend:
        return self.trends[i]

    def all_improving(self, n: int = 0) -> bool:
        """Every trend improving."""
        return all(t.improving(n) for t in self.trends)

    def any_improving(self, n: int = 0) -> bool:
        """At least one trend improving."""
        return any(t.improving(n) for t in self.trends)

    def all_stalled(self, n: int = 0, tol: float = 1e-4, relative: bool = False) -> bool:
        """Every trend stalled."""
        return all(t.stalled(n, tol, relative) for t in self.trends)

    def any_stalled(self, n: int = 0, tol: float = 1e-4, relative: bool = False) -> bool:
        """At least one trend stalled."""
        return any(t.stalled(n, tol, relative) for t in self.trends)

    def all_converged(self, n: int = 0, tol: float = 1e-6, relative: bool = False) -> bool:
        """Every trend converged."""
        return all(t.converged(n, tol, relative) for t in self.trends)

    def any_converged(self, n: int = 0, tol: float = 1e-6, relative: bool = False) -> bool:
        """At least one trend converged."""
        return any(t.converged(n, tol, relative) for t in self.trends)

    def mean_slope(self, n: int = 0) -> float:
        """Mean of the trends' slopes (0 for an empty group)."""
        return sum(t.slope(n) for t in self.trends) / len(self.trends) if self.trends else 0.0
