"""Codec spec strings -> codec instances (docs/codecs.md "Formats", seeds 000 and 004)."""

from __future__ import annotations

import re
from collections.abc import Callable

from approxdist.comm.codecs import cast, fp8
from approxdist.comm.codecs.auto import parse_auto
from approxdist.comm.codecs.base import Codec
from approxdist.comm.codecs.bitfield import parse_bits
from approxdist.comm.codecs.table import MAX_N, parse_table
from approxdist.errors import SpecError
from approxdist.registry import Registry

#: fixed-name codecs; parameterised families are parsed by `FAMILIES`
CODECS: Registry[Callable[[], Codec]] = Registry("codec", SpecError)
CODECS.add("fp32", cast.fp32)
CODECS.add("fp16", cast.fp16)
CODECS.add("bf16", cast.bf16)
CODECS.add("fp8-e4m3", fp8.fp8_e4m3)
CODECS.add("fp8-e5m2", fp8.fp8_e5m2)

#: (pattern, builder, form, meaning) of the parameterised spec families
FAMILIES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], Codec], str, str]] = [
    (re.compile(r"bits:s([01])e(\d+(?:\+\d+)?)m(\d+)"), lambda m: parse_bits(*m.groups()),
     "bits:s<0|1>e<N|A+B>m<M>", "keep sign?, top N (or top A + bottom B) exponent and top M "
     "mantissa bits; unsent bits 0 (e.g. bits:s0e2+2m0)"),
    (re.compile(r"bits:auto(\d+)"), lambda m: parse_auto(m.group(1)),
     "bits:auto<K>", "K sign/exponent bits chosen from the observed histogram, K = 1..9"),
    (re.compile(r"table(\d+)"), lambda m: parse_table(m.group(1)),
     "table<N>", f"sign + (N-1)-bit index into 2^(N-1) percentile magnitudes, N = 1..{MAX_N}"),
]

_FIXED = (
    ("fp32", "exact, 32 bits/value"),
    ("fp16 | bf16", "IEEE half / bfloat16 cast, 16 bits/value"),
    ("fp8-e4m3 | fp8-e5m2", "8-bit floats with a per-tensor power-of-two scale"),
)

#: canonical specs of every format, for benchmarks and docs (seed 000's six schemes included)
DEFAULT_SPECS = (
    "fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2",
    "bits:s0e8m0", "bits:s0e1m0", "bits:s1e0m7", "bits:s1e1m0", "bits:s1e6m1",
    "bits:s0e2+2m0", "bits:auto4", "table1", "table2", "table4",
)


def codec_specs_help() -> str:
    """One line per valid spec form, for `--help` texts."""
    rows = list(_FIXED) + [(form, what) for _, _, form, what in FAMILIES]
    return "\n".join(f"  {form:<24} {what}" for form, what in rows)


def _forms() -> str:
    return " | ".join([form for form, _ in _FIXED] + [form for _, _, form, _ in FAMILIES])


def get_codec(spec: str) -> Codec:
    """A new codec for `spec`; each call returns a fresh instance with its own buffers.

    Keep the instance for repeated use: its work buffers (and, for `bits:auto<K>`, its
    calibration) live in it. A bad spec raises `SpecError` listing the valid forms.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"codec spec must be a non-empty string, got {spec!r}; "
                        f"valid forms: {_forms()}")
    text = spec.strip().lower()
    if text in CODECS:
        return CODECS.get(text)()
    for pattern, build, _, _ in FAMILIES:
        match = pattern.fullmatch(text)
        if match:
            return build(match)
    raise SpecError(f"unknown codec spec {spec!r}; valid forms: {_forms()}")
