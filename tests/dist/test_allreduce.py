"""Every all-reduce algorithm on real gloo ranks against the `dist.all_reduce` oracle.

World sizes 1..6 x lengths (0, 1, N-1, odd, large) x codecs (fp32 exact, bf16 lossy),
one spawn per world size. fp32 must equal the oracle within fp32 rounding
(N u32 sum|x|), bf16 within the documented bound (N + 2) u16 sum|x| (u16 = 2^-8), and
every rank must hold bitwise identical bytes. Bad input: mismatched lengths or dtypes
give an error naming the ranks and values; a dead peer gives an error, not a hang.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import pytest
import torch
import torch.distributed as dist

from approxdist.comm.collectives import AllReduce, algorithm_names
from approxdist.comm.link import Link
from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from tests.helpers.collective_oracles import RELATIVE, U32

UNIT = {"fp32": U32, "bf16": RELATIVE["bf16"][0]}
LARGE = 70_001  # several 64 KiB segments


def _lengths(world: int) -> list[int]:
    return sorted({0, 1, max(world - 1, 0), 7, 1001, LARGE})


def _case(ctx: DistContext, reduce: AllReduce, n: int, seed: int, op: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed * 100 + ctx.rank)
    x = torch.randn(n, generator=gen)
    oracle, mag = x.clone(), x.abs()
    if ctx.world_size > 1:
        dist.all_reduce(oracle)
        dist.all_reduce(mag)
    y = reduce(x.clone(), op)
    if op == "mean":
        oracle, mag = oracle / ctx.world_size, mag / ctx.world_size
    bound = (ctx.world_size + 2) * UNIT[reduce.codec.spec] * mag + 1e-6 * UNIT["bf16"]
    return {"ok": bool(((y - oracle).abs() <= bound).all()),
            "digest": hashlib.sha256(y.numpy().tobytes()).hexdigest()}


def _all_cases(ctx: DistContext) -> tuple[dict[tuple[str, str, int, str], dict[str, Any]],
                                          dict[int, int], dict[int, int]]:
    """Every case's result, and the bytes this rank's link counted to and from each peer."""
    link = Link(ctx)
    out = {}
    for codec in ("fp32", "bf16"):
        for algorithm in algorithm_names():
            reduce = AllReduce(link, algorithm, codec, segment_bytes=64 * 1024)
            for i, n in enumerate(_lengths(ctx.world_size)):
                op = "mean" if i % 2 else "sum"
                out[(algorithm, codec, n, op)] = _case(ctx, reduce, n, i, op)
    return out, dict(link.stats.sent), dict(link.stats.received)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6])
def test_matches_dist_all_reduce_and_ranks_agree(world: int) -> None:
    ranks = run_on_ranks(_all_cases, world, timeout_s=240)
    results = [r[0] for r in ranks]
    for i, (_, sent, _) in enumerate(ranks):  # what arrived, not the room it was given
        assert sent == {j: ranks[j][2][i] for j in sent}, (i, sent)
    for key, first in results[0].items():
        assert all(r[key]["ok"] for r in results), f"{key}: outside the bound on some rank"
        assert all(r[key]["digest"] == first["digest"] for r in results), f"{key}: ranks differ"
    assert len(results[0]) == 2 * len(algorithm_names()) * len(_lengths(world))


def _mismatched(ctx: DistContext, algorithm: str, sizes: list[int],
                dtypes: list[torch.dtype]) -> None:
    reduce = AllReduce(Link(ctx), algorithm)
    reduce(torch.ones(sizes[ctx.rank], dtype=dtypes[ctx.rank]))


@pytest.mark.parametrize(("algorithm", "sizes", "dtypes", "message"), [
    ("brd", [40, 40, 41, 40], [torch.float32] * 4, r"length: (40 on rank \d; 41 on rank 2|41 on rank 2; 40)"),
    ("vhd", [10 ** 6, 2 * 10 ** 6, 10 ** 6, 10 ** 6], [torch.float32] * 4,
     r"length: (1000000 on rank \d; 2000000 on rank 1|2000000 on rank 1; 1000000)"),
    ("ring", [8, 8, 8], [torch.float32, torch.float16, torch.float32], r"dtype: .*float16 on rank 1"),
    # one-way steps (the tree's reduce): the receivers' signatures still reach the senders
    ("brb", [3 * 10 ** 5, 3 * 10 ** 5, 3 * 10 ** 5 + 1], [torch.float32] * 3,
     r"length: (300000 on ranks? [\d, ]+; 300001 on rank 2|300001 on rank 2; 300000)"),
    ("ring", [0, 5000, 5000], [torch.float32] * 3, r"length: 0 on rank 0; 5000 on rank"),
])
def test_mismatch_names_ranks_and_values(algorithm: str, sizes: list[int],
                                         dtypes: list[torch.dtype], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        run_on_ranks(_mismatched, len(sizes), algorithm, sizes, dtypes, comm_timeout_s=10,
                     timeout_s=60)


def _peer_dies(ctx: DistContext) -> None:
    reduce = AllReduce(Link(ctx), "ring")
    x = torch.ones(100_000)
    reduce(x)
    dist.barrier()  # every rank is past the first all-reduce: rank 2 dies between two
    if ctx.rank == 2:
        os._exit(3)
    reduce(x)


#: how a rank's error names the peer whose connection dropped
_DROPPED = re.compile(r"CommError: rank (\d): (?:recv|send) of \d+ bytes (?:from|to) rank (\d) "
                      r"failed: .*(?:closed by peer|reset by peer|Broken pipe)")


def test_dead_peer_gives_every_other_rank_an_error() -> None:
    """Each surviving rank fails on a dropped connection, not a timeout (the collective
    timeout is 10 s; the helper's 60 s only stops a hang), naming the peer it lost; the
    chain of lost peers leads every rank back to the dead rank 2."""
    with pytest.raises(LaunchError) as info:
        run_on_ranks(_peer_dies, 4, comm_timeout_s=10, timeout_s=60)
    text = str(info.value)
    assert "rank 2 failed:\ndied with exit code 3" in text
    assert "did not finish" not in text and "imed out" not in text, text
    lost = {int(me): int(peer) for me, peer in _DROPPED.findall(text)}
    assert sorted(lost) == [0, 1, 3], text
    for rank in lost:
        seen = [rank]
        while seen[-1] != 2:
            assert lost[seen[-1]] not in seen, f"{seen}: a cycle of lost peers\n{text}"
            seen.append(lost[seen[-1]])
