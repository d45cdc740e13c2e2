"""Streamed (non-temporal) decoder stores, and error feedback fused into the first kernel pass
(EF-sign, top-k): the same bits as the plain stores and the torch reference, at any alignment
of the destination and on 1 or 2 threads."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch

from approxdist.comm.codecs.bitfield import BitFieldCodec, BitLayout
from approxdist.comm.compressors import Where, get_compressor
from approxdist.comm.compressors.base import Gathered
from approxdist.kernels import kernel_status
from approxdist.kernels.bitfield import BitKernel
from approxdist.kernels.table import TableKernel
from tests.unit.test_kernels_compressors import use_kernels
from tests.unit.test_kernels_compressors import values as finite_values
from tests.unit.test_kernels_threads import threads, values

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"C kernels unavailable: {kernel_status().detail}")

#: a block and a half, an odd tail; then enough for two threads (parallel.h's MIN_PER_THREAD)
SMALL, TWO_THREADS = 3 * 1024 + 5, 2 * (1 << 17) + 2048 + 77
#: destinations starting 0-3 floats past a 64-byte boundary
OFFSETS = [0, 1, 2, 3]


def decoded(decode: Callable[[torch.Tensor, bool], None], n: int, offset: int,
            stream: bool) -> torch.Tensor:
    """What `decode(y, stream)` writes into n floats starting `offset` floats into a buffer."""
    buf = torch.full((n + 16,), 7.0)
    y = buf[offset: offset + n]
    decode(y, stream)
    assert bool((buf[:offset] == 7.0).all()) and bool((buf[offset + n:] == 7.0).all()), \
        "a streamed decode wrote outside its destination"
    return y.clone()


def _table_decode(kernel: TableKernel, codes: torch.Tensor, values_: torch.Tensor, y: torch.Tensor,
                  stream: bool) -> None:
    kernel.decode(codes, values_, None, y, stream=stream)


def _bits_decode(kernel: BitKernel, codes: torch.Tensor, y: torch.Tensor, stream: bool) -> None:
    kernel.decode(codes, y, stream=stream)

@needs_kernels
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 6, 8, 12])
def test_table_decode_streams_the_plain_stores_bits(bits: int) -> None:
    kernel = TableKernel.create(bits)
    assert kernel is not None
    table = torch.linspace(0.1, 3.0, 1 << (bits - 1))
    mids = ((table[:-1] + table[1:]) / 2).view(torch.int32).contiguous()
    values_ = torch.cat([table, -table])
    for n, count in ((SMALL, 1), (TWO_THREADS, 2)):
        x = values(n, bits)
        codes = torch.empty((n * bits + 7) // 8, dtype=torch.uint8)
        kernel.encode(x, mids, codes)
        with threads(count):
            for offset in OFFSETS:
                decode = partial(_table_decode, kernel, codes, values_)
                plain, streamed = decoded(decode, n, offset, False), decoded(decode, n, offset, True)
                assert torch.equal(plain.view(torch.int32), streamed.view(torch.int32)), \
                    (bits, n, offset)


@needs_kernels
@pytest.mark.parametrize("layout", [(0, 2, 2, 0), (1, 3, 0, 2), (1, 8, 0, 7), (1, 5, 0, 10)])
def test_bit_field_decode_streams_the_torch_ops_bits(layout: tuple[int, int, int, int]) -> None:
    """Widths 4, 6, 16 and 8: every decode path of bitfield.c, against the torch ops."""
    codec = BitFieldCodec(BitLayout(*layout), use_kernels=False)
    runs = [(r.lo, r.length, r.pos) for r in codec.runs]
    kernel = BitKernel.create(runs, codec.layout.width)
    assert kernel is not None
    for n, count in ((SMALL, 1), (TWO_THREADS, 2)):
        x = values(n, sum(layout))
        payload = codec.encode(x)
        codes = payload.data[codec.codes_offset(n):]
        expected = codec.decode(payload).view(torch.int32)
        with threads(count):
            for offset in OFFSETS:
                for stream in (False, True):
                    got = decoded(partial(_bits_decode, kernel, codes), n, offset, stream)
                    assert torch.equal(got.view(torch.int32), expected), (layout, n, offset, stream)


@needs_kernels
@pytest.mark.parametrize("spec", ["sign+ef", "topk:0.01"])
def test_fused_feedback_pass_equals_the_unfused_one_and_the_torch_ops(spec: str) -> None:
    """`outgoing` without `sent` makes gradient plus residual inside the kernel's first pass;
    with `sent` it goes the way before; the torch ops are the reference. Payload and residual,
    bit for bit, over three steps, on 1 and 2 threads."""
    for n, count in ((5003, 1), (TWO_THREADS, 2)):
        comps = [gathered(spec, n) for _ in range(3)]
        use_kernels(comps[2], False)
        with threads(count):
            for step in range(3):
                grad = finite_values(n, 40 + step)
                outs = [comps[0].outgoing(grad), comps[1].outgoing(grad, torch.empty(n)),
                        comps[2].outgoing(grad)]
                for i, (comp, out) in enumerate(zip(comps[1:], outs[1:])):
                    assert torch.equal(out.data, outs[0].data), f"{n} {step}: payload {i + 1}"
                    assert torch.equal(comp.state["residual"].view(torch.int32),
                                       comps[0].state["residual"].view(torch.int32)), \
                        f"{n} {step}: residual {i + 1}"
                assert torch.equal(grad, finite_values(n, 40 + step)), "the gradient was written"


def gathered(spec: str, n: int) -> Gathered:
    comp = get_compressor(spec, Where((n,)))
    assert isinstance(comp, Gathered)
    return comp
