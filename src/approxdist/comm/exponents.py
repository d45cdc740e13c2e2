"""Histograms of the fp32 exponent field and the bit schemes they suggest (seed 000 §4.4, Figure 5).

Seed 000 chose "top 2 + bottom 2 exponent bits" from a histogram of the 8-bit exponent
field of transferred activations: ~18 % exact zeros, >99.99 % of values expressible.
`exponent_report` reproduces that analysis for any tensor: coverage of every
`bits:s0e<A+B>m0` scheme (unsent bits 0) and of the data-aware `bits:auto<K>` choice.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

#: seed 000's criterion for "the scheme expresses the data"
TARGET_COVERAGE = 0.9999
FIELD_BITS = 9  # sign + 8 exponent bits


def field_histogram(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Counts (int64, 2**bits bins) of the top fp32 field: bits=8 the exponent, 9 sign+exponent."""
    xi = x.detach().reshape(-1).float().view(torch.int32)
    fields = (xi >> 23) & ((1 << bits) - 1)
    return torch.bincount(fields.to(torch.int64), minlength=1 << bits).cpu()


def exponent_histogram(x: torch.Tensor) -> torch.Tensor:
    """Counts of the 8-bit exponent field of fp32 `x` (256 bins; bin 0 = zeros and subnormals)."""
    return field_histogram(x, 8)


def scheme_coverage(hist: torch.Tensor, top: int, bottom: int) -> float:
    """Fraction of values whose exponent `bits:s?e<top>+<bottom>m?` reproduces exactly.

    An exponent is reproduced when every unsent bit is 0 (the receiver fills zeros).
    """
    kept = sum(1 << (7 - i) for i in range(top)) | ((1 << bottom) - 1)
    exps = torch.arange(256)
    ok = (exps & ~kept & 0xFF) == 0
    total = int(hist.sum())
    return float(hist[ok].sum()) / total if total else 1.0


def typical_value(fields: torch.Tensor) -> torch.Tensor:
    """Representative value (float64) of fp32 values with 9-bit sign+exponent field `fields`.

    The geometric middle of the binade, sqrt(2) * 2**(e-127) (so a field's own value,
    2**(e-127), is always its nearest); 0 for e = 0 (zeros, subnormals) and
    +-sqrt(2) * 2**128 for e = 255 (Inf, NaN).
    """
    return _field_value(fields, math.sqrt(2.0))


def decoded_value(fields: torch.Tensor) -> torch.Tensor:
    """Value (float64) a receiver produces from a field with mantissa 0 (e = 255 as 2**128)."""
    return _field_value(fields, 1.0)


def _field_value(fields: torch.Tensor, mantissa: float) -> torch.Tensor:
    exp = (fields & 0xFF).double()
    sign = 1.0 - 2.0 * (fields >> 8).double()
    value = mantissa * torch.exp2(exp - 127.0)
    return sign * torch.where(exp == 0, torch.zeros_like(value), value)


def nearest(fields: torch.Tensor, reps: torch.Tensor) -> torch.Tensor:
    """For each field, the index in `reps` whose decoded value is closest to its typical value."""
    cost = (typical_value(fields).view(-1, 1) - decoded_value(reps).view(1, -1)).abs()
    return cost.argmin(dim=1)


def spread(values: torch.Tensor, bits: list[int]) -> torch.Tensor:
    """Deposit the low len(bits) bits of `values` at positions `bits` (lowest first)."""
    out = torch.zeros_like(values)
    for i, b in enumerate(bits):
        out |= ((values >> i) & 1) << b
    return out


def best_fields(hist: torch.Tensor, k: int) -> tuple[int, int, float]:
    """The k bits of the 9-bit sign+exponent field to send, and constants for the others.

    For every subset of k bits (at most C(9, 4) = 126) and every constant of the unsent
    bits, each observed field is mapped to the nearest value the receiver can produce;
    the choice with the least expected absolute error (fields at their typical value,
    Inf and NaN left out) wins. Returns (sent-bit mask, constant of the unsent bits, fraction of values whose
    sign and exponent are reproduced exactly).
    """
    observed = hist.nonzero().view(-1)
    finite = observed[(observed & 0xFF) != 0xFF]  # Inf/NaN would swamp the error sum
    if finite.numel() == 0:
        return (1 << k) - 1, 0, 1.0
    weights = hist[finite].double()
    grid = torch.arange(1 << FIELD_BITS, dtype=torch.int64)
    cost = (typical_value(finite).view(-1, 1) - decoded_value(grid).view(1, -1)).abs()
    err = torch.empty_like(cost)
    best = (math.inf, (1 << k) - 1, 0)
    for subset in itertools.combinations(range(FIELD_BITS), k):
        sent = sum(1 << b for b in subset)
        coset = (grid & ~sent).expand_as(cost)  # fields sharing the unsent bits
        err.fill_(math.inf).scatter_reduce_(1, coset, cost, "amin")
        total = (weights.view(-1, 1) * err).sum(dim=0)  # expected error per constant
        const = int(total.argmin())
        if float(total[const]) < best[0]:
            best = (float(total[const]), sent, const)
    return best[1], best[2], _covered(observed, hist[observed].double(), best[1], best[2])


def _covered(fields: torch.Tensor, weights: torch.Tensor, sent: int, const: int) -> float:
    total = float(weights.sum())
    if total == 0:
        return 1.0
    ok = (fields & ~sent) == const
    return float(weights[ok].sum()) / total


@dataclass
class ExponentReport:
    """Seed 000 Figure 5 for one tensor: exponent histogram, zeros, scheme coverage."""

    total: int
    zeros: int
    histogram: list[int]
    coverage: dict[str, float] = field(default_factory=dict)
    auto_coverage: dict[int, float] = field(default_factory=dict)

    @property
    def zero_fraction(self) -> float:
        return self.zeros / self.total if self.total else 0.0

    def suggest_bits(self) -> str:
        """The narrowest `bits:s0e...m0` scheme reaching `TARGET_COVERAGE` (seed 000's rule)."""
        good = [(_width(spec), -cover, spec) for spec, cover in self.coverage.items()
                if cover >= TARGET_COVERAGE]
        return min(good)[2] if good else "bits:s0e8m0"

    def suggest_auto(self) -> str:
        for k in sorted(self.auto_coverage):
            if self.auto_coverage[k] >= TARGET_COVERAGE:
                return f"bits:auto{k}"
        return "bits:auto9"

    def to_dict(self) -> dict[str, object]:
        return {"total": self.total, "zeros": self.zeros, "zero_fraction": self.zero_fraction,
                "histogram": self.histogram, "coverage": self.coverage,
                "auto_coverage": {str(k): v for k, v in self.auto_coverage.items()},
                "suggest_bits": self.suggest_bits(), "suggest_auto": self.suggest_auto()}


def _width(spec: str) -> int:
    exp = spec.split("e")[1].split("m")[0]
    return sum(int(p) for p in exp.split("+"))


def exponent_report(x: torch.Tensor) -> ExponentReport:
    """Histogram, exact zeros and the coverage of every exponent-only scheme for `x`."""
    flat = x.detach().reshape(-1).float()
    hist = exponent_histogram(flat)
    report = ExponentReport(total=flat.numel(), zeros=int((flat == 0).sum()),
                            histogram=[int(c) for c in hist])
    for top in range(9):
        for bottom in range(9 - top):
            if top + bottom > 0:
                spec = f"bits:s0e{top}+{bottom}m0" if bottom and top + bottom < 8 \
                    else f"bits:s0e{top + bottom}m0"
                report.coverage.setdefault(spec, scheme_coverage(hist, top, bottom))
    sign_exp = field_histogram(flat, 9)
    for k in range(1, 10):
        report.auto_coverage[k] = best_fields(sign_exp, k)[2]
    return report
