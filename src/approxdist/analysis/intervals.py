"""Sets of time intervals: the arithmetic of the bottleneck analysis (pure, no torch).

An `IntervalSet` is a sorted tuple of disjoint half-open intervals [start, end). The
analysis builds one set per phase class and rank and combines them with union,
intersection and difference, so that every instant of a step window is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

Interval = tuple[float, float]


@dataclass(frozen=True)
class IntervalSet:
    """Disjoint, sorted, non-empty intervals; build with `IntervalSet.of(...)`."""

    spans: tuple[Interval, ...] = ()

    @staticmethod
    def of(intervals: Iterable[Interval]) -> IntervalSet:
        """The union of any intervals (overlapping, unsorted, empty ones dropped)."""
        merged: list[list[float]] = []
        for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return IntervalSet(tuple((a, b) for a, b in merged))

    @property
    def length(self) -> float:
        return sum(b - a for a, b in self.spans)

    @property
    def bounds(self) -> Interval | None:
        return (self.spans[0][0], self.spans[-1][1]) if self.spans else None

    def __or__(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet.of(self.spans + other.spans)

    def __and__(self, other: IntervalSet) -> IntervalSet:
        out: list[Interval] = []
        i = j = 0
        a, b = self.spans, other.spans
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo < hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return IntervalSet(tuple(out))

    def __sub__(self, other: IntervalSet) -> IntervalSet:
        return self & other.complement(self.bounds)

    def complement(self, within: Interval | None) -> IntervalSet:
        """The gaps of this set inside `within` (empty when `within` is None)."""
        if within is None:
            return IntervalSet()
        lo, hi = within
        gaps, cursor = [], lo
        for a, b in self.spans:
            if a > cursor:
                gaps.append((cursor, min(a, hi)))
            cursor = max(cursor, b)
        if cursor < hi:
            gaps.append((cursor, hi))
        return IntervalSet.of(gaps)


def self_time(spans: list[tuple[float, float, int]]) -> dict[int, tuple[IntervalSet, int | None]]:
    """Per span id: its own time (its interval minus the spans nested in it) and its parent.

    `spans` are (start, end, id) of one thread, properly nested as context managers
    produce them; at every instant only the innermost open span is charged. Of two
    spans with equal bounds the one with the higher id is the outer one (context
    managers record the inner span first, as it exits first).
    """
    own: dict[int, list[Interval]] = {}
    parent: dict[int, int | None] = {}
    stack: list[tuple[float, float, int]] = []
    cursor: dict[int, float] = {}

    def close_until(t: float) -> None:
        while stack and stack[-1][1] <= t:
            _, end, sid = stack.pop()
            own[sid].append((cursor[sid], end))
            if stack:
                cursor[stack[-1][2]] = end

    for start, end, sid in sorted(spans, key=lambda s: (s[0], -s[1], -s[2])):
        close_until(start)
        own[sid], parent[sid] = [], stack[-1][2] if stack else None
        if stack:
            up = stack[-1][2]
            own[up].append((cursor[up], start))
        cursor[sid] = start
        stack.append((start, end, sid))
    close_until(float("inf"))
    return {sid: (IntervalSet.of(ivs), parent[sid]) for sid, ivs in own.items()}
