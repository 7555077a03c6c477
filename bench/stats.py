"""Percentiles and spreads, without numpy (the smoke run needs no extra packages but matplotlib)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``q`` in 0..100."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(latencies_ms, 50), 3),
        "p90": round(percentile(latencies_ms, 90), 3),
        "p99": round(percentile(latencies_ms, 99), 3),
        "p99.9": round(percentile(latencies_ms, 99.9), 3),
        "max": round(max(latencies_ms), 3) if latencies_ms else math.nan,
        "mean": round(statistics.fmean(latencies_ms), 3) if latencies_ms else math.nan,
    }


def spread(values: Sequence[float], digits: int = 3) -> dict[str, object]:
    """Median and range over rounds, with every round's value."""
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "rounds": []}
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "rounds": [round(v, digits) for v in values],
    }
