"""How well predictions match measurements (pure): APE, Kendall's tau, regret.

- absolute percentage error of one configuration: |predicted - measured| / measured;
- Kendall's tau-b between two orders (ties counted as neither concordant nor discordant,
  normalised as tau-b: Kendall 1945), 1 when the predicted order is the measured one;
- regret of a choice: the measured time of the chosen plan over the best measured time of
  the plans it was chosen among, minus 1 (0 when the planner picked the fastest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from approxdist.errors import ConfigError


def ape(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured (a fraction)."""
    if not measured > 0:
        raise ConfigError(f"measured time {measured!r} must be > 0 to compare a prediction with")
    return abs(predicted - measured) / measured


def median(values: Sequence[float]) -> float:
    if not values:
        raise ConfigError("the median of no values is undefined; measure at least one")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of the pairs (a[i], b[i]); nan with fewer than two pairs or when one
    side is constant."""
    if len(a) != len(b):
        raise ConfigError(f"Kendall's tau needs two lists of one length (got {len(a)} and "
                          f"{len(b)})")
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    n0 = concordant + discordant
    denominator = math.sqrt((n0 + ties_a) * (n0 + ties_b))
    return (concordant - discordant) / denominator if denominator else math.nan


def regret(chosen: float, candidates: Sequence[float]) -> float:
    """measured(chosen) / min(measured over candidates) - 1 (chosen is one of them)."""
    best = min(candidates)
    if not best > 0:
        raise ConfigError(f"measured times {list(candidates)!r} must be > 0")
    return chosen / best - 1.0
