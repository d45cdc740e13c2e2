"""The C kernels split over threads: the same bytes, values and sums with 1, 2 and 4 threads,
and every SIMD variant of the build equal to the torch ops (the oracle); the codecs' kernels
and the compressors' (QSGD, TernGrad, signs: their residuals and streams too)."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import approxdist.kernels.build as build
from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.base import Codec
from approxdist.comm.codecs.bitfield import BitFieldCodec
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.comm.codecs.table import TableCodec
from approxdist.kernels import kernel_status
from approxdist.kernels.bitfield import BitKernel
from approxdist.kernels.table import TableKernel
from tests.unit.test_kernels_compressors import assert_same, run_workers

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"C kernels unavailable: {kernel_status().detail}")

#: code widths 1, 2, 3, 4, 5, 6, 8, 12, 16 and 1-4 runs of kept bits
SPECS = ["bits:s0e1m0", "bits:s1e1m0", "bits:s1e2m0", "bits:s0e2+2m0", "bits:s1e3m2",
         "bits:s0e8m0", "bits:s1e0m7", "bits:s1e1+2m9", "bits:s1e5m10", "table1", "table2",
         "table3", "table4", "table5", "table8"]
#: QSGD of code widths 6 and 9, TernGrad, sign with and without error feedback, top-k
COMPRESSORS = ["qsgd:16", "qsgd:200", "terngrad", "sign+ef", "signsgd", "topk:0.01"]
#: 4 threads get >= 2^17 values each (parallel.h's MIN_PER_THREAD); an odd tail
N = 4 * (1 << 17) + 3001


@contextmanager
def threads(count: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def values(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 4)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    return x


def reference(spec: str) -> FramedCodec:
    codec = get_codec(spec)
    assert isinstance(codec, (BitFieldCodec, TableCodec))
    codec.use_kernels = False
    return codec


def outputs(codec: Codec, x: torch.Tensor, dest: torch.Tensor,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Payload bytes, decoded int32 patterns and decode-add sums of `x` (onto `dest`)."""
    payload = codec.encode(x)
    summed = dest.clone()
    codec.decode_add(payload, summed)
    return payload.data, codec.decode(payload).view(torch.int32), summed.view(torch.int32)


@needs_kernels
def test_one_two_and_four_threads_give_the_torch_ops_bytes_values_and_sums() -> None:
    x, dest = values(N, 1), values(N, 2) * 1e-3
    for spec in SPECS:
        with threads(1):
            expected = outputs(reference(spec), x, dest)
        for count in (1, 2, 4):
            with threads(count):
                got = outputs(get_codec(spec), x, dest)
            for what, a, b in zip(("bytes", "values", "sums"), got, expected):
                assert torch.equal(a, b), f"{spec} with {count} threads: {what} differ"
    # compressors against the torch ops on one thread (sign+ef's scale is a fixed-order sum);
    # one worker (decode-and-add splits as the codecs' above do)
    for spec in COMPRESSORS:
        with threads(1):
            expected_run = run_workers(spec, N, False, world=1, steps=1)
        for count in (1, 2, 4):
            with threads(count):
                assert_same(run_workers(spec, N, True, world=1, steps=1), expected_run,
                            f"{spec} with {count} threads")


def _variants() -> list[tuple[str, ...]]:
    """Flags giving the other code paths: portable C (no SIMD), and AVX2 without AVX-512."""
    out: list[tuple[str, ...]] = [("-O3",)]
    if platform.machine() in ("x86_64", "AMD64"):
        out.append(("-O3", "-mavx2", "-mno-avx512f"))
    return out


class _StreamedTable(TableKernel):
    """Decodes with streamed stores whatever the size."""

    def decode(self, codes: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None,
               y: torch.Tensor, add: bool = False, stream: bool | None = None) -> None:
        super().decode(codes, values, rows, y, add, stream=True)


class _StreamedBits(BitKernel):
    """Decodes with streamed stores whatever the size."""

    def decode(self, codes: torch.Tensor, y: torch.Tensor, stream: bool | None = None) -> None:
        super().decode(codes, y, stream=True)


def _use(codec: object, lib: ctypes.CDLL, streamed: bool = False) -> None:
    """Make `codec` call the library `lib` instead of the cached build (`streamed`: its decoder
    always with streamed stores, store.h)."""
    if isinstance(codec, TableCodec):
        table = (_StreamedTable if streamed else TableKernel)(lib, codec.bits)
        codec._kernels.get(lambda: table)
    else:
        assert isinstance(codec, BitFieldCodec)
        runs = [(r.lo, r.length, r.pos) for r in codec.runs]
        bits = (_StreamedBits if streamed else BitKernel)(lib, runs, codec.layout.width)
        codec._kernels.get(lambda: bits)


@needs_kernels
@pytest.mark.parametrize("flags", _variants())
def test_every_simd_variant_gives_the_same_bits(flags: tuple[str, ...], tmp_path: Path) -> None:
    """The build picks -march=native; the portable and AVX2 paths must agree with torch too."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None  # the kernels were built, so a compiler exists
    lib_path = tmp_path / "kernels.so"
    sources = [str(Path(build.__file__).parent / name) for name in build.SOURCES]
    subprocess.run([cc, *flags, *build.BASE_FLAGS, "-o", str(lib_path), *sources],
                   check=True, capture_output=True, timeout=120)
    lib = ctypes.CDLL(str(lib_path))
    x, dest = values(N, 3), values(N, 4)
    streamed = ("bits:s0e1m0", "bits:s0e2+2m0", "bits:s1e3m2", "bits:s0e8m0", "table2", "table5")
    for spec, stream in [(s, False) for s in SPECS] + [(s, True) for s in streamed]:
        fused = get_codec(spec)
        _use(fused, lib, stream)
        with threads(1):
            expected = outputs(reference(spec), x, dest)
        with threads(2):
            got = outputs(fused, x, dest)
        for what, a, b in zip(("bytes", "values", "sums"), got, expected):
            assert torch.equal(a, b), f"{spec} built with {flags} (streamed {stream}): {what} differ"
    for spec in COMPRESSORS:
        with threads(2):
            assert_same(run_workers(spec, N, True, lib, world=1, steps=1),
                        run_workers(spec, N, False, world=1, steps=1), f"{spec} built with {flags}")
