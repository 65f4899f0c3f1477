"""Medians, tail percentiles and ratios of repeated measurements."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["Summary", "percentile", "ratio", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between the closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclasses.dataclass(frozen=True)
class Summary:
    """A sample's size, median, 90th and 99th percentiles, mean and extremes (in the sample's unit)."""

    n: int
    median: float
    p90: float
    p99: float
    mean: float
    minimum: float
    maximum: float

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        return {
            "n": self.n,
            "median": self.median * scale,
            "p90": self.p90 * scale,
            "p99": self.p99 * scale,
            "mean": self.mean * scale,
            "min": self.minimum * scale,
            "max": self.maximum * scale,
        }


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Summary(
        n=len(values),
        median=statistics.median(values),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=statistics.fmean(values),
        minimum=min(values),
        maximum=max(values),
    )


def ratio(numerator: float, denominator: float) -> float:
    if denominator == 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


def lag_text(value: float | None) -> str:
    """An event-loop lag in whole ms, or "n/a" for a window that had no tick to measure it (not 0)."""
    return "n/a" if value is None else f"{value:.0f}"
