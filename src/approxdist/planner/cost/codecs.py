"""What a wire format costs and saves: bytes on the wire, encode and decode seconds (seeds 000, 004).

`CodecCost(spec, encode_s_per_byte, decode_s_per_byte)` prices one codec spec. Bytes are
exact: `wire_bytes(n)` is what our link layer sends for n fp32 values, the codec's
`payload_nbytes(n)` (header and table included), or 4n on the raw `fp32` path (the
values' own bytes, nothing encoded: seconds are 0 there). Coding seconds are per fp32
byte of input, as `bench codec` measures them (GB/s of fp32 input):
`encode_s_per_byte = 1 / (encode_gbps x 1e9)`; without a measurement each lossy codec
gets the collectives' default, `CODEC_S_PER_VALUE` / 4 for each of encode and decode.

**Break-even bandwidth.** Sending n fp32 bytes compressed instead of raw saves
n (1 - r) bytes (r the wire ratio) and costs n (e + d) seconds of coding; at a link of B
bytes/s compressing pays when n (e + d) < n (1 - r) / B, that is below

    B* = (1 - r) / (e + d)   bytes/s   (8 B* bit/s)

with no overlap of coding and transfer (what `bench codec` prints as `break_even_gbit`).
A `LinkLevel` moves 1/beta bytes/s, so compressing pays on it when 1/beta < B*.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from approxdist.comm.codecs import Codec, get_codec
from approxdist.comm.collectives.model import CODEC_S_PER_VALUE
from approxdist.errors import ApproxDistError, ConfigError, DataError
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.cost.rows import read_rows

#: encode (and decode) seconds per fp32 byte of a lossy codec nobody measured
DEFAULT_S_PER_BYTE = CODEC_S_PER_VALUE / 4
#: `bench codec` rows that are baselines, not codecs
BASELINES = ("copy_", "fp16-cast")
#: values at which `wire_ratio` is quoted by default (headers and tables are then < 0.1 %)
RATIO_VALUES = 1 << 20


@dataclass(frozen=True)
class CodecCost:
    """One wire format: exact wire bytes and seconds per fp32 byte to encode and decode.

    `CodecCost.of(spec)` fills unmeasured seconds: 0 on the raw fp32 path, else
    `DEFAULT_S_PER_BYTE`."""

    spec: str
    encode_s_per_byte: float
    decode_s_per_byte: float
    codec: Codec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        codec = get_codec(self.spec)  # SpecError listing the valid forms
        object.__setattr__(self, "codec", codec)
        object.__setattr__(self, "spec", codec.spec)
        for key in ("encode_s_per_byte", "decode_s_per_byte"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"codec {self.spec!r} {key} = {value!r} must be a finite "
                                  f"number of seconds >= 0")
        if self.raw and (self.encode_s_per_byte or self.decode_s_per_byte):
            raise ConfigError(f"codec 'fp32' travels raw (nothing is encoded), so its seconds "
                              f"must be 0, got {self.encode_s_per_byte!r}, "
                              f"{self.decode_s_per_byte!r}; use CodecCost.of('fp32')")

    @classmethod
    def of(cls, spec: str, encode_s_per_byte: float | None = None,
           decode_s_per_byte: float | None = None) -> CodecCost:
        """`spec` with the given seconds per fp32 byte, or the defaults for those not given."""
        default = 0.0 if get_codec(spec).spec == "fp32" else DEFAULT_S_PER_BYTE
        return cls(spec, default if encode_s_per_byte is None else encode_s_per_byte,
                   default if decode_s_per_byte is None else decode_s_per_byte)

    @property
    def raw(self) -> bool:
        """fp32: the values' own bytes travel; nothing is encoded or decoded."""
        return self.spec == "fp32"

    @property
    def lossless(self) -> bool:
        return self.codec.lossless

    def wire_bytes(self, values: int) -> int:
        """Bytes one message of `values` fp32 values puts on the wire (0 for none)."""
        if values <= 0:
            return 0
        return 4 * values if self.raw else self.codec.payload_nbytes(values)

    def wire_ratio(self, values: int = RATIO_VALUES) -> float:
        """payload bytes / fp32 bytes of one message of `values` values."""
        return self.wire_bytes(values) / (4.0 * values)

    def encode_s(self, fp32_bytes: float) -> float:
        return self.encode_s_per_byte * fp32_bytes

    def decode_s(self, fp32_bytes: float) -> float:
        return self.decode_s_per_byte * fp32_bytes

    def break_even_bytes_per_s(self, values: int = RATIO_VALUES) -> float:
        """B* = (1 - r) / (e + d): compressing pays on links slower than this (0: never
        pays; inf: always pays, coding being free)."""
        saved = 1.0 - self.wire_ratio(values)
        if saved <= 0:
            return 0.0
        coding = self.encode_s(1.0) + self.decode_s(1.0)
        return math.inf if coding == 0 else saved / coding

    def pays_on(self, level: LinkLevel, values: int = RATIO_VALUES) -> bool:
        """Whether sending `values` values in this format beats raw fp32 on `level`:
        alpha + beta w + (e + d) 4n < alpha + beta 4n."""
        coded = level.p2p_s(self.wire_bytes(values)) + self.encode_s(4 * values) \
            + self.decode_s(4 * values)
        return coded < level.p2p_s(4 * values)


def codec_costs_from_bench(rows: Sequence[Mapping[str, Any]],
                           source: str = "bench codec rows") -> dict[str, CodecCost]:
    """Spec -> `CodecCost` from the rows `approxdist bench codec --json` writes (baselines
    skipped); `DataError` naming the row and key that is missing or bad."""
    out: dict[str, CodecCost] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "codec" not in row:
            raise DataError(f"{source}[{i}] = {row!r} is not a bench codec row (no 'codec'); "
                            f"write rows with approxdist bench codec --json FILE")
        if row["codec"] in BASELINES:
            continue
        enc, dec = row.get("encode_gbps"), row.get("decode_gbps")
        if not (_rate(enc) and _rate(dec)):
            raise DataError(f"{source}[{i}] ({row['codec']!r}) encode_gbps, decode_gbps = "
                            f"{enc!r}, {dec!r} must be GB/s > 0; re-run approxdist bench "
                            f"codec --json FILE")
        try:
            spec = get_codec(str(row["codec"])).spec
        except ApproxDistError as exc:
            raise DataError(f"{source}[{i}]: {exc}") from None
        # fp32 travels raw in the link layer: its measured coding is never paid
        out[spec] = CodecCost.of("fp32") if spec == "fp32" else \
            CodecCost(spec, 1e-9 / enc, 1e-9 / dec)
    return out


def _rate(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def read_bench_codec(path: str | Path) -> dict[str, CodecCost]:
    """`codec_costs_from_bench` of a `bench codec --json` file; one `DataError` line if the
    file is missing, not JSON or not a list of rows."""
    data = read_rows(path, "bench codec --json")
    return codec_costs_from_bench(data, f"bench codec file {str(path)!r} row")

