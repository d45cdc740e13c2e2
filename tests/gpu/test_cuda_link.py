"""The link layer and every all-reduce algorithm with CUDA buffers on NCCL ranks, one GPU
each: what arrives is what the codec's CPU path decodes, and each all-reduce equals NCCL's
own `dist.all_reduce` within the all-reduce's bound (`collective_oracles.allreduce_relative`).

Skipped with fewer than 2 GPUs; `scripts/gpu_check.sh` runs it (marker `gpu`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import AllReduce, algorithm_names
from approxdist.comm.link import Link
from approxdist.launch.context import DistContext
from tests.helpers.collective_oracles import allreduce_relative
from tests.helpers.gpu_ranks import run_on_gpus

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, {GPUS} visible")]

LENGTHS = (0, 1, 7, 1001, 70_001)
SHAPES = [(3, 4), (0,), (2, 1, 5), (4099,)]
LOSSY = ("bf16", "bits:s0e2+2m0", "table4")


def _data(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(i)) * 4


def _exchange(ctx: DistContext) -> dict[str, Any]:
    """Rank 0 sends sized fp32 tensors and self-describing lossy ones; rank 1 compares."""
    link = Link(ctx)
    if ctx.rank == 0:
        handles = [link.isend(_data(i, s).to(ctx.device), 1, describe=False)
                   for i, s in enumerate(SHAPES)]
        handles += [link.isend(_data(10 + i, (257, 3)).to(ctx.device), 1, get_codec(spec))
                    for i, spec in enumerate(LOSSY)]
        for h in handles:
            h.wait()
        return {}
    sized = [link.irecv(0, s) for s in SHAPES]
    described = [link.irecv(0, None, get_codec(spec)) for spec in LOSSY]
    got_sized = [h.wait() for h in sized]
    got_described = [h.wait() for h in described]
    exact = [bool(g.device == ctx.device and torch.equal(g.cpu(), _data(i, s)))
             for i, (g, s) in enumerate(zip(got_sized, SHAPES))]
    # the oracle: what the codec's CPU path decodes from the same values
    lossy = [bool(g.device == ctx.device and torch.equal(g.cpu(), get_codec(spec).roundtrip(
        _data(10 + i, (257, 3))))) for i, (g, spec) in enumerate(zip(got_described, LOSSY))]
    return {"exact": exact, "lossy": lossy}


def test_transfers_of_cuda_tensors_arrive_as_the_cpu_codec_decodes_them() -> None:
    _, receiver = run_on_gpus(_exchange, 2)
    assert all(receiver["exact"]), receiver
    assert all(receiver["lossy"]), dict(zip(LOSSY, receiver["lossy"]))


def _all_reduces(ctx: DistContext) -> dict[tuple[str, str, int], bool]:
    link = Link(ctx)
    out = {}
    for codec in ("fp32", "bf16"):
        for algorithm in algorithm_names():
            if algorithm == "native" and codec != "fp32":
                continue  # NCCL's own all-reduce sums fp32 only (native.py)
            reduce = AllReduce(link, algorithm, codec, segment_bytes=64 * 1024)
            for i, n in enumerate(LENGTHS):
                gen = torch.Generator().manual_seed(100 * i + ctx.rank)
                x = torch.randn(n, generator=gen).to(ctx.device)
                oracle, mag = x.clone(), x.abs()
                dist.all_reduce(oracle)
                dist.all_reduce(mag)
                y = reduce(x.clone(), "sum")
                bound = allreduce_relative(codec, ctx.world_size) * mag
                out[(algorithm, codec, n)] = bool(y.device == ctx.device
                                                  and ((y - oracle).abs() <= bound).all())
    return out


def test_every_all_reduce_on_cuda_matches_nccl() -> None:
    results = run_on_gpus(_all_reduces, GPUS)
    for key in results[0]:
        assert all(r[key] for r in results), f"{key}: outside the bound on some rank"
