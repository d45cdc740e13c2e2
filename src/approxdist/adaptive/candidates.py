"""What an AdaPrec candidate means for a data-parallel run's buckets (seed 004).

A candidate is a codec spec (`fp32`, `fp8-e5m2`, `table4`, `bits:s0e1m0`: every bucket in
that codec) or a named policy (`policy:seed004`, `policy:fastest`: its per-layer rules,
fp32 where they say nothing). The run's own `--codec-rule`s come first either way, so
`--codec-rule '*.bias=fp32'` keeps biases exact whatever AdaPrec picks. With
`adaprec.choose = "layer"` the controller also makes candidates of its own, one codec per
parameter (`mix:NAME=CODEC,...`, `per_layer.py`).
"""

from __future__ import annotations

from approxdist.adaptive.per_layer import MIX, mix_rules
from approxdist.comm.codecs import get_codec
from approxdist.comm.compressors import is_compressor
from approxdist.data_parallel.codec_rules import CodecRules
from approxdist.data_parallel.codec_times import CodecTimes
from approxdist.errors import ApproxDistError, ConfigError


def candidate_rules(candidate: str, rules: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(codec rules, default codec) that put `candidate` on the buckets."""
    if candidate.startswith("policy:"):
        return (*rules, candidate), "fp32"
    if candidate.startswith(MIX):
        return (*rules, *mix_rules(candidate)), "fp32"
    return rules, candidate


def codec_bits(candidate: str) -> float | None:
    """Bits per value of a candidate that is a codec spec; None for a policy or a mix."""
    if candidate.startswith(("policy:", MIX)):
        return None
    try:
        return get_codec(candidate).bits_per_value
    except ApproxDistError:
        return None


def check_candidates(candidates: tuple[str, ...], rules: tuple[str, ...],
                     times: CodecTimes | None, per_layer: bool = False) -> None:
    """Build every candidate's codecs once; an unknown one, one whose error the run cannot
    measure (a compressor: `comm.update_error` sees a codec's values, not a low-rank
    sketch) or a policy where each parameter gets its own codec is one line naming it."""
    for cand in candidates:
        try:
            built = CodecRules.parse(*candidate_rules(cand, rules), times=times)
            built.validate()
        except ApproxDistError as exc:
            first = " ".join(str(exc).split())
            raise ConfigError(f"AdaPrec candidate {cand!r}: {first}; list codec specs or "
                              f"policies, e.g. adaprec:fp32,fp8-e5m2,table4,table1") from None
        sent = {built.default, *(r.codec for r in built.rules)}
        squeezed = sorted(c for c in sent if is_compressor(c))
        if squeezed:
            raise ConfigError(f"AdaPrec candidate {cand!r} sends {squeezed[0]!r}, a compressor "
                              f"whose error on the update AdaPrec cannot measure (it judges "
                              f"the values a codec sends); list codec specs such as fp8-e5m2 "
                              f"or table4")
        if per_layer and cand.startswith("policy:"):
            raise ConfigError(f"AdaPrec candidate {cand!r} is a policy, which already names a "
                              f"codec per parameter; adaprec.choose = 'layer' mixes codec specs "
                              f"per parameter: list codecs (e.g. fp32,fp8-e5m2,table4) or use "
                              f"adaprec.choose = 'all'")
