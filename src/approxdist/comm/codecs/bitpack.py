"""Real bit-packing of w-bit codes (w = 1..32) into an LSB-first byte stream (seed 000, DESIGN "Real bytes").

Code i occupies stream bits [i*w, (i+1)*w), least significant bit first; stream bit p is
bit p % 8 of byte p // 8. So a code's top bits are the last ones of its span, and for
w = 8, 16, 32 the stream is the little-endian memory image of the codes. Codes are packed
in groups of G = 8 / gcd(w, 8) codes that fill B = w*G/8 whole bytes; each group is built
in an accumulator of one or more machine words with one shift-or per code, so packing
costs a few passes over n/G rows whatever the width.
"""

from __future__ import annotations

import math

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.framed import typed

_ACC = ((8, torch.uint8), (16, torch.int16), (32, torch.int32), (64, torch.int64))


def code_dtype(width: int) -> torch.dtype:
    """The smallest integer dtype holding a `width`-bit code (signed types hold bit patterns)."""
    for bits, dtype in _ACC:
        if width <= bits:
            return dtype
    raise ValueError(f"code width {width} exceeds 64 bits")


def group_shape(width: int) -> tuple[int, int]:
    """(codes per group G, bytes per group B) for `width`-bit codes."""
    g = 8 // math.gcd(width, 8)
    return g, width * g // 8


def packed_nbytes(numel: int, width: int) -> int:
    return (numel * width + 7) // 8


def _acc(nbits: int) -> tuple[torch.dtype, int, int]:
    """(dtype, bits per word, words) of the accumulator for one group of `nbits` bits."""
    for bits, dtype in _ACC:
        if nbits <= bits:
            return dtype, bits, 1
    return torch.int64, 64, (nbits + 63) // 64


def pack_codes(codes: torch.Tensor, width: int, out: torch.Tensor, work: BufferPool) -> None:
    """Pack 1-D `codes` (dtype `code_dtype(width)`, values < 2**width) into the uint8 `out`."""
    n = codes.numel()
    g, b = group_shape(width)
    full = n // g
    if full:
        _pack_groups(codes[: full * g].view(full, g), width, out[: full * b], work)
    rest = n - full * g
    if rest:
        pad = work.get("pack_tail", g, codes.dtype, codes.device).zero_()
        pad[:rest].copy_(codes[full * g:])
        tail = work.get("pack_tail_bytes", b, torch.uint8, codes.device)
        _pack_groups(pad.view(1, g), width, tail, work)
        out[full * b:].copy_(tail[: out.numel() - full * b])


def _pack_groups(groups: torch.Tensor, width: int, out: torch.Tensor, work: BufferPool) -> None:
    ng, g = groups.shape
    if g == 1:  # whole-byte codes: the stream is their little-endian image
        if groups.data_ptr() == out.data_ptr() and groups.dtype == torch.uint8:
            return  # the codes were written in place
        nb = width // 8
        out.view(ng, nb).copy_(groups.view(torch.uint8).view(ng, -1)[:, :nb])
        return
    if width * g == 8 and g in _WORD and groups.is_contiguous():
        _pack_bytes_mul(groups, width, out, work)
        return
    dtype, wbits, nwords = _acc(width * g)
    if dtype == groups.dtype == torch.uint8 and nwords == 1:
        acc = out.view(ng, 1)  # sub-byte codes: build the bytes in place
    else:
        acc = work.get("pack_acc", ng * nwords, dtype, out.device).view(ng, nwords)
    acc.zero_()
    tmp = work.get("pack_tmp", ng, dtype, out.device)
    spill = work.get("pack_spill", ng, dtype, out.device)
    for j in range(g):
        word, off = divmod(j * width, wbits)
        tmp.copy_(groups[:, j])
        if off + width > wbits:  # the code straddles two words
            torch.bitwise_right_shift(tmp, wbits - off, out=spill)
            acc[:, word + 1].bitwise_or_(spill)
        if off:
            tmp.bitwise_left_shift_(off)
        acc[:, word].bitwise_or_(tmp)
    if acc.data_ptr() != out.data_ptr():
        size = acc.element_size() * nwords
        out.view(ng, -1).copy_(acc.view(torch.uint8).view(ng, size)[:, : out.numel() // ng])


_WORD = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _pack_bytes_mul(groups: torch.Tensor, width: int, out: torch.Tensor, work: BufferPool) -> None:
    """Sub-byte codes (one per byte, G per word) -> packed bytes with one multiply per word.

    Byte j of a word sits at bit 8j and must move to bit j*width. Multiplying by
    M = sum_j 2**((G-1-j)*8 + j*width) puts every byte at bit 8(G-1) + j*width; the partial
    products elsewhere never overlap (codes are < 2**width), so no carry reaches the top
    byte, which a shift by 8(G-1) brings down.
    """
    ng, g = groups.shape
    dtype = _WORD[g]
    magic = sum(1 << ((g - 1 - j) * 8 + j * width) for j in range(g))
    words = groups.view(dtype).view(-1)
    tmp = work.get("pack_mul", ng, dtype, out.device)
    torch.mul(words, magic, out=tmp)
    tmp.bitwise_right_shift_(8 * (g - 1))
    out.copy_(tmp)


def unpack_codes(data: torch.Tensor, width: int, numel: int, work: BufferPool) -> torch.Tensor:
    """The `numel` codes of the packed uint8 `data`, as int32 (a work buffer, overwritten later)."""
    g, b = group_shape(width)
    ng = (numel + g - 1) // g
    codes = work.get("unpack_codes", ng * g, torch.int32, data.device)
    full = numel // g
    if full:
        _unpack_groups(data[: full * b].view(full, b), width, codes[: full * g].view(full, g), work)
    if full < ng:
        tail = work.get("unpack_tail_bytes", b, torch.uint8, data.device).zero_()
        tail[: data.numel() - full * b].copy_(data[full * b:])
        _unpack_groups(tail.view(1, b), width, codes[full * g:].view(1, g), work)
    return codes[:numel]


def _unpack_groups(rows: torch.Tensor, width: int, codes: torch.Tensor, work: BufferPool) -> None:
    ng, b = rows.shape
    g = codes.shape[1]
    if width in (8, 16, 32):
        view = {8: torch.uint8, 16: torch.uint16, 32: torch.int32}[width]
        codes.view(-1).copy_(typed(rows.reshape(-1), view))
        return
    dtype, wbits, nwords = _acc(width * g)
    words = work.get("unpack_words", ng * nwords, dtype, rows.device).view(ng, nwords)
    size = words.element_size() * nwords
    if size != b:
        words.zero_()
    words.view(torch.uint8).view(ng, size)[:, :b].copy_(rows)
    tmp = work.get("unpack_tmp", ng, dtype, rows.device)
    spill = work.get("unpack_spill", ng, dtype, rows.device)
    mask = (1 << width) - 1
    for j in range(g):
        word, off = divmod(j * width, wbits)
        torch.bitwise_right_shift(words[:, word], off, out=tmp)
        if off + width > wbits:  # low part from this word (no sign bits), high part from next
            tmp.bitwise_and_(as_signed((1 << (wbits - off)) - 1, wbits))
            torch.bitwise_left_shift(words[:, word + 1], wbits - off, out=spill)
            tmp.bitwise_or_(spill)
        if width < wbits:
            tmp.bitwise_and_(as_signed(mask, wbits))
        codes[:, j].copy_(tmp)


def as_signed(value: int, bits: int) -> int:
    """`value` as the signed integer with the same low `bits` bits (for masks on int dtypes)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value
