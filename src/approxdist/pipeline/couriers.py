"""Who posts a stage's sends and receives: seed 002's communication-thread strategies (Table 4).

Seed 002 traced PipeDream and found compute idle behind communication threads: a stage
fed by three replicas ran nine of them. It compares PipeDream's handler with two
designs that use fewer threads; approxdist offers all of them, selected by
`pipeline.comm_threads` (`--comm-threads`), with our default next to them:

* `inline` (default): no communication thread; the executor posts each non-blocking send
  as soon as its data exists and each receive ahead of its consumer, in the schedule's
  (precomputed) order, and waits for a receive only where it needs the data;
* `per-message` (PipeDream's handler): one thread per peer and direction that posts a
  message and blocks until it has completed before it takes the next one;
* `sa` (impl-SA): one thread per peer and direction that posts every message queued for
  it (a mini-batch's sends, its receives) without blocking, then waits for them in order;
* `sra` (impl-SRA): one thread per peer for both directions, posting in the schedule's
  order as `sa` does.

Each (peer, direction) is served by one thread in every strategy, so messages keep the
order of the schedule on every channel and the link layer matches them as it does inline
(`comm.link`). The data path (encoding, the channel, decoding) stays in the transport; a
thread only posts and waits. Errors reach the executor when it waits, naming the peer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from approxdist.comm.link import Link
from approxdist.config.pipeline import COMM_THREADS
from approxdist.errors import CommError, ConfigError
from approxdist.trace.recorder import NULL_RECORDER, Recorder

T = TypeVar("T")
STRATEGIES = COMM_THREADS


class Future(Generic[T]):
    """The result of a message a thread carries: `wait()` returns it or raises its error."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def wait(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Courier:
    """`inline`: the calling thread posts everything on `link` (no communication thread)."""

    strategy = "inline"

    def __init__(self, link: Link) -> None:
        self.link = link

    def send(self, peer: int, data: torch.Tensor) -> Any:
        """Post `data` to member `peer`; `wait()` returns once it has left."""
        return self.link.isend_bytes(data, peer)

    def recv(self, peer: int, into: torch.Tensor) -> Any:
        """Receive into `into` from member `peer`; `wait()` returns the bytes."""
        return self.link.irecv_bytes(peer, into)

    @property
    def threads(self) -> int:
        return 0

    def close(self) -> None:
        """Nothing runs in the background."""


#: one message for a thread: how to post it, and where its result goes
_Job = tuple[Callable[[], Any], Future[Any]]


class _Carrier:
    """One communication thread: posts the jobs queued for it, waits for them in order."""

    def __init__(self, name: str, batch: bool, rec: Recorder) -> None:
        self.batch, self.rec, self.name = batch, rec, name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"approxdist-{name}", daemon=True)
        self._thread.start()

    def submit(self, post: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((post, future))
        return future

    def _run(self) -> None:
        self.rec.name_thread(self.name)
        while True:
            item = self._queue.get()
            if item is None:
                return
            jobs = [item]
            while self.batch:  # impl-SA / SRA: post all that is queued, then wait in order
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                jobs.append(more)
            self._carry(jobs)

    @staticmethod
    def _carry(jobs: list[_Job]) -> None:
        posted = []
        for post, future in jobs:
            try:
                posted.append((post(), future))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                future.set(error=exc)
        for handle, future in posted:
            try:
                future.set(handle.wait())
            except BaseException as exc:  # noqa: BLE001 - as above
                future.set(error=exc)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30.0)


class ThreadedCourier(Courier):
    """`per-message`, `sa` or `sra`: threads created as peers appear, one per key."""

    def __init__(self, link: Link, strategy: str, rec: Recorder = NULL_RECORDER) -> None:
        super().__init__(link)
        self.strategy, self.rec = strategy, rec
        self._carriers: dict[tuple[int, str], _Carrier] = {}
        self._lock = threading.Lock()

    def _carrier(self, peer: int, direction: str) -> _Carrier:
        key = (peer, "both" if self.strategy == "sra" else direction)
        with self._lock:
            carrier = self._carriers.get(key)
            if carrier is None:
                name = f"comm {key[1]} rank {self.link.global_rank(peer)}"
                carrier = _Carrier(name, batch=self.strategy != "per-message", rec=self.rec)
                self._carriers[key] = carrier
        return carrier

    def send(self, peer: int, data: torch.Tensor) -> Future[Any]:
        return self._carrier(peer, "send").submit(lambda: self.link.isend_bytes(data, peer))

    def recv(self, peer: int, into: torch.Tensor) -> Future[torch.Tensor]:
        return self._carrier(peer, "recv").submit(lambda: self.link.irecv_bytes(peer, into))

    @property
    def threads(self) -> int:
        return len(self._carriers)

    def close(self) -> None:
        for carrier in self._carriers.values():
            carrier.close()
        self._carriers.clear()


def make_courier(link: Link, strategy: str, rec: Recorder = NULL_RECORDER) -> Courier:
    """The courier of `strategy` (one of `STRATEGIES`)."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"communication threads {strategy!r} is not one of: "
                          f"{', '.join(STRATEGIES)}")
    if strategy == "inline":
        return Courier(link)
    if link.device.type == "cuda":
        raise CommError(f"--comm-threads {strategy} posts NCCL sends and receives from several "
                        f"threads, which NCCL does not allow; use inline on GPUs")
    return ThreadedCourier(link, strategy, rec)
