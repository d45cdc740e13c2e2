"""All-gather, reduce-scatter and broadcast on a simulated world, and their pure planning.

Oracles: in fp32 all-gather and broadcast equal the inputs exactly and reduce-scatter
the float64 sum within fp32 rounding; with a lossy codec all-gather and broadcast equal
`decode(encode(x))` of each block (the root's tensor) in one process, bitwise, and
reduce-scatter equals the one-process replay of its documented encodes and additions
bitwise and the exact sum within the bound those give (`tests/helpers/collective_oracles`).
World sizes 1..7, lengths with empty and uneven pieces, every algorithm, both checks.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from approxdist.comm.collectives import AllGather, Broadcast, ReduceScatter
from approxdist.comm.collectives.layout import (
    byte_segments,
    direct_peers,
    direct_sum_order,
    ring_gather_order,
    ring_scatter_order,
    ring_sum_order,
    tree,
    value_segments,
)
from approxdist.errors import CommError, SpecError
from tests.helpers.collective_oracles import U32, coded, scatter_bound, scatter_replay
from tests.helpers.sim_world import SimWorld, run_ranks

WORLDS = range(1, 8)
SEGMENT = 64  # bytes of fp32: 16 values a segment, so most messages go in several


def _inputs(world: int, shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1000 + world * 31 + sum(shape))
    return [torch.randn(shape, generator=gen) for _ in range(world)]


def _run(xs: list[torch.Tensor], make: Any, **kwargs: Any) -> list[Any]:
    """`make(comm)(xs[rank], **kwargs)` on every rank of a simulated world of len(xs)."""
    sim = SimWorld(len(xs))
    return run_ranks(sim, lambda rank: make(sim.comm(rank))(xs[rank], **kwargs))


# -- pure planning ---------------------------------------------------------------------------
def test_segments_cover_the_message_in_order() -> None:
    assert byte_segments(10, 3, 4) == [(0, 3), (3, 6), (6, 10)]  # 3 values, 4 B segments
    assert byte_segments(2, 3, 4) == [(0, 1), (1, 2)]  # fewer bytes than pieces: empty dropped
    assert value_segments(7, 16) == [(0, 3), (3, 7)]  # 28 B in 16 B pieces: 2
    for nbytes, numel, seg in [(0, 0, 4), (17, 5, 8), (4096, 1024, 1 << 20), (999, 250, 100)]:
        cuts = byte_segments(nbytes, numel, seg)
        assert [a for a, _ in cuts[1:]] == [b for _, b in cuts[:-1]]
        assert sum(b - a for a, b in cuts) == nbytes
        vals = value_segments(numel, seg)
        assert len(vals) == math.ceil(numel * 4 / seg) or (numel == 0 and len(vals) == 1)
        assert max(b - a for a, b in vals) - min(b - a for a, b in vals) <= 1


@pytest.mark.parametrize("n", WORLDS)
def test_ring_orders(n: int) -> None:
    for r in range(n):
        assert sorted(ring_gather_order(r, n) + [r]) == list(range(n))
        # what r receives in step s is what r-1 holds: its own in step 0, its step s-1 block later
        left = (r - 1) % n
        if n == 1:
            assert ring_gather_order(r, n) == ring_scatter_order(r, n) == []
            continue
        assert ring_gather_order(r, n) == [left] + ring_gather_order(left, n)[:-1]
        scatter = ring_scatter_order(r, n)
        assert scatter[-1] == r  # the last partial sum it adds to is its own chunk's
        # r adds to what r-1 sent: r-1's own chunk r-2 first, then what r-1 added before
        assert scatter == [(left - 1) % n] + ring_scatter_order(left, n)[:-1]
    for c in range(n):
        order = ring_sum_order(c, n)
        assert sorted(order) == list(range(n)) and order[0] == (c + 1) % n and order[-1] == c


@pytest.mark.parametrize("n", WORLDS)
def test_direct_peers_match_each_other(n: int) -> None:
    for r in range(n):
        to, sources = direct_peers(r, n)
        assert sorted(to + [r]) == sorted(sources + [r]) == list(range(n))
        for k, p in enumerate(to):  # r's k-th send is p's k-th receive
            assert direct_peers(p, n)[1][k] == r
        assert direct_sum_order(r, n) == [r] + sources


@pytest.mark.parametrize("n", WORLDS)
def test_tree_reaches_every_member_once(n: int) -> None:
    for root in range(n):
        links = {r: tree(r, root, n) for r in range(n)}
        assert links[root][0] is None
        for r, (up, kids) in links.items():
            for k in kids:
                assert links[k][0] == r
            if up is not None:
                assert r in links[up][1]
        depth = {root: 0}
        todo = [root]
        while todo:
            r = todo.pop()
            for k in links[r][1]:
                depth[k] = depth[r] + 1
                todo.append(k)
        assert sorted(depth) == list(range(n))
        # a member's depth is the number of 1 bits of its distance from the root
        assert all(d == bin((r - root) % n).count("1") for r, d in depth.items())
        assert max(depth.values()) <= (n - 1).bit_length()  # ceil(log2 n) levels
        if links[root][1]:  # farthest child first: the largest subtree gets each piece first
            dist = [(k - root) % n for k in links[root][1]]
            assert dist == sorted(dist, reverse=True)


# -- the collectives on simulated worlds --------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["ring", "direct", "auto"])
@pytest.mark.parametrize("check", ["head", "handshake"])
def test_all_gather_exact_in_fp32(algorithm: str, check: str) -> None:
    for n in WORLDS:
        for shape in [(0, 3), (1,), (3,), (5, 7), (2, 3, 2)]:
            xs = _inputs(n, shape)
            outs = _run(xs, lambda c: AllGather(c, algorithm=algorithm, check=check,
                                                segment_bytes=SEGMENT))
            expected = torch.cat(xs)
            assert all(torch.equal(o, expected) for o in outs), (n, shape)


@pytest.mark.parametrize("codec", ["bf16", "fp8-e5m2", "bits:s0e2+2m0", "table4"])
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_all_gather_lossy_is_one_encode_per_block(codec: str, algorithm: str) -> None:
    for n in WORLDS:
        xs = _inputs(n, (6, 5), seed=1)
        outs = _run(xs, lambda c: AllGather(c, codec, algorithm=algorithm,
                                            segment_bytes=SEGMENT))
        expected = torch.cat([coded(x, codec, n) for x in xs])
        assert all(torch.equal(o, expected) for o in outs), (n, codec)


@pytest.mark.parametrize("codec", ["fp32", "bf16", "fp8-e5m2", "bits:s0e2+2m0", "table4"])
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_reduce_scatter_replays_and_bounds(codec: str, algorithm: str) -> None:
    for n in WORLDS:
        for rows in (n, 3 * n):
            xs = _inputs(n, (rows, 11), seed=2)
            outs = _run(xs, lambda c: ReduceScatter(c, codec, algorithm=algorithm,
                                                    segment_bytes=SEGMENT))
            exact = torch.stack([x.double() for x in xs]).sum(0).reshape(-1)
            k = exact.numel() // n
            for m, out in enumerate(outs):
                assert out.shape == (rows // n, 11)
                replay = scatter_replay(xs, codec, algorithm, m, SEGMENT)
                assert torch.equal(out.reshape(-1), replay), (n, rows, m)
                if codec in ("fp32", "bf16", "fp8-e5m2"):
                    err = (out.double().reshape(-1) - exact[m * k:(m + 1) * k]).abs()
                    assert bool((err <= scatter_bound(xs, codec, algorithm, m)).all())


@pytest.mark.parametrize("check", ["head", "handshake"])
def test_reduce_scatter_mean_dtype_and_checks(check: str) -> None:
    for n in WORLDS:
        xs = [x.to(torch.bfloat16) for x in _inputs(n, (2 * n, 3), seed=3)]
        outs = _run(xs, lambda c: ReduceScatter(c, check=check, segment_bytes=SEGMENT),
                    op="mean")
        # the fp32 mean (n summands and a division: n roundings of 2^-24, each of at most
        # the mean of |x_i|) rounded once to bf16 (2^-8 of the value)
        mean = torch.stack([x.double() for x in xs]).mean(0)
        mag = torch.stack([x.double().abs() for x in xs]).mean(0)
        bound = 2.0 ** -8 * mean.abs() + (1 + 2.0 ** -8) * n * U32 * mag
        for m, out in enumerate(outs):
            assert out.dtype == torch.bfloat16 and out.shape == (2, 3)
            rows = slice(2 * m, 2 * m + 2)
            assert bool(((out.double() - mean[rows]).abs() <= bound[rows]).all())


@pytest.mark.parametrize("codec", ["fp32", "bf16", "fp8-e5m2", "bits:s0e2+2m0", "table4"])
@pytest.mark.parametrize(("algorithm", "check"), [("tree", "head"), ("tree", "handshake"),
                                                  ("direct", "head"), ("auto", "handshake")])
def test_broadcast_from_every_root(codec: str, algorithm: str, check: str) -> None:
    for n in WORLDS:
        for root in range(n):
            xs = _inputs(n, (9, 4), seed=4 + root)
            ys = [x.clone() for x in xs]
            outs = _run(ys, lambda c: Broadcast(c, codec, algorithm=algorithm, check=check,
                                                segment_bytes=SEGMENT), root=root)
            expected = coded(xs[root], codec, n)
            assert all(o is y for o, y in zip(outs, ys))  # in place
            assert all(torch.equal(y, expected) for y in ys), (n, root, codec)


def test_bit_errors_keep_members_identical() -> None:
    xs = _inputs(5, (40, 10), seed=5)
    outs = _run(xs, lambda c: AllGather(c, "fp32", "ber:1e-2@9", segment_bytes=SEGMENT))
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert bool(torch.isfinite(outs[0]).all()) and not torch.equal(outs[0], torch.cat(xs))
    ys = [x.clone() for x in xs]
    _run(ys, lambda c: Broadcast(c, "bf16", "ber:1e-2@9"), root=2)
    assert all(torch.equal(y, ys[0]) for y in ys) and not torch.equal(ys[0], xs[2])


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_all_gather_of_bytes_moves_them_as_they_are(algorithm: str) -> None:
    for n in (1, 2, 3, 5):
        for size in (0, 1, 7, 203):  # odd sizes: a compressor's payload is any length
            gen = torch.Generator().manual_seed(n * 1000 + size)
            xs = [torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
                  for _ in range(n)]
            outs = _run(xs, lambda c: AllGather(c, algorithm=algorithm, segment_bytes=16))
            assert all(o.dtype == torch.uint8 and torch.equal(o, torch.cat(xs)) for o in outs)
    with pytest.raises(CommError, match="all-gather of bytes .* codec 'bf16'.* codec='fp32'"):
        AllGather(SimWorld(2).comm(0), "bf16")(torch.ones(3, dtype=torch.uint8))


def test_out_and_dtypes_of_all_gather() -> None:
    xs = [x.half() for x in _inputs(3, (2, 4), seed=6)]
    outs = _run(xs, lambda c: AllGather(c))
    assert all(o.dtype == torch.float16 and torch.equal(o, torch.cat(xs)) for o in outs)
    sim, bufs = SimWorld(3), [torch.empty(6, 4) for _ in range(3)]
    outs = run_ranks(sim, lambda r: AllGather(sim.comm(r))(xs[r].float(), out=bufs[r]))
    assert all(o is b and torch.equal(b, torch.cat(xs).float()) for o, b in zip(outs, bufs))


# -- bad input --------------------------------------------------------------------------------
def test_bad_arguments_name_the_value_and_the_fix() -> None:
    comm = SimWorld(3).comm(0)
    with pytest.raises(SpecError, match=r"member of the 3 members, but .*dim 0 \(10\) is not "
                                        r"divisible by 3; pad dim 0 to 12"):
        ReduceScatter(comm)(torch.ones(10, 2))
    with pytest.raises(SpecError, match=r"broadcast root 3 is not a member index .*pass 0\.\.2"):
        Broadcast(comm)(torch.ones(4), root=3)
    with pytest.raises(SpecError, match="0-d tensor; pass x.reshape"):
        AllGather(comm)(torch.tensor(1.0))
    with pytest.raises(SpecError, match=r"out has shape \(3,\); pass out of shape \(6,\)"):
        AllGather(comm)(torch.ones(2), out=torch.empty(3))
    with pytest.raises(SpecError, match="unknown all-gather algorithm 'tree'; valid: direct, ring"):
        AllGather(comm, algorithm="tree")
    with pytest.raises(SpecError, match="op 'max' is not one of sum, mean"):
        ReduceScatter(comm)(torch.ones(3), op="max")
    with pytest.raises(CommError, match="all-gather takes floating-point tensors"):
        AllGather(comm)(torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("check", ["head", "handshake"])
def test_mismatched_shapes_are_caught(check: str) -> None:
    shapes = [(4, 3), (4, 3), (3, 4)]
    with pytest.raises(CommError, match=r"all-gather arguments differ across ranks \(shape: "
                                        r"\(4, 3\) on ranks? .*\(3, 4\) on rank 2"):
        _run([torch.ones(s) for s in shapes], lambda c: AllGather(c, check=check))
    with pytest.raises(CommError, match=r"reduce-scatter arguments differ .*shape: .*\(6, 2\)"):
        _run([torch.ones(3, 2), torch.ones(6, 2), torch.ones(3, 2)],
             lambda c: ReduceScatter(c, check=check))
    with pytest.raises(CommError, match=r"broadcast arguments differ .*dtype: float32 on ranks? "
                                        r"[\d, ]+; bfloat16 on rank 1"):
        _run([torch.ones(5), torch.ones(5, dtype=torch.bfloat16), torch.ones(5)],
             lambda c: Broadcast(c, check=check))
