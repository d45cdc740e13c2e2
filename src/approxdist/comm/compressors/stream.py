"""The stochastic compressors' random stream: counter-based, so C kernels and torch ops draw alike.

Draw i of step t of the stream seeded S is u = (mix32(key + i * 0x9E3779B9) >> 8) * 2**-24,
integer arithmetic mod 2**32, with key = key(S, t) and mix32 the "lowbias32" integer hash
(C. Wellons); u is a multiple of 2**-24 in [0, 1), uniform up to the hash's quality. A draw
depends on (S, t, i) only: a compressor's stream state is its step count, and a kernel
split over threads draws what one pass draws (`kernels/stream.h` is the C twin, tested
equal). Torch ops hold the 32-bit words in int64 lanes and multiply in 16-bit halves, so
no product overflows. A tensor's seed S comes from the run's seed and the tensor's name
(`named_seed`, through `spec.Where`), so no two tensors of a run share draws.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
_MIX = (0x7FEB352D, 0x846CA68B)


def mix32(h: int) -> int:
    """lowbias32 of a 32-bit integer (plain Python ints: the per-step keys)."""
    h &= MASK
    h ^= h >> 16
    h = (h * _MIX[0]) & MASK
    h ^= h >> 15
    h = (h * _MIX[1]) & MASK
    return h ^ (h >> 16)


def step_key(seed: int, step: int) -> int:
    """The 32-bit key of one step of the stream seeded `seed` (any Python int)."""
    return mix32((seed & MASK) ^ mix32(((seed >> 32) & MASK) ^ mix32(step)))


def named_seed(seed: int, name: str) -> int:
    """A 32-bit seed of the tensor `name` in a run seeded `seed` (any Python int): the crc32
    of the name mixed with the seed's words, the same in every process (Python's `hash()` of
    a string is salted per process)."""
    return mix32(zlib.crc32(name.encode()) ^ step_key(seed, 0))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for int64 `x` in [0, 2**47): two products below 2**63."""
    high = (x * (c >> 16)).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return (x * (c & 0xFFFF)).add_(high).bitwise_and_(MASK)


def uniform(key: int, n: int, device: torch.device | None = None) -> torch.Tensor:
    """Draws 0..n-1 of the step keyed `key`, as fp32 (torch ops; the kernels' reference)."""
    h = _mul32(torch.arange(n, dtype=torch.int64, device=device), GOLDEN).add_(key)
    h.bitwise_and_(MASK)
    h.bitwise_xor_(h >> 16)
    h = _mul32(h, _MIX[0])
    h.bitwise_xor_(h >> 15)
    h = _mul32(h, _MIX[1])
    h.bitwise_xor_(h >> 16)
    return h.bitwise_right_shift_(8).to(torch.float32).mul_(2.0**-24)


class Stream:
    """One compressor's stream: its seed, and the steps drawn so far kept in the compressor's
    `state` (under "steps"), so that a saved state resumes the stream bit for bit."""

    def __init__(self, seed: int, state: dict[str, torch.Tensor]) -> None:
        self.seed = seed
        self.steps = state["steps"] = torch.zeros((), dtype=torch.int64)

    def next_key(self) -> int:
        """The key of the next step (and count it)."""
        key = step_key(self.seed, int(self.steps))
        self.steps += 1
        return key


def next_keys(streams: Sequence[Stream]) -> list[int]:
    """Each stream's `next_key`, the steps read and counted in one op each (a bucket's)."""
    counters = [s.steps for s in streams]
    steps = torch.stack(counters).tolist() if counters else []
    torch._foreach_add_(counters, 1)
    return [step_key(s.seed, t) for s, t in zip(streams, steps, strict=True)]
