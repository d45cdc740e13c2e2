"""Small Markdown builders for experiment reports: tables, numbers with spread, images."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(value: float, digits: int = 1) -> str:
    """0.9123 -> '91.2 %'; NaN -> 'n/a'."""
    return f"{100 * value:.{digits}f} %" if math.isfinite(value) else "n/a"


def pct_spread(stats: Mapping[str, float], digits: int = 1) -> str:
    """Mean ± sample std over seeds in percent, with the number of seeds: '91.2 ± 0.4 % (n=3)'."""
    if not math.isfinite(stats["mean"]):
        return "n/a"
    if stats["n"] < 2:
        return f"{100 * stats['mean']:.{digits}f} % (n=1)"
    return f"{100 * stats['mean']:.{digits}f} ± {100 * stats['std']:.{digits}f} % (n={stats['n']})"


def points(delta: float) -> str:
    """A difference of accuracies in percentage points, signed."""
    return f"{100 * delta:+.1f} pts" if math.isfinite(delta) else "n/a"


def image(path: str, alt: str) -> str:
    return f"![{alt}]({path})"


def section(title: str, *paragraphs: str) -> str:
    return "\n\n".join([f"## {title}", *[p for p in paragraphs if p]])


def verdict(holds: bool | None) -> str:
    """'holds' / 'does not hold here' / 'not measured'."""
    return {True: "holds", False: "**does not hold here**", None: "not measured"}[holds]


#: one checked claim of a seed: (the seed's trend, what we measured, holds?, comment)
Trend = tuple[str, str, bool | None, str]


def trends(rows: Sequence[Trend]) -> str:
    """The trend table: (seed's claim, what we measured, holds?, why / comment)."""
    return table(("seed's trend", "ours", "verdict", "comment"),
                 [(claim, ours, verdict(ok), why) for claim, ours, ok, why in rows])


def report(result: Sequence[str], figure: Sequence[str], trend_rows: Sequence[Trend],
           differences: str = "", figure_title: str = "Figure",
           trends_title: str = "Trends of the seed") -> str:
    """The body most presets' reports share, in this order: `## Result` (what ran, then its
    tables), the figure(s) with their notes, the seed's trends with verdicts, and how this
    setup differs from the seed's (left out where `differences` is empty)."""
    parts = [section("Result", *result), section(figure_title, *figure),
             section(trends_title, trends(trend_rows))]
    if differences:
        parts.append(section("Differences from the seed", differences))
    return "\n\n".join(parts)


def why(ok: bool | None, if_holds: str, if_not: str) -> str:
    """The comment that fits the verdict: what explains it holding, or not holding here."""
    return if_not if ok is False else if_holds


def join(*parts: str) -> str:
    """The non-empty parts joined with '; '."""
    return "; ".join(p for p in parts if p)
