"""Gradient buckets and fragments: which values travel together, in which order (seed 001).

Seed 001 starts each layer's all-reduce as soon as backward has produced its gradient,
and cuts a large gradient into fragments that several communication threads carry at
once. DDP adds buckets: many small gradients in one message. This module is the pure
plan for both (no torch.distributed, testable in one process):

* `plan_buckets` walks the parameters in reverse registration order (the order backward
  produces them, as DDP assumes before its first rebuild) and closes a bucket when the
  next parameter would push it past the cap or needs another codec (one wire format per
  message). The first bucket is capped at `first_bucket_bytes` so communication starts
  early. A parameter of at least `solo_bytes` gets a bucket of its own: its gradient is
  big enough to be a good message alone and is then reduced in place, with no copy
  (`reducer.BucketState.hold`). A compressor shares its bucket with parameters of the
  same compressor and with exact fp32 ones (a rule's `*.bias=fp32`), as a DDP bucket
  under torch's `powerSGD_hook` holds matrices and vectors alike: an all-reduce
  compatible one's (PowerSGD, random-k) exchange sends every member's round in one
  all-reduce (`comm.compressors.together`), an all-gather one's (top-k, QSGD, TernGrad,
  the sign methods) every member's payload in one all-gather
  (`comm.compressors.gathered_together`). Inside a bucket
  the parameters are laid out in *forward* order, so the values the next forward reads
  first lead the message and its first fragments.
* `fragments(numel, chunk_numel)` cuts a bucket into contiguous fragments.
* `forward_order(n)` is the launch order used when every bucket starts at the end of
  backward (no overlap): the bucket the next forward needs first goes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from approxdist.comm.compressors import is_compressor


@dataclass(frozen=True)
class ParamInfo:
    """What the planner needs to know about one parameter."""

    name: str
    numel: int
    codec: str
    position: int  # registration (forward) order


@dataclass(frozen=True)
class BucketPlan:
    """One bucket: its parameters (forward order), their offsets, total size and codec."""

    index: int
    names: tuple[str, ...]
    positions: tuple[int, ...]
    offsets: tuple[int, ...]
    numels: tuple[int, ...]
    codec: str
    #: each member's codec where they differ (exact `fp32` beside an all-reduce compatible
    #: compressor, which is then `codec`); empty: all `codec`
    codecs: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.numels else 0

    def codec_of(self, slot: int) -> str:
        """The codec of member `slot`."""
        return self.codecs[slot] if self.codecs else self.codec


def plan_buckets(params: Sequence[ParamInfo], bucket_bytes: int,
                 first_bucket_bytes: int | None = None, solo_bytes: int | None = None,
                 bytes_per_value: int = 4) -> list[BucketPlan]:
    """Buckets in the order gradients become ready (bucket 0 holds the last layers).

    A parameter larger than the cap, or of at least `solo_bytes`, gets a bucket of its
    own. `bucket_bytes <= 0` means one parameter per bucket (seed 001's per-layer
    all-reduce).
    """
    first = bucket_bytes if first_bucket_bytes is None else first_bucket_bytes
    solo = solo_bytes if solo_bytes is not None and solo_bytes > 0 else None
    groups: list[list[ParamInfo]] = []
    size, open_ = 0, False
    for info in sorted(params, key=lambda p: -p.position):
        cap = first if len(groups) <= 1 else bucket_bytes
        nbytes = info.numel * bytes_per_value
        alone = solo is not None and nbytes >= solo
        fits = open_ and not alone and _mixes(groups[-1], info.codec) and size + nbytes <= cap
        if not fits:
            groups.append([])
            size = 0
        groups[-1].append(info)
        size += nbytes
        open_ = not alone
    return [_bucket(i, g) for i, g in enumerate(groups)]


def _mixes(group: list[ParamInfo], codec: str) -> bool:
    """Whether a parameter sent in `codec` may join `group`: the same codec, or exact fp32
    and one compressor together."""
    codecs = {p.codec for p in group} | {codec}
    if len(codecs) == 1:
        return True
    other = codecs - {"fp32"}
    return len(codecs) == 2 and len(other) == 1 and is_compressor(next(iter(other)))


def _bucket(index: int, members: list[ParamInfo]) -> BucketPlan:
    members = sorted(members, key=lambda p: p.position)
    offsets, at = [], 0
    for m in members:
        offsets.append(at)
        at += m.numel
    codecs = tuple(m.codec for m in members)
    codec = next((c for c in codecs if is_compressor(c)), codecs[0])
    return BucketPlan(index, tuple(m.name for m in members), tuple(m.position for m in members),
                      tuple(offsets), tuple(m.numel for m in members), codec,
                      codecs if len(set(codecs)) > 1 else ())


def fragments(numel: int, chunk_numel: int) -> list[tuple[int, int]]:
    """Contiguous `[start, stop)` ranges of at most `chunk_numel` values (one if <= 0)."""
    if numel == 0:
        return []
    if chunk_numel <= 0 or chunk_numel >= numel:
        return [(0, numel)]
    return [(a, min(a + chunk_numel, numel)) for a in range(0, numel, chunk_numel)]


def forward_order(n_buckets: int) -> list[int]:
    """Bucket indices in the order the next forward needs them (first layers first)."""
    return list(range(n_buckets - 1, -1, -1))
