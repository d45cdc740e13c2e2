"""A simulated world: N ranks as threads in one process, exchanging bytes through queues.

The same algorithm code as on real ranks runs here (`SimComm` is a `PeerComm`), so
seed 001's algorithms are unit-tested without sockets:

    outs = simulate("vhd", [torch.randn(10) for _ in range(5)], codec="bf16")

Messages are copied when sent. Receives follow gloo: a shorter message fills the front
of the buffer, a longer one is an error (gloo would abort the process). A rank that
fails aborts the others.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from approxdist.comm.collectives.base import Pending, Recv, Send
from approxdist.errors import CommError


class SimWorld:
    """Shared state of N simulated ranks."""

    def __init__(self, world_size: int, timeout_s: float = 20.0) -> None:
        self.world_size, self.timeout_s = world_size, timeout_s
        self.queues: dict[tuple[int, int], queue.Queue[torch.Tensor]] = {
            (s, d): queue.Queue() for s in range(world_size) for d in range(world_size) if s != d}
        self.aborted = threading.Event()
        self._barrier = threading.Barrier(world_size)
        self._slots: list[torch.Tensor | None] = [None] * world_size
        self.sent_bytes = [0] * world_size

    def comm(self, rank: int) -> SimComm:
        return SimComm(self, rank)

    def abort(self) -> None:
        self.aborted.set()
        self._barrier.abort()

    def take(self, src: int, dst: int) -> torch.Tensor:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.aborted.is_set():
                raise CommError(f"rank {dst}: another simulated rank failed")
            try:
                return self.queues[(src, dst)].get(timeout=0.02)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise CommError(f"rank {dst}: nothing from rank {src} within "
                                    f"{self.timeout_s:g} s (deadlock?)") from None

    def native_sum(self, rank: int, x: torch.Tensor) -> None:
        self._slots[rank] = x.clone()
        self._barrier.wait(self.timeout_s)
        total = self._slots[0].clone()  # type: ignore[union-attr]
        for other in self._slots[1:]:
            total += other  # type: ignore[operator]
        self._barrier.wait(self.timeout_s)
        x.copy_(total)


class _SimPending:
    def __init__(self, comm: SimComm, recvs: Sequence[Recv]) -> None:
        self.comm, self.recvs = comm, list(recvs)
        self.got: list[torch.Tensor] = []

    def recv(self, i: int) -> torch.Tensor:
        while len(self.got) <= i:  # messages from one peer arrive in order: take in order
            self.got.append(self._take(*self.recvs[len(self.got)]))
        return self.got[i]

    def received(self) -> list[torch.Tensor]:
        return [self.recv(i) for i in range(len(self.recvs))]

    def _take(self, peer: int, want: int | torch.Tensor) -> torch.Tensor:
        data = self.comm.world.take(peer, self.comm.rank)
        n = int(want.numel()) if isinstance(want, torch.Tensor) else int(want)
        if data.numel() > n:  # gloo would abort the process here
            raise CommError(f"rank {self.comm.rank}: {data.numel()} bytes from rank {peer} "
                            f"do not fit the {n}-byte receive buffer")
        buf = want if isinstance(want, torch.Tensor) else torch.zeros(n, dtype=torch.uint8)
        buf[:data.numel()].copy_(data)
        return buf

    def sent(self, i: int) -> None:
        return None

    def finish(self) -> None:
        return None


class SimComm:
    """One simulated rank's `PeerComm`."""

    def __init__(self, world: SimWorld, rank: int) -> None:
        self.world, self.rank, self.world_size = world, rank, world.world_size

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        for peer, data in sends:
            if not 0 <= peer < self.world_size or peer == self.rank:
                raise CommError(f"rank {self.rank}: bad peer {peer}")
            self.world.queues[(self.rank, peer)].put(data.clone())
            self.world.sent_bytes[self.rank] += int(data.numel())
        return _SimPending(self, recvs)

    def native_sum(self, x: torch.Tensor) -> None:
        self.world.native_sum(self.rank, x)


def run_ranks(world: SimWorld, main: Callable[[int], Any]) -> list[Any]:
    """`main(rank)` for every rank of `world`, each on its own thread; their results in rank
    order. A rank that raises aborts the world (its peers' waits fail) and its error (the
    first that is not a peer's abort) is raised here."""
    outs: list[Any] = [None] * world.world_size
    failed: list[tuple[int, BaseException]] = []

    def run(rank: int) -> None:
        try:
            outs[rank] = main(rank)
        except BaseException as exc:  # noqa: BLE001 - reported below with the rank
            failed.append((rank, exc))
            world.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        primary = [e for e in failed if "another simulated rank failed" not in str(e[1])]
        raise (primary or failed)[0][1]
    return outs


def simulate(algorithm: str, inputs: Sequence[torch.Tensor], codec: str = "fp32",
             op: str = "sum", **kwargs: Any) -> list[torch.Tensor]:
    """Run one all-reduce over `len(inputs)` simulated ranks; each rank's result, in order.

    `kwargs` go to `AllReduce` (channel, calibration, check). Inputs are not modified.
    """
    from approxdist.comm.collectives.allreduce import AllReduce

    world = SimWorld(len(inputs))
    return run_ranks(world, lambda rank: AllReduce(world.comm(rank), algorithm, codec, **kwargs)(
        inputs[rank].clone(), op))
