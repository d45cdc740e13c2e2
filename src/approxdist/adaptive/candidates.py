"""What an AdaPrec candidate means for a data-parallel run's buckets (seed 004).

A candidate is a codec spec (`fp32`, `fp8-e5m2`, `table4`, `bits:s0e1m0`: every bucket in
that codec) or a named policy (`policy:seed004`, `policy:fastest`: its per-layer rules,
fp32 where they say nothing). The run's own `--codec-rule`s come first either way, so
`--codec-rule '*.bias=fp32'` keeps biases exact whatever AdaPrec picks.
"""

from __future__ import annotations

from approxdist.data_parallel.codec_rules import CodecRules
from approxdist.data_parallel.codec_times import CodecTimes
from approxdist.errors import ApproxDistError, ConfigError


def candidate_rules(candidate: str, rules: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(codec rules, default codec) that put `candidate` on the buckets."""
    if candidate.startswith("policy:"):
        return (*rules, candidate), "fp32"
    return rules, candidate


def check_candidates(candidates: tuple[str, ...], rules: tuple[str, ...],
                     times: CodecTimes | None) -> None:
    """Build every candidate's codecs once; an unknown one is one line naming it."""
    for cand in candidates:
        try:
            CodecRules.parse(*candidate_rules(cand, rules), times=times).validate()
        except ApproxDistError as exc:
            first = " ".join(str(exc).split())
            raise ConfigError(f"AdaPrec candidate {cand!r}: {first}; list codec specs or "
                              f"policies, e.g. adaprec:fp32,fp8-e5m2,table4,table1") from None
