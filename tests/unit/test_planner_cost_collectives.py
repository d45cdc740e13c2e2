"""All-reduce steps and times: hand-computed Thakur et al. terms, and the messages our
algorithms really post on a simulated world (the oracle for the counts)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from approxdist.comm.collectives.allreduce import AllReduce
from approxdist.comm.collectives.base import Pending, Recv, Send
from approxdist.errors import ConfigError, SpecError
from approxdist.planner.cost import (
    CodecCost,
    LinkLevel,
    Step,
    allreduce_steps,
    allreduce_time,
    fastest,
    total,
)
from tests.helpers.sim_world import SimComm, SimWorld, run_ranks

MIB = 1 << 20
S = 4 * MIB  # fp32 bytes of the 2^20-value vector used below
LEVEL = LinkLevel("intra", 1e-4, 1e-9, 5e-10)
ALPHA, BETA, GAMMA = 1e-4, 1e-9, 5e-10


def test_ring_is_the_textbook_formula() -> None:
    # N = 4, chunks of 1 MiB (one 4 MiB segment each): 2(N-1) steps
    assert total(allreduce_steps("ring", 4, MIB)) == Step(6, 6 * MIB, 3 * MIB, 0, 0)
    expected = 2 * 3 * ALPHA + 2 * 3 / 4 * S * BETA + 3 / 4 * S * GAMMA
    assert allreduce_time(LEVEL, "ring", 4, MIB) == pytest.approx(expected)


def test_brd_vhd_brb_by_hand() -> None:
    # brd, N = 4: log2 4 = 2 exchanges of the whole 4 MiB in 1 MiB segments, each added
    assert total(allreduce_steps("brd", 4, MIB)) == Step(8, 2 * S, 2 * S, 0, 0)
    assert allreduce_time(LEVEL, "brd", 4, MIB) == pytest.approx(8 * ALPHA + 2 * S * (BETA + GAMMA))
    # vhd, N = 4: halving 2 MiB (2 segments) + 1 MiB, gathering 1 MiB + 2 MiB (one message each)
    vhd = allreduce_steps("vhd", 4, MIB)
    assert [s.messages for s in vhd] == [2, 1, 1, 1]
    assert [s.wire_bytes for s in vhd] == [2 * MIB, MIB, MIB, 2 * MIB]
    assert total(vhd) == Step(5, 2 * 3 * S // 4, 3 * S // 4, 0, 0)  # 2 (p-1)/p S, (p-1)/p S
    # brb, N = 5: ceil(log2 5) = 3 levels up (added) and 3 down, whole vectors, unsegmented
    assert total(allreduce_steps("brb", 5, MIB)) == Step(6, 6 * S, 3 * S, 0, 0)
    # brd, N = 3 folds: the odd rank's vector in (4 segments, added), one core step, the result out
    assert [s.messages for s in allreduce_steps("brd", 3, MIB)] == [4, 4, 1]
    assert total(allreduce_steps("brd", 3, MIB)) == Step(9, 3 * S, 2 * S, 0, 0)
    # native: gloo's ring, one message per step; bf16 sums 2-byte values
    assert total(allreduce_steps("native", 4, MIB, CodecCost.of("bf16"))) == \
        Step(6, 6 * MIB // 2, 3 * MIB, 0, 0)


def test_a_lossy_codec_adds_headers_per_segment_and_its_coding() -> None:
    bf16 = CodecCost("bf16", 3e-10, 1e-10)
    ring = total(allreduce_steps("ring", 4, MIB, bf16))
    chunk = MIB // 4  # values per chunk
    # 6 messages of a 2-byte-per-value payload with its 16-byte header; N chunks encoded,
    # 2N - 1 decoded (N - 1 to add, the owner's own copy, N - 1 to land)
    assert ring == Step(6, 6 * (2 * chunk + 16), 3 * MIB, 4 * 4 * chunk, 7 * 4 * chunk)
    coding = 3e-10 * 4 * 4 * chunk + 1e-10 * 7 * 4 * chunk
    assert allreduce_time(LEVEL, "ring", 4, MIB, bf16) == pytest.approx(
        6 * ALPHA + 6 * (2 * chunk + 16) * BETA + 3 * MIB * GAMMA + coding)
    # segmented: brd's 1 MiB segments each carry a header
    brd = total(allreduce_steps("brd", 2, MIB, bf16))
    assert brd.messages == 4 and brd.wire_bytes == 4 * (2 * MIB // 4 + 16)
    assert brd.encode_bytes == S and brd.decode_bytes == 2 * S  # share's own copy + the add


def test_loopback_load_multiplies_the_whole_time() -> None:
    loop = LinkLevel("loopback", ALPHA, BETA, GAMMA, cores=2)
    assert allreduce_time(loop, "ring", 4, MIB) == pytest.approx(2 * allreduce_time(LEVEL, "ring", 4, MIB))
    assert allreduce_time(loop, "ring", 4, MIB, busy=2) == pytest.approx(
        allreduce_time(LEVEL, "ring", 4, MIB))


def test_auto_is_the_fastest_candidate() -> None:
    small, large = 1024, 16 * MIB
    for values in (small, large):
        times = {a: allreduce_time(LEVEL, a, 8, values) for a in ("ring", "brb", "brd", "vhd", "native")}
        name, t = fastest(LEVEL, 8, values)
        assert t == min(times.values()) == allreduce_time(LEVEL, "auto", 8, values)
        assert times[name] == t
    assert fastest(LEVEL, 8, small)[0] == "brd"  # fewest messages
    # with a lossy codec native is no candidate (it would change the arithmetic)
    assert fastest(LEVEL, 8, large, CodecCost.of("bf16"))[0] != "native"


def test_trivial_and_bad_calls() -> None:
    assert allreduce_steps("ring", 1, MIB) == [] and allreduce_steps("vhd", 4, 0) == []
    assert allreduce_time(LEVEL, "auto", 1, MIB) == 0.0
    with pytest.raises(SpecError, match=r"unknown all-reduce algorithm 'tree'; valid: auto, brb, brd"):
        allreduce_steps("tree", 4, MIB)
    with pytest.raises(ConfigError, match=r"world = 0 must be an integer >= 1"):
        allreduce_steps("ring", 0, MIB)
    with pytest.raises(ConfigError, match=r"values = 2.5 must be an integer >= 0"):
        allreduce_steps("ring", 2, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'native' sums only fp32, fp16, bf16, not codec 'table4'"):
        allreduce_steps("native", 2, MIB, CodecCost.of("table4"))
    with pytest.raises(ConfigError, match=r"'auto' has no steps of its own"):
        allreduce_steps("auto", 2, MIB)


class _Counting(SimComm):
    """Counts the messages and bytes this rank posts and expects."""

    def __init__(self, world: SimWorld, rank: int) -> None:
        super().__init__(world, rank)
        self.sent = self.sent_bytes = self.received = self.received_bytes = 0

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        self.sent += len(sends)
        self.sent_bytes += sum(int(d.numel()) for _, d in sends)
        sizes = [int(r.numel()) if isinstance(r, torch.Tensor) else int(r) for _, r in recvs]
        self.received += len(sizes)
        self.received_bytes += sum(sizes)
        return super().start(sends, recvs)


def _run(algorithm: str, world: int, values: int, codec: str, segment: int) -> list[_Counting]:
    sim = SimWorld(world)
    comms = [_Counting(sim, r) for r in range(world)]
    run_ranks(sim, lambda rank: AllReduce(comms[rank], algorithm, codec, check=False,
                                          segment_bytes=segment)(torch.randn(values)))
    return comms


@pytest.mark.parametrize("codec", ["fp32", "bf16", "bits:s0e2+2m0"])
@pytest.mark.parametrize("algorithm", ["ring", "brd", "vhd"])
@pytest.mark.parametrize("world", [2, 4])
def test_the_counts_are_what_a_symmetric_algorithm_posts(algorithm: str, world: int,
                                                         codec: str) -> None:
    """On a power-of-two world with N | n every rank sends the critical path's messages."""
    values, segment = 1024, 1024  # 4 KiB vectors in 1 KiB segments
    steps = total(allreduce_steps(algorithm, world, values, CodecCost.of(codec), segment))
    for comm in _run(algorithm, world, values, codec, segment):
        assert (comm.sent, comm.sent_bytes) == (steps.messages, steps.wire_bytes)
        assert (comm.received, comm.received_bytes) == (steps.messages, steps.wire_bytes)


@pytest.mark.parametrize("codec", ["fp32", "bf16"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_brb_critical_path_is_what_the_root_sends_and_receives(world: int, codec: str) -> None:
    values = 1000
    steps = total(allreduce_steps("brb", world, values, CodecCost.of(codec)))
    root = _run("brb", world, values, codec, 1 << 20)[0]
    assert root.sent + root.received == steps.messages
    assert root.sent_bytes + root.received_bytes == steps.wire_bytes


@pytest.mark.parametrize("algorithm", ["ring", "brd", "vhd", "brb"])
@pytest.mark.parametrize("world", [3, 5, 6])
def test_no_rank_sends_more_than_the_critical_path_counts(algorithm: str, world: int) -> None:
    """Uneven chunks and folded worlds: the model's largest pieces bound every rank."""
    values, segment = 1001, 1024
    steps = total(allreduce_steps(algorithm, world, values, CodecCost.of("bf16"), segment))
    for comm in _run(algorithm, world, values, "bf16", segment):
        assert comm.sent <= steps.messages and comm.sent_bytes <= steps.wire_bytes
