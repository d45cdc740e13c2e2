"""Sums of fp32 values in one fixed order, whatever the thread count: C kernels and torch ops alike.

The values are cut into chunks of 2048 (the last one shorter); a chunk's sum is that of 16
lanes, lane j adding the chunk's values j, j + 16, j + 32, ... in turn from +0, then the
lanes folded in halves (lane j + 8 onto lane j, then j + 4, j + 2, j + 1); the chunks'
sums are folded in halves the same way, padded with zeros to a power of two. Every step is
one fp32 addition of two named values, so the result depends on the values only, not on
how many threads a kernel splits them over (`kernels/ordered.h` is the C twin, tested
equal); torch's own `sum` splits by the thread count and may round differently with 1 and
2 threads. Zeros padding a chunk change no sum of magnitudes.
"""

from __future__ import annotations

import torch

CHUNK = 2048
LANES = 16


def fold(sums: torch.Tensor) -> torch.Tensor:
    """Fold the last dimension in halves (its length a power of two) down to one value."""
    while sums.shape[-1] > 1:
        half = sums.shape[-1] // 2
        sums = sums[..., :half] + sums[..., half:]
    return sums[..., 0]


def ordered_sum(values: torch.Tensor) -> torch.Tensor:
    """The fixed-order sum of the flat fp32 `values` (non-negative: magnitudes), 0-d fp32."""
    n = values.numel()
    chunks = -(-n // CHUNK)
    flat = values.reshape(-1)
    if n != chunks * CHUNK:
        flat = torch.cat([flat, flat.new_zeros(chunks * CHUNK - n)])
    # row r of every chunk side by side: each step below one contiguous addition
    rows = flat.view(chunks, CHUNK // LANES, LANES).transpose(0, 1).contiguous()
    lanes = torch.zeros(chunks, LANES, dtype=torch.float32, device=values.device)
    for row in rows:
        lanes += row
    size = 1 << max(chunks - 1, 0).bit_length()
    sums = torch.zeros(size, dtype=torch.float32, device=values.device)
    sums[:chunks] = fold(lanes)
    return fold(sums)
