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
steers `auto` when no calibration file is given. `native` is gloo's ring in C++: the
same steps and bytes as ours, but each byte costs less CPU (no Python between segments,
adds fused into the receive loop); `NATIVE_BYTE_FACTOR` = 0.8 is the ratio measured for
1-16 MB messages on 2 ranks. With an emulated link, the link's latency adds to alpha and
8/bandwidth to beta (for native too: its emulation holds it for the ring's link time).

With a lossy codec every hop also encodes, decodes and adds on the CPU: `codec_work`
counts the values a rank passes through the codec on the critical path (V = values of
the message) and `predict` charges `CODEC_S_PER_VALUE` for each (about what a cast or
bit-field codec costs per value on one core here, encode and decode averaged; 0 on the
raw fp32 path, where nothing is encoded):

| algorithm | values through the codec per rank |
|---|---|
| ring, vhd | V + (2N-1) V/N (encode each chunk once, decode to add, to share, to land) |
| brd | 3 V log2 p (share and add the whole vector every step) |
| brb | (2 ceil(log2 N) + 1) V (add and re-encode per level, share, land) |
| folded (N != p) | + 3 V |

On 2 ranks this makes `ring` (2.5 V) beat `brd` (3 V) for large compressed messages,
which is what the data-parallel engine measures (bf16 gradients of a 9.5M-parameter MLP
at 1 Gbit/s: 226 ms per step with ring, 246 ms with brd).
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
#: seconds per value encoded or decoded by a lossy codec (see the module docstring)
CODEC_S_PER_VALUE = 1e-9


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


def codec_work(algorithm: str, world: int, values: float) -> float:
    """Values one rank encodes or decodes on the critical path (see the table above)."""
    n = world
    if n <= 1 or algorithm == "native":
        return 0.0
    p = largest_power_of_two(n)
    fold = 3.0 * values if p != n else 0.0
    if algorithm == "ring":
        return values + (2 * n - 1) * values / n
    if algorithm == "vhd":
        return values + (2 * p - 1) * values / p + fold
    if algorithm == "brd":
        return 3.0 * values * math.log2(p) + fold
    if algorithm == "brb":
        return (2.0 * ceil_log2(n) + 1.0) * values
    raise ValueError(f"no cost model for all-reduce {algorithm!r}")


def predict(algorithm: str, world: int, nbytes: float, model: AlphaBeta = DEFAULT,
            link: LinkSpec | None = None, codec_values: float = 0.0) -> float:
    """Predicted seconds for one all-reduce of `nbytes` wire bytes on `model`'s machine,
    plus `link`'s latency per step and transmission time per byte when emulated, plus
    the codec's CPU time when the message has `codec_values` values to encode (0: raw)."""
    steps, sent = cost_terms(algorithm, world, nbytes)
    factor = NATIVE_BYTE_FACTOR if algorithm == "native" else 1.0
    t = model.alpha_s * steps + model.beta_s_per_byte * factor * sent
    t += CODEC_S_PER_VALUE * codec_work(algorithm, world, codec_values)
    return t if link is None else t + AlphaBeta(0.0, 0.0).with_link(link).time(steps, sent)
