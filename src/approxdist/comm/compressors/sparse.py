"""What top-k and random-k share: how many values a ratio keeps, and the ratio's spec."""

from __future__ import annotations

from approxdist.errors import SpecError


def kept(ratio: float, numel: int) -> int:
    """Values kept of `numel` at `ratio`: floor(ratio * numel), at least 1."""
    return max(1, min(numel, int(ratio * numel)))


def parse_ratio(name: str, text: str | None) -> float:
    """`topk:<ratio>` -> ratio in (0, 1]."""
    try:
        ratio = float(text) if text is not None else float("nan")
    except ValueError:
        ratio = float("nan")
    if not 0 < ratio <= 1:
        got = f"ratio {text!r}" if text is not None else "no ratio"
        raise SpecError(f"{name} {got}: it needs a fraction in (0, 1] of the values sent each "
                        f"step; e.g. {name}:0.01 for 1 %")
    return ratio
