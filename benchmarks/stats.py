"""Small statistics for the bench: percentiles, medians, process RSS."""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Sequence

__all__ = ["median", "percentile", "rss_bytes"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN when empty."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def rss_bytes() -> int:
    """The current resident set size of this process (``/proc``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
