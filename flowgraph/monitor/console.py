"""Text formatting for the monitor's console output: durations, metric values, byte sizes, epoch lines."""

from __future__ import annotations

import math
from collections.abc import Mapping


def format_duration(seconds: float | None) -> str:
    """A short human duration: ``0.25s``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 59.95 else "1m00s"
    total = int(round(seconds))
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_eta(seconds: float | None) -> str:
    """An ETA in whole seconds below a minute (``24s``), else as :func:`format_duration`; ``?`` if unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 60:
        return f"{int(round(seconds))}s"
    return format_duration(seconds)


def format_metric(value: float | None) -> str:
    """A metric value with four significant decimals, scientific notation for very small or large values."""
    if value is None:
        return "nan"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4f}"


def format_bytes(count: float) -> str:
    """A byte count in binary units: ``512B``, ``1.5KiB``, ``3.2GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"  # pragma: no cover - loop always returns


def epoch_line(
    epoch: int,
    total: int,
    metrics: Mapping[str, float | None],
    seconds: float,
    eta: float | None,
    resources: Mapping[str, float],
) -> str:
    """The console line for one epoch, e.g. ``epoch 3/100 loss=0.1234 [0.25s ETA 24s] cpu 37%``.

    ``epoch`` is the one-based number shown to the user. The ETA is left out after the last epoch.
    """
    width = len(str(total))
    parts = [f"epoch {epoch:>{width}}/{total}"]
    parts.extend(f"{name}={format_metric(value)}" for name, value in metrics.items())
    timing = format_duration(seconds)
    if eta is not None and epoch < total:
        timing += f" ETA {format_eta(eta)}"
    parts.append(f"[{timing}]")
    if "cpu" in resources:
        parts.append(f"cpu {resources['cpu']:.0f}%")
    if "ram_used" in resources and "ram_total" in resources:
        parts.append(f"ram {format_bytes(resources['ram_used'])}/{format_bytes(resources['ram_total'])}")
    if "gpu" in resources:
        parts.append(f"gpu {resources['gpu']:.0f}%")
    if "vram_used" in resources and "vram_total" in resources:
        parts.append(f"vram {format_bytes(resources['vram_used'])}/{format_bytes(resources['vram_total'])}")
    return " ".join(parts)
