"""Seed 001's all-reduce algorithms on a simulated world of N ranks in one process.

Oracle: the float64 sum of the inputs. fp32 results must match it within fp32
rounding; lossy codecs within the documented bound |y - sum| <= (N + 2) u sum|x_i|
(u = the codec's unit roundoff: each value is re-encoded at most N + 2 times on its way);
every rank must end bitwise identical in all cases.
"""

from __future__ import annotations

import threading

import pytest
import torch

from approxdist.comm.collectives import ALGORITHMS, AllReduce, algorithm_names, get_algorithm
from approxdist.comm.collectives.base import bounds, ceil_log2, largest_power_of_two
from approxdist.comm.collectives.brb import children, parent
from approxdist.comm.collectives.fold import core_members
from approxdist.errors import CommError, SpecError
from tests.helpers.collective_oracles import FP16, RELATIVE, U32
from tests.helpers.sim_world import SimWorld, simulate

ALGOS = ["native", "ring", "brb", "brd", "vhd", "auto"]
UNIT_ROUNDOFF = {"fp32": U32, "bf16": RELATIVE["bf16"][0], "fp16": FP16[0]}


def _inputs(world: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1000 + world * 31 + n)
    return [torch.randn(n, generator=gen) for _ in range(world)]


def _check(outs: list[torch.Tensor], xs: list[torch.Tensor], codec: str) -> None:
    for out in outs[1:]:
        assert torch.equal(out, outs[0]), "ranks differ"
    if not xs[0].numel():
        return
    exact = torch.stack(xs).double().sum(0)
    mag = torch.stack(xs).double().abs().sum(0)
    n = len(xs)
    bound = (n + 2) * UNIT_ROUNDOFF[codec] * mag + 1e-30
    err = (outs[0].double() - exact).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max())} over bound"


@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("codec", ["fp32", "bf16"])
def test_every_world_and_length(algorithm: str, codec: str) -> None:
    for world in range(1, 8):
        for n in sorted({0, 1, max(world - 1, 1), 7, 33, 1001}):
            xs = _inputs(world, n)
            # small segments so that the segmented reduce steps are exercised too
            outs = simulate(algorithm, xs, codec=codec, segment_bytes=256)
            _check(outs, xs, codec)


@pytest.mark.parametrize("algorithm", ["ring", "brb", "brd", "vhd"])
def test_non_idempotent_codec_stays_identical(algorithm: str) -> None:
    """Table-N re-encoded differs from its first encoding; forwarding bytes keeps ranks equal."""
    for world in (3, 5, 6):
        xs = _inputs(world, 500, seed=3)
        outs = simulate(algorithm, xs, codec="table8")
        assert all(torch.equal(o, outs[0]) for o in outs)
        exact = torch.stack(xs).sum(0)
        assert float((outs[0] - exact).abs().mean()) < 0.25 * float(exact.abs().mean())


def test_bit_errors_keep_ranks_identical_and_finite() -> None:
    xs = _inputs(5, 2000, seed=4)
    outs = simulate("vhd", xs, codec="fp32", channel="ber:1e-2@9")
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert bool(torch.isfinite(outs[0]).all())
    assert not torch.allclose(outs[0], torch.stack(xs).sum(0))  # the channel did corrupt


def test_mean_shape_and_dtype_are_kept() -> None:
    xs = [torch.randn(3, 5, dtype=torch.float16) for _ in range(3)]
    outs = simulate("brd", xs, op="mean")
    assert outs[0].shape == (3, 5) and outs[0].dtype == torch.float16
    # the fp32 mean (3 roundings of 2^-24, each of at most the mean of |x_i|), rounded once
    # to fp16 (tests/helpers/collective_oracles.FP16)
    ref = torch.stack([x.double() for x in xs]).mean(0)
    mag = torch.stack([x.double().abs() for x in xs]).mean(0)
    u, f = FP16
    bound = u * ref.abs() + f + (1 + u) * 3 * U32 * mag
    assert bool(((outs[0].double() - ref).abs() <= bound).all())


def test_in_place_on_non_contiguous_input() -> None:
    world = SimWorld(1)
    x = torch.arange(12.0).reshape(3, 4).t()
    reduce = AllReduce(world.comm(0), "ring")
    assert reduce(x, "mean") is x


@pytest.mark.parametrize("algorithm", ["ring", "brb", "brd", "vhd"])
def test_mismatched_lengths_name_ranks_and_values(algorithm: str) -> None:
    xs = [torch.ones(6), torch.ones(6), torch.ones(9), torch.ones(6)]
    with pytest.raises(CommError, match=r"length: .*6 on rank.*9 on rank 2|9 on rank 2.*6 on"):
        simulate(algorithm, xs)


def test_mismatched_dtype_and_empty_rank_are_reported() -> None:
    with pytest.raises(CommError, match="dtype: .*float16"):
        simulate("ring", [torch.ones(4), torch.ones(4, dtype=torch.float16), torch.ones(4)])
    with pytest.raises(CommError, match="length: 0 on rank 0; 3 on rank"):
        simulate("vhd", [torch.ones(0), torch.ones(3), torch.ones(3)])


def test_bad_arguments() -> None:
    comm = SimWorld(1).comm(0)
    with pytest.raises(SpecError, match="unknown all-reduce algorithm 'tree'; valid: .*brd"):
        AllReduce(comm, "tree")
    with pytest.raises(SpecError, match="native.*takes codecs fp32, fp16, bf16"):
        AllReduce(comm, "native", codec="bits:s1e8m7")
    with pytest.raises(SpecError, match="op 'max'"):
        AllReduce(comm, "ring")(torch.ones(2), op="max")
    with pytest.raises(CommError, match="floating-point"):
        AllReduce(comm, "ring")(torch.ones(2, dtype=torch.int64))


def test_registry_lists_baseline_first() -> None:
    assert algorithm_names()[0] == "native"
    assert set(algorithm_names()) == set(ALGORITHMS.names()) == set(ALGOS)
    assert get_algorithm("brd").name == "brd"


def test_topology_helpers() -> None:
    assert bounds(5, 3) == [(0, 1), (1, 3), (3, 5)]
    assert bounds(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]
    assert [largest_power_of_two(n) for n in (1, 2, 3, 6, 8)] == [1, 2, 2, 4, 8]
    assert [ceil_log2(n) for n in (1, 2, 3, 5, 8)] == [0, 1, 2, 3, 3]
    assert core_members(6) == [0, 2, 4, 5]
    assert core_members(7) == [0, 2, 4, 6]
    assert children(0, 6) == [1, 2, 4] and children(4, 6) == [5] and children(2, 3) == []
    assert [parent(r) for r in range(1, 6)] == [0, 0, 2, 0, 4]
    # every rank but the root has exactly one parent whose children list names it
    for world in range(1, 9):
        for r in range(1, world):
            assert r in children(parent(r), world)  # type: ignore[arg-type]


def test_bytes_per_rank_follow_seed_001_table() -> None:
    """Per-rank bytes sent (fp32, no check headers) match the cost table for N = 4."""
    n, world = 4096, 4
    m = n * 4
    expected = {"ring": 2 * m * 3 / 4, "brd": m * 2, "vhd": 2 * m * 3 / 4}
    for algorithm, per_rank in expected.items():
        sim = SimWorld(world)

        def run(rank: int, sim: SimWorld = sim, algorithm: str = algorithm) -> None:
            AllReduce(sim.comm(rank), algorithm, check=False)(torch.ones(n))

        threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sim.sent_bytes == [per_rank] * world, algorithm


def test_link_segments_carry_enough_wire_bytes() -> None:
    """On an emulated link, sub-byte codecs get longer segments (fewer fixed per-message costs)."""
    from approxdist.comm.collectives.wire import LINK_SEGMENT_WIRE_BYTES, SEGMENT_BYTES, link_segment

    assert link_segment(32) == link_segment(16) == link_segment(8) == SEGMENT_BYTES
    assert link_segment(4) == 2 * SEGMENT_BYTES and link_segment(1) == 8 * SEGMENT_BYTES
    for bits in (1, 2, 3, 4, 5, 8, 16, 32):
        seg = link_segment(bits)
        assert seg % 4 == 0 and seg * bits / 32 >= min(LINK_SEGMENT_WIRE_BYTES, SEGMENT_BYTES * bits / 32)
