"""Alpha-beta cost model of each all-reduce algorithm (seed 001's table; Hockney's model).

A step costs `alpha` (start-up, per message round) plus `beta` per byte a rank sends on
the critical path. With N ranks, p the largest power of two <= N, M the message bytes
on the wire (after the codec):

| algorithm | steps | bytes per rank |
|---|---|---|
| ring | 2 (N-1) | 2 M (N-1)/N |
| brb | 2 ceil(log2 N) | 2 M ceil(log2 N) |
| brd | log2 p (+2 if N != p) | M log2 p (+2 M) |
| vhd | 2 log2 p (+2 if N != p) | 2 M (p-1)/p (+2 M) |
| native | as ring | as ring, x `NATIVE_BYTE_FACTOR` on the machine's beta |

`DEFAULT` (alpha 0.5 ms, beta 1.5 ns/byte, about 0.7 GB/s) is the order of magnitude
measured with 4 gloo ranks on a 2-core machine over loopback, where a step costs a
fraction of a scheduler tick when ranks outnumber cores (docs/collectives.md). It only
steers `hybrid` when no calibration file is given. `native` is gloo's ring in C++: the
same steps and bytes as ours, but each byte costs less CPU (no Python between segments,
adds fused into the receive loop); `NATIVE_BYTE_FACTOR` = 0.8 is the ratio measured for
1-16 MB messages on 2 ranks. With an emulated link, the link's latency adds to alpha and
8/bandwidth to beta (for native too: its emulation holds it for the ring's link time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from approxdist.comm.collectives.base import ceil_log2, largest_power_of_two
from approxdist.comm.netem import LinkSpec


@dataclass(frozen=True)
class AlphaBeta:
    """Seconds per step and seconds per byte sent."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, steps: float, nbytes: float) -> float:
        return self.alpha_s * steps + self.beta_s_per_byte * nbytes

    def with_link(self, link: LinkSpec | None) -> AlphaBeta:
        if link is None:
            return self
        return AlphaBeta(self.alpha_s + link.latency_s,
                         self.beta_s_per_byte + 8.0 / link.bandwidth_bps)


DEFAULT = AlphaBeta(alpha_s=5e-4, beta_s_per_byte=1.5e-9)
#: `native`'s machine cost per byte relative to ours (see the module docstring)
NATIVE_BYTE_FACTOR = 0.8


def cost_terms(algorithm: str, world: int, nbytes: float) -> tuple[float, float]:
    """(steps, bytes sent per rank) on the critical path; see the table above."""
    n = world
    if n <= 1:
        return 0.0, 0.0
    p = largest_power_of_two(n)
    fold_steps, fold_bytes = (2.0, 2.0 * nbytes) if p != n else (0.0, 0.0)
    lg = math.log2(p)
    if algorithm in ("ring", "native"):
        return 2.0 * (n - 1), 2.0 * nbytes * (n - 1) / n
    if algorithm == "brb":
        return 2.0 * ceil_log2(n), 2.0 * nbytes * ceil_log2(n)
    if algorithm == "brd":
        return lg + fold_steps, nbytes * lg + fold_bytes
    if algorithm == "vhd":
        return 2.0 * lg + fold_steps, 2.0 * nbytes * (p - 1) / p + fold_bytes
    raise ValueError(f"no cost model for all-reduce {algorithm!r}")


def predict(algorithm: str, world: int, nbytes: float, model: AlphaBeta = DEFAULT,
            link: LinkSpec | None = None) -> float:
    """Predicted seconds for one all-reduce of `nbytes` wire bytes on `model`'s machine,
    plus `link`'s latency per step and transmission time per byte when emulated."""
    steps, sent = cost_terms(algorithm, world, nbytes)
    factor = NATIVE_BYTE_FACTOR if algorithm == "native" else 1.0
    t = model.alpha_s * steps + model.beta_s_per_byte * factor * sent
    return t if link is None else t + link.latency_s * steps + 8.0 * sent / link.bandwidth_bps
