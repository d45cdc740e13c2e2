"""Which part of a split dimension a tensor-parallel rank holds (pure).

A dimension of size n split over `size` ranks gives rank r the contiguous slice
[r * n / size, (r + 1) * n / size); it must divide evenly (Megatron's rule: every rank
does the same work). Attention splits by heads: rank r holds heads [r * h / size, ...),
i.e. the rows of its heads in each of the q, k and v blocks of the fused projection.
"""

from __future__ import annotations

from approxdist.errors import ConfigError


def piece(n: int, rank: int, size: int, what: str) -> slice:
    """Rank `rank`'s slice of `n` items split over `size` ranks; `ConfigError` naming
    `what` when `size` does not divide `n`."""
    if n % size:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ConfigError(f"tp size {size} does not divide the {n} {what}; use a tp size "
                          f"among {', '.join(map(str, divisors[:8]))}"
                          + ("..." if len(divisors) > 8 else ""))
    step = n // size
    return slice(rank * step, (rank + 1) * step)


def head_rows(dim: int, heads: int, rank: int, size: int, parts: int = 3) -> list[int]:
    """The rows of a fused projection (`parts` blocks of `dim` rows, q, k, v) that hold
    rank `rank`'s heads."""
    mine = piece(heads, rank, size, "attention heads")
    width = dim // heads
    rows: list[int] = []
    for part in range(parts):
        start = part * dim + mine.start * width
        rows += range(start, start + (mine.stop - mine.start) * width)
    return rows
