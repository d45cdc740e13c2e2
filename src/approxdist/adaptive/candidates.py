"""What an AdaPrec candidate means for a data-parallel run's buckets (seed 004).

A candidate is a codec spec (`fp32`, `fp8-e5m2`, `table4`, `bits:s0e1m0`: every bucket in
that codec) or a named policy (`policy:seed004`, `policy:fastest`: its per-layer rules,
fp32 where they say nothing). The run's own `--codec-rule`s come first either way, so
`--codec-rule '*.bias=fp32'` keeps biases exact whatever AdaPrec picks. With
`adaprec.choose = "layer"` the controller also makes candidates of its own, one codec per
parameter (`mix:NAME=CODEC,...`, `per_layer.py`).

A compressor (`topk:0.01`, `qsgd:7`, `powersgd:2`, docs/compressors.md) is a candidate on
the data-parallel gradient wire like a codec: each compressed parameter its own bucket,
its state (residual, PowerSGD's Q, random stream) kept across switches and snapshots, its
error on the update measured from what this rank contributes (`comm.update_error`).
"""

from __future__ import annotations

import functools

from torch import nn

from approxdist.adaptive.per_layer import MIX, mix_rules
from approxdist.comm.codecs import get_codec
from approxdist.comm.compressors import Where, get_compressor, is_compressor
from approxdist.data_parallel.codec_rules import CodecRules
from approxdist.data_parallel.codec_times import CodecTimes
from approxdist.data_parallel.compressed import check_shapes
from approxdist.errors import ApproxDistError, ConfigError


def candidate_rules(candidate: str, rules: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(codec rules, default codec) that put `candidate` on the buckets."""
    if candidate.startswith("policy:"):
        return (*rules, candidate), "fp32"
    if candidate.startswith(MIX):
        return (*rules, *mix_rules(candidate)), "fp32"
    return rules, candidate


#: values of the flat tensor a compressor's bits per value are taken on (its scale or norm
#: then adds 32 / 65536 bits, top-k's at least one kept value nothing)
NOMINAL_NUMEL = 1 << 16


@functools.lru_cache(maxsize=64)
def codec_bits(candidate: str) -> float | None:
    """Bits per value of a candidate that is a codec spec or a compressor (its wire bytes
    on a flat tensor of `NOMINAL_NUMEL` values: top-k 1 % 0.64, QSGD 7 levels 4, sign 1);
    None for a policy, a mix, or PowerSGD (r (n + m) / (n m) values: each matrix's own)."""
    if candidate.startswith(("policy:", MIX)):
        return None
    try:
        if is_compressor(candidate):
            comp = get_compressor(candidate, Where((NOMINAL_NUMEL,)))
            return 8.0 * comp.bytes_per_value()
        return get_codec(candidate).bits_per_value
    except ApproxDistError:
        return None


def check_candidates(candidates: tuple[str, ...], rules: tuple[str, ...],
                     times: CodecTimes | None, per_layer: bool = False,
                     algorithm: str = "auto", compressors: bool = True) -> None:
    """Build every candidate's codecs once; an unknown one, a compressor that needs
    all-gather with an `algorithm` that only sums, a compressor where the wire takes none
    (`compressors=False`: a parameter server's pushes), PowerSGD when each parameter gets
    its own codec (its bits per value are each matrix's own), or a policy there, is one
    line naming it."""
    for cand in candidates:
        try:
            built = CodecRules.parse(*candidate_rules(cand, rules), times=times)
            built.validate(algorithm)
        except ApproxDistError as exc:
            first = " ".join(str(exc).split())
            raise ConfigError(f"AdaPrec candidate {cand!r}: {first}; list codec specs, "
                              f"compressors or policies, e.g. "
                              f"adaprec:fp32,fp8-e5m2,table4,topk:0.01") from None
        sent = {built.default, *(r.codec for r in built.rules)}
        squeezed = sorted(c for c in sent if is_compressor(c))
        if squeezed and not compressors:
            raise ConfigError(f"AdaPrec candidate {cand!r} sends {squeezed[0]!r}, a compressor: "
                              f"AdaPrec switches compressors on the data-parallel gradient "
                              f"wire (wire.grad); here list codec specs such as fp8-e5m2 or "
                              f"table4")
        low_rank = [c for c in squeezed if codec_bits(c) is None]
        if per_layer and low_rank:
            raise ConfigError(f"AdaPrec candidate {cand!r} sends {low_rank[0]!r}, whose bits "
                              f"per value depend on each matrix's shape, which "
                              f"adaprec.choose = 'layer' cannot weigh per parameter; use "
                              f"adaprec.choose = 'all' or a compressor of fixed bits "
                              f"(topk:0.01, qsgd:7, terngrad, sign+ef)")
        if per_layer and cand.startswith("policy:"):
            raise ConfigError(f"AdaPrec candidate {cand!r} is a policy, which already names a "
                              f"codec per parameter; adaprec.choose = 'layer' mixes codec specs "
                              f"per parameter: list codecs (e.g. fp32,fp8-e5m2,table4) or use "
                              f"adaprec.choose = 'all'")


def check_candidate_shapes(module: nn.Module, candidates: tuple[str, ...],
                           rules: tuple[str, ...]) -> None:
    """Every parameter of `module` a candidate's compressor cannot take (PowerSGD on a
    bias) named with the candidate and the rule that would exclude it, before any worker
    starts."""
    for cand in candidates:
        try:
            check_shapes(module, CodecRules.parse(*candidate_rules(cand, rules)))
        except ConfigError as exc:
            raise ConfigError(f"AdaPrec candidate {cand!r}: {exc}") from None
