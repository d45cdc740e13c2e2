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
* `sra` (impl-SRA): one thread per peer for both directions. The two threads of a link
  follow one agreed message order per step (`pipeline.schedule.exchange`, given to
  `begin` at the start of each step), post what is ready in that order as `sa` does,
  and wait in order; without the agreed order they can deadlock (each waiting for a
  receive whose sender is queued behind its own send).

Each (peer, direction) is served by one thread in every strategy, so messages keep the
order of the schedule on every channel and the link layer matches them as it does inline
(`comm.link`). The data path (encoding, the channel, decoding) stays in the transport; a
thread only posts and waits. Errors reach the executor when it waits, naming the peer.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch

from approxdist.comm.link import Link
from approxdist.config.pipeline import COMM_THREADS
from approxdist.errors import CommError, ConfigError
from approxdist.trace.recorder import NULL_RECORDER, Recorder

T = TypeVar("T")
STRATEGIES = COMM_THREADS
#: (micro-batches, training?) -> peer -> "send" / "recv" per message of a step, in order
Plan = Callable[[int, bool], Mapping[int, Sequence[str]]]


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

    def begin(self, num_microbatches: int, train: bool) -> None:
        """A step of `num_microbatches` starts (only `sra` needs to know)."""

    @property
    def threads(self) -> int:
        return 0

    def close(self) -> None:
        """Nothing runs in the background."""


#: one message for a thread: its direction, how to post it, and where its result goes
_Job = tuple[str, Callable[[], Any], Future[Any]]
#: what a thread's queue holds: a job, the message order of a step, or None (stop)
_Item = _Job | tuple[str, Sequence[str]] | None


class _Carrier:
    """One communication thread: posts the jobs queued for it, waits for them in order.

    With an agreed order (`plan`) it takes the jobs in that order, holding back those
    submitted early; without one, in the order they were submitted.
    """

    def __init__(self, name: str, batch: bool, rec: Recorder) -> None:
        self.batch, self.rec, self.name = batch, rec, name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._held: deque[_Job] = deque()
        self._plan: deque[str] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"approxdist-{name}", daemon=True)
        self._thread.start()

    def submit(self, direction: str, post: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((direction, post, future))
        return future

    def plan(self, directions: Sequence[str]) -> None:
        """The next messages' directions, in the order both ends of the link agreed."""
        self._queue.put(("plan", directions))

    def _run(self) -> None:
        self.rec.name_thread(self.name)
        while True:
            first = self._next(block=True)
            if first is None:
                break
            jobs = [first]
            while self.batch:  # impl-SA / SRA: post all that is ready, then wait in order
                more = self._next(block=False)
                if more is None:
                    break
                jobs.append(more)
            self._carry(jobs)
        for _, _, future in self._held:  # only if closed mid-step
            future.set(error=CommError(f"{self.name}: closed before this message was posted"))

    def _next(self, block: bool) -> _Job | None:
        """The next job in order; None once closed, or when `block` is off and it is not
        submitted yet."""
        while True:
            job = self._pick()
            if job is not None or self._closed:
                return job
            try:
                item = self._queue.get(block=block)
            except queue.Empty:
                return None
            if item is None:
                self._closed = True
            elif len(item) == 2:  # a step's agreed order
                self._plan.extend(item[1])
            else:
                self._held.append(item)

    def _pick(self) -> _Job | None:
        if not self._plan:
            return self._held.popleft() if self._held else None
        for i, job in enumerate(self._held):
            if job[0] == self._plan[0]:
                self._plan.popleft()
                del self._held[i]
                return job
        return None

    @staticmethod
    def _carry(jobs: list[_Job]) -> None:
        posted = []
        for _, post, future in jobs:
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

    def __init__(self, link: Link, strategy: str, rec: Recorder = NULL_RECORDER,
                 plan: Plan | None = None) -> None:
        super().__init__(link)
        self.strategy, self.rec = strategy, rec
        self._carriers: dict[tuple[int, str], _Carrier] = {}
        self._lock = threading.Lock()
        self._plan = plan if strategy == "sra" else None
        self._plans: dict[tuple[int, bool], Mapping[int, Sequence[str]]] = {}

    def begin(self, num_microbatches: int, train: bool) -> None:
        """`sra`: hand each peer's thread the step's agreed message order."""
        if self._plan is None:
            return
        key = (num_microbatches, train)
        if key not in self._plans:
            self._plans[key] = self._plan(num_microbatches, train)
        for peer, order in self._plans[key].items():
            self._carrier(peer, "both").plan(order)

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
        return self._carrier(peer, "send").submit("send", lambda: self.link.isend_bytes(data, peer))

    def recv(self, peer: int, into: torch.Tensor) -> Future[torch.Tensor]:
        return self._carrier(peer, "recv").submit("recv", lambda: self.link.irecv_bytes(peer, into))

    @property
    def threads(self) -> int:
        return len(self._carriers)

    def close(self) -> None:
        for carrier in self._carriers.values():
            carrier.close()
        self._carriers.clear()


def make_courier(link: Link, strategy: str, rec: Recorder = NULL_RECORDER,
                 plan: Plan | None = None) -> Courier:
    """The courier of `strategy` (one of `STRATEGIES`); `sra` needs `plan`, the agreed
    message order of each step with each peer."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"communication threads {strategy!r} is not one of: "
                          f"{', '.join(STRATEGIES)}")
    if strategy == "inline":
        return Courier(link)
    if link.device.type == "cuda":
        raise CommError(f"--comm-threads {strategy} posts NCCL sends and receives from several "
                        f"threads, which NCCL does not allow; use inline on GPUs")
    if strategy == "sra" and plan is None:
        raise ConfigError("--comm-threads sra needs the schedule's message order per peer "
                          "(make_courier(..., plan=...))")
    return ThreadedCourier(link, strategy, rec, plan)
