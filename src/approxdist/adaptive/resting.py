"""Damaging candidates rest: exponential back-off of their speculation.

A codec's error on the update moves slowly over training (on the seed004-adaprec task
Table-4's grows from 0.32 to 0.41 over twelve phases, Table-1's stays near 4), so a
candidate found over the error budget at one boundary is very likely over it at the
next; speculating it again buys nothing and costs its steps. After `k` damaging
verdicts in a row a candidate rests for the next `2**k - 1` boundaries (tested again at
boundaries 1, 3, 7, 15, ... after the first), so over `B` boundaries it costs about
`log2(B)` speculations instead of `B`, and a codec that becomes safe is seen again
within twice the boundaries since its last verdict. A verdict other than `damaging`
(safe, diverged, collapsed) ends its streak: only the error, a measured and slowly
moving figure, earns the rest. Per parameter (`choose = layer`) a candidate rests only
when it is over the budget on every parameter alone, where `per_layer.assign` can use it
nowhere; one over it on the whole update may still suit some layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from approxdist.adaptive.per_layer import Sums, option
from approxdist.config.adaprec import AdaPrecConfig


@dataclass
class Resting:
    """Each candidate's run of damaging verdicts and the boundary it is tested again at."""

    streak: dict[str, int] = field(default_factory=dict)
    until: dict[str, int] = field(default_factory=dict)

    def resting(self, boundary: int) -> dict[str, int]:
        """The candidates not to speculate at boundary number `boundary` (counted from 1),
        each with the boundary number it is tested again at."""
        return {c: u for c, u in self.until.items() if u > boundary}

    def note(self, boundary: int, tested: Iterable[str], damaging: set[str]) -> None:
        """The candidates speculated at boundary number `boundary`, `damaging` of them."""
        for candidate in tested:
            if candidate in damaging:
                k = self.streak[candidate] = self.streak.get(candidate, 0) + 1
                self.until[candidate] = boundary + 2 ** k
            else:
                self.streak.pop(candidate, None)
                self.until.pop(candidate, None)


def damaging(cfg: AdaPrecConfig, verdicts: Mapping[str, Mapping[str, Any]],
             errors: Mapping[str, Sums]) -> set[str]:
    """The candidates that earn a rest: `damaging` (`Decision.records`' verdicts) for one
    codec for all; per parameter, those no parameter may take (`per_layer.option`)."""
    if cfg.choose == "all":
        return {c for c, r in verdicts.items() if r.get("verdict") == "damaging"}
    return {c for c, sums in errors.items()
            if sums and not any(option(s, cfg.error_budget) for s in sums.values())}
