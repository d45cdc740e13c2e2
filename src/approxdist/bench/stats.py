"""Statistics of repeated timings: medians, the 10th percentile, paired ratios, per-step extremes.

A multi-rank step takes as long as its slowest rank (`slowest`); the rank that waited
least (`fastest`) shows what the others' skew hid. A *paired* ratio is the median over
rounds of ours / the baseline's time in the same round: the two ran seconds apart, so
load that drifts during a run cancels, where the ratio of the two medians can compare a
calm moment with a busy one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The median, or NaN for no values."""
    return statistics.median(values) if values else float("nan")


def p10(values: Sequence[float]) -> float:
    """10th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.1 * len(ordered)) - 1)]


def paired_ratio(ours: Sequence[float], base: Sequence[float]) -> float:
    """Median over rounds of `ours[i] / base[i]` (same round, adjacent in time)."""
    return median([o / b for o, b in zip(ours, base)])


def slowest(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per repetition, the slowest rank's time (`per_rank[r][i]`: rank r, repetition i)."""
    return [max(times) for times in zip(*per_rank)]


def fastest(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per repetition, the fastest rank's value."""
    return [min(times) for times in zip(*per_rank)]
