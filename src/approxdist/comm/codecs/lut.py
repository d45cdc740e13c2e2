"""Decoding packed codes by table lookup: one gather per value instead of bit arithmetic (seed 000/004).

For widths that divide 8 (1, 2, 4, 8) each packed byte holds G = 8/w whole codes, so a
256-row table of G decoded values turns every byte into G fp32 values with one
`index_select`; other widths unpack to int32 codes and gather from a 2^w-entry table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.bitpack import unpack_codes


def byte_digits(width: int) -> torch.Tensor:
    """(256, 8/width) int64: the codes packed in each possible byte, first code first."""
    g = 8 // width
    b = torch.arange(256, dtype=torch.int64).view(256, 1)
    shifts = torch.arange(g, dtype=torch.int64) * width
    return (b >> shifts) & ((1 << width) - 1)


class LutTables(NamedTuple):
    """The code values (2**width fp32) and, for widths dividing 8, the per-byte rows."""

    values: torch.Tensor
    rows: torch.Tensor | None


class LutDecoder:
    """Decodes `width`-bit packed codes through a table of their fp32 values."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.per_byte = 8 % width == 0
        self._digits: dict[torch.device, torch.Tensor] = {}

    def tables(self, values: torch.Tensor) -> LutTables:
        """Everything `decode` needs for the code values `values`."""
        return LutTables(values, self.rows(values) if self.per_byte else None)

    def rows(self, values: torch.Tensor) -> torch.Tensor:
        """The per-byte table (256, 8/width) for code values `values` (2**width fp32)."""
        digits = self._digits.get(values.device)
        if digits is None:
            digits = self._digits.setdefault(values.device, byte_digits(self.width).to(values.device))
        return values[digits]

    def decode(self, data: torch.Tensor, n: int, out: torch.Tensor, work: BufferPool,
               tables: LutTables) -> None:
        """Fill flat fp32 `out` (n values) from packed `data` given the code tables."""
        rows = tables.rows
        if rows is None:
            codes = unpack_codes(data, self.width, n, work)
            torch.index_select(tables.values, 0, codes, out=out)
            return
        idx = work.get("lut_idx", data.numel(), torch.int32, data.device).copy_(data)
        g = rows.shape[1]
        full = n // g
        if full:
            _gather_rows(rows, idx[:full], out[: full * g].view(full, g))
        if full * g < n:
            row = work.get("lut_tail", g, torch.float32, data.device).view(1, g)
            torch.index_select(rows, 0, idx[full:], out=row)
            out[full * g:].copy_(row.view(-1)[: n - full * g])


def _gather_rows(rows: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    """out[i] = rows[idx[i]], moving rows of even length as int64 words (faster gathers)."""
    g = rows.shape[1]
    if g == 1:
        torch.index_select(rows.view(-1), 0, idx, out=out.view(-1))
    elif out.storage_offset() % 2 == 0:
        words, dest = rows.contiguous().view(torch.int64), out.view(torch.int64)
        if g == 2:  # a 1-D gather is much faster than a gather of 1-element rows
            words, dest = words.view(-1), dest.view(-1)
        torch.index_select(words, 0, idx, out=dest)
    else:
        torch.index_select(rows, 0, idx, out=out)


class CachedLut:
    """A `LutDecoder` whose code values are fixed: tables are built once per device."""

    def __init__(self, width: int, values: Callable[[], torch.Tensor]) -> None:
        self.decoder = LutDecoder(width)
        self._make = values
        self._tables: dict[torch.device, LutTables] = {}

    def tables(self, device: torch.device) -> LutTables:
        tables = self._tables.get(device)
        if tables is None:
            tables = self._tables.setdefault(device, self.decoder.tables(self._make().to(device)))
        return tables

    def values(self, device: torch.device) -> torch.Tensor:
        return self.tables(device).values

    def decode(self, data: torch.Tensor, n: int, out: torch.Tensor, work: BufferPool) -> None:
        self.decoder.decode(data, n, out, work, self.tables(data.device))
