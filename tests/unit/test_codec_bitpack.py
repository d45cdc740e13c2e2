"""Bit-packing of w-bit codes: every width 1..32 against a bit-by-bit Python reference."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.bitpack import code_dtype, pack_codes, packed_nbytes, unpack_codes


def reference_pack(codes: list[int], width: int) -> list[int]:
    """LSB-first stream: code i at bits [i*w, (i+1)*w), bit p in byte p // 8."""
    stream = 0
    for i, c in enumerate(codes):
        stream |= c << (i * width)
    return list(stream.to_bytes(packed_nbytes(len(codes), width), "little"))


def as_code_tensor(codes: list[int], width: int) -> torch.Tensor:
    wrapped = [c - (1 << 32) if width == 32 and c >= 1 << 31 else c for c in codes]
    return torch.tensor(wrapped, dtype=torch.int64).to(code_dtype(width))


@st.composite
def width_and_codes(draw: st.DrawFn) -> tuple[int, list[int]]:
    width = draw(st.integers(1, 32))
    codes = draw(st.lists(st.integers(0, (1 << width) - 1), max_size=40))
    return width, codes


@settings(max_examples=150, deadline=None)
@given(width_and_codes())
def test_pack_matches_reference_and_unpacks(case: tuple[int, list[int]]) -> None:
    width, codes = case
    work = BufferPool()
    out = torch.empty(packed_nbytes(len(codes), width), dtype=torch.uint8)
    pack_codes(as_code_tensor(codes, width), width, out, work)
    assert out.tolist() == reference_pack(codes, width)
    back = unpack_codes(out, width, len(codes), work).to(torch.int64) & 0xFFFFFFFF
    assert back.tolist() == codes


def test_every_width_packs_to_ceil_bytes() -> None:
    work = BufferPool()
    for width in range(1, 33):
        for n in (0, 1, 7, 8, 9, 1001):
            codes = [(i * 2654435761) % (1 << width) for i in range(n)]
            out = torch.empty(packed_nbytes(n, width), dtype=torch.uint8)
            pack_codes(as_code_tensor(codes, width), width, out, work)
            assert out.numel() == (n * width + 7) // 8
            assert out.tolist() == reference_pack(codes, width)


def test_four_bit_codes_low_nibble_first() -> None:
    out = torch.empty(1, dtype=torch.uint8)
    pack_codes(torch.tensor([0x3, 0xA], dtype=torch.uint8), 4, out, BufferPool())
    assert out.item() == 0xA3
