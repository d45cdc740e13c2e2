"""The 16-byte payload header every codec writes (docs/codecs.md "Payload layout", seed 000).

Layout (little-endian):

| bytes | content |
|---|---|
| 0-1 | magic ``b"AX"`` |
| 2 | header version (1) |
| 3 | codec family id (`FAMILY_IDS`) |
| 4-7 | CRC-32 of the canonical spec string (so ``bits:s0e8m0`` != ``bits:s1e1m0``) |
| 8-15 | number of encoded values (uint64) |

Codec metadata (scale, table, calibration) follows, then the packed value codes.
"""

from __future__ import annotations

import struct
import zlib

import torch

from approxdist.errors import CodecError

HEADER_NBYTES = 16
MAGIC = b"AX"
VERSION = 1
_FMT = "<2sBBIQ"

#: one id per codec family; the CRC of the spec tells members of a family apart
FAMILY_IDS: dict[str, int] = {
    "fp32": 1, "fp16": 2, "bf16": 3, "fp8-e4m3": 4, "fp8-e5m2": 5,
    "bits": 6, "table": 7, "auto": 8,
}
_FAMILY_NAMES = {v: k for k, v in FAMILY_IDS.items()}


def spec_crc(spec: str) -> int:
    """CRC-32 of a canonical spec string, as stored in bytes 4-7 of the header."""
    return zlib.crc32(spec.encode()) & 0xFFFFFFFF


def header_bytes(family: str, spec: str, numel: int) -> torch.Tensor:
    """The 16 header bytes as a CPU uint8 tensor."""
    raw = struct.pack(_FMT, MAGIC, VERSION, FAMILY_IDS[family], spec_crc(spec), numel)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def write_header(out: torch.Tensor, family: str, spec: str, numel: int) -> None:
    """Write the header into the first 16 bytes of the uint8 payload buffer `out`."""
    out[:HEADER_NBYTES].copy_(header_bytes(family, spec, numel))


def check_header(data: torch.Tensor, family: str, spec: str, numel: int, nbytes: int) -> None:
    """Raise `CodecError` unless `data` is a complete payload of codec `spec` for `numel` values.

    `nbytes` is the exact expected payload size (`Codec.payload_nbytes(numel)`).
    """
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise CodecError(f"payload for {spec!r} must be a 1-D uint8 tensor, got "
                         f"{data.dtype} with shape {tuple(data.shape)}")
    if data.numel() < HEADER_NBYTES:
        raise CodecError(f"payload for {spec!r} is truncated: {data.numel()} bytes, "
                         f"shorter than the {HEADER_NBYTES}-byte header")
    magic, version, fam, crc, n = struct.unpack(_FMT, bytes(data[:HEADER_NBYTES].tolist()))
    if magic != MAGIC or version != VERSION:
        raise CodecError(f"payload for {spec!r} has no approxdist header (magic {magic!r}, "
                         f"version {version}); it was not made by an approxdist codec")
    if fam != FAMILY_IDS[family] or crc != spec_crc(spec):
        name = _FAMILY_NAMES.get(fam, f"unknown family {fam}")
        raise CodecError(f"payload was made by a different codec ({name}) than {spec!r}; "
                         f"decode with the sender's codec spec")
    if n != numel:
        raise CodecError(f"payload for {spec!r} holds {n} values but shape asks for {numel}; "
                         f"send the shape with the payload")
    if data.numel() != nbytes:
        raise CodecError(f"payload for {spec!r} with {numel} values must be {nbytes} bytes, "
                         f"got {data.numel()} (truncated or padded in transit)")
