"""The all-reduce argument check posts the data receives before the data can leave.

On a real TCP link a message that reaches gloo before its receive is posted stalls the
pair (docs/links.md: the earlier head scheme, 610 instead of 345 ms for 4 MB at
100 Mbit/s). Here every rank's posts are logged on one clock through a simulated world:
the first message each way between two ranks is the signature, and every data message
of the first data batch from one rank to another (the one the check holds until the
receiver's signature is in) is posted after its receive. Later batches follow the
algorithm's own order. Mismatches are still reported with ranks and values (also
`test_collectives.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from approxdist.comm.collectives import AllReduce
from approxdist.comm.collectives.base import Pending, Recv, Send
from approxdist.comm.collectives.check import SIGNATURE_BYTES, scheme
from approxdist.errors import CommError, SpecError
from tests.helpers.sim_world import SimComm, SimWorld, run_ranks

Entry = tuple[str, int, int, int, int]


class _Logged:
    """A `SimComm` that logs ("recv"|"send", src, dst, bytes, batch) as each message is
    posted; batches are numbered on one counter for all ranks."""

    def __init__(self, comm: SimComm, log: list[Entry], lock: threading.Lock) -> None:
        self.comm, self.log, self.lock = comm, log, lock
        self.rank, self.world_size = comm.rank, comm.world_size

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        with self.lock:  # receives first, then the sends, as gloo posts them
            batch = len({e[4] for e in self.log})
            for peer, want in recvs:
                n = int(want.numel()) if isinstance(want, torch.Tensor) else int(want)
                self.log.append(("recv", peer, self.rank, n, batch))
            for peer, data in sends:
                self.log.append(("send", self.rank, peer, int(data.numel()), batch))
            return self.comm.start(sends, recvs)

    def native_sum(self, x: torch.Tensor) -> None:
        self.comm.native_sum(x)


def _run(algorithm: str, xs: list[torch.Tensor], **kwargs: Any) -> list[Entry]:
    world, lock = SimWorld(len(xs)), threading.Lock()
    log: list[Entry] = []
    run_ranks(world, lambda rank: AllReduce(_Logged(world.comm(rank), log, lock), algorithm,
                                            **kwargs)(xs[rank]))
    return log


@pytest.mark.parametrize("algorithm", ["ring", "brb", "brd", "vhd"])
@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_every_data_receive_is_posted_before_its_send(algorithm: str, world: int) -> None:
    """The handshake (ranks on several hosts); the head scheme of one host fails this."""
    xs = [torch.full((1001,), float(r + 1)) for r in range(world)]
    log = _run(algorithm, xs, segment_bytes=256, check="handshake")  # several segments
    assert all(torch.equal(x, xs[0]) for x in xs)
    assert float(xs[0][0]) == world * (world + 1) / 2
    posted: dict[tuple[str, int, int], list[int]] = {}
    for at, (kind, src, dst, _, _) in enumerate(log):
        posted.setdefault((kind, src, dst), []).append(at)
    pairs = {(e[1], e[2]) for e in log}
    assert pairs, "nothing was exchanged"
    for src, dst in pairs:
        sends, recvs = posted.get(("send", src, dst), []), posted.get(("recv", src, dst), [])
        assert len(sends) == len(recvs), f"{src}->{dst}: {len(sends)} sends, {len(recvs)} receives"
        assert log[sends[0]][3] == SIGNATURE_BYTES, f"{src}->{dst}: the signature is not first"
        if len(sends) == 1:
            continue  # this pair's data goes the other way only
        first_data = log[sends[1]][4]
        for k, (send_at, recv_at) in enumerate(zip(sends, recvs)):
            if k and log[send_at][4] == first_data:
                assert recv_at < send_at, f"{src}->{dst} message {k}: sent before its receive"


@pytest.mark.parametrize("check", ["head", "handshake"])
def test_a_one_way_step_still_checks_both_ends(check: str) -> None:
    """BRB's reduce is one-way; the receiver's signature still reaches the sender."""
    with pytest.raises(CommError, match=r"length: .*5 on rank.*6 on rank|6 on rank.*5 on"):
        _run("brb", [torch.ones(5), torch.ones(6)], check=check)


def test_the_scheme_follows_the_hosts() -> None:
    assert scheme(True, {}) == "head"  # no launcher variables: one host
    assert scheme(True, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}) == "head"
    assert scheme("auto", {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}) == "handshake"
    assert scheme("head", {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}) == "head"
    assert scheme("handshake", {}) == "handshake" and scheme(False) is None
    with pytest.raises(SpecError, match="check = 'loose' is not one of True, False"):
        scheme("loose")


@pytest.mark.parametrize("check", ["head", "handshake"])
@pytest.mark.parametrize("algorithm", ["ring", "brb", "brd", "vhd"])
def test_both_schemes_reduce_and_catch_a_mismatch(check: str, algorithm: str) -> None:
    xs = [torch.full((3000,), float(r + 1)) for r in range(3)]
    _run(algorithm, xs, segment_bytes=1024, check=check)
    assert all(torch.equal(x, torch.full((3000,), 6.0)) for x in xs)
    with pytest.raises(CommError, match="all-reduce arguments differ across ranks"):
        _run(algorithm, [torch.ones(7), torch.ones(7), torch.ones(9)], check=check)
