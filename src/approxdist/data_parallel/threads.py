"""Communication threads, each with its own lane to the other ranks (seeds 001 and 002).

Seed 001 runs the all-reduces on CPU threads while the accelerator continues backward,
and cuts large gradients into fragments that several threads carry at once. Seed 002
warns against too many threads. A `CommPool` holds `threads` workers; each owns:

* its own lane of the engine's group (`Group.fork()`, a process group over the same
  ranks) and `Link` (so its messages never match another thread's: the link layer
  matches messages in posting order per lane), and one `AllReduce` per codec (their
  work buffers are not shared between threads);
* a FIFO job queue. Jobs are submitted in the same order on every rank and each thread
  runs its queue in order, so every rank performs the same collectives in the same
  order on every lane.

All lanes of a rank share one emulated link (one `netem.Shaper`): a link's bandwidth
is a property of the wire, not of the number of threads using it. A control lane for
the main thread (small exact reductions: usage flags, buffers) completes the pool.

Tracing (docs/tracing.md): each thread records its jobs as `sync` spans on its own row
("comm0", "comm1", ...) and each link reports its transfers on its own lane, named
alike on every rank ("control", "comm0", ...).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from approxdist.comm.collectives import AllGather, AllReduce, Calibration
from approxdist.comm.collectives.autocal import resolve
from approxdist.comm.link import Link
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.trace.phases import SYNC
from approxdist.trace.recorder import NULL_RECORDER, Recorder

Job = Callable[["CommThread"], None]


class CommThread:
    """One worker: a lane (group + link), reducers per codec, and a job queue."""

    def __init__(self, name: str, link: Link, algorithm: str,
                 calibration: Calibration | str | Path | None,
                 rec: Recorder = NULL_RECORDER, row: str = "") -> None:
        self.name, self.link = name, link
        self.algorithm, self.calibration = algorithm, calibration
        self.rec, self.row = rec, row or name
        self.busy_s = 0.0
        self._reducers: dict[str, AllReduce] = {}
        self._gathers: dict[str, AllGather] = {}
        self._queue: queue.SimpleQueue[tuple[Job, dict[str, Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def reducer(self, codec: str) -> AllReduce:
        """This thread's all-reduce for `codec` (built on first use, then kept)."""
        ar = self._reducers.get(codec)
        if ar is None:
            ar = AllReduce(self.link, self.algorithm, codec, calibration=self.calibration)
            self._reducers[codec] = ar
        elif ar.check:
            # the first call checked that every rank agrees (length, codec, algorithm); the
            # layout is fixed at construction, so later calls skip the extra messages
            ar.check = None
        return ar

    def gatherer(self, algorithm: str) -> AllGather:
        """This thread's exact all-gather with `algorithm` (built on first use, then kept):
        what carries a compressor's payloads (`compressed.py`)."""
        ag = self._gathers.get(algorithm)
        if ag is None:
            ag = self._gathers[algorithm] = AllGather(self.link, algorithm=algorithm)
        elif ag.check:
            ag.check = None  # as `reducer`: a payload's size is fixed once checked
        return ag

    def submit(self, job: Job, **span: Any) -> None:
        """Queue `job`; `span` are the arguments of its `sync` span (e.g. `bucket=3`)."""
        self._queue.put((job, span))

    def _run(self) -> None:
        self.rec.name_thread(self.row)
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, span = item
            t0 = time.perf_counter()
            with self.rec.span(SYNC, **span):
                job(self)  # jobs report their own errors (see reducer.py); nothing escapes
            self.busy_s += time.perf_counter() - t0

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30.0)


#: GIL switch interval (ms) while comm threads run; Python's default is 5 ms
GIL_SWITCH_MS = 0.5


def shorten_gil_switch(ms: float | None) -> None:
    """Lower the interpreter's GIL switch interval to at most `ms` milliseconds (never raise it).

    Comm threads run Python between their C calls (posting messages, codec glue), and the
    training thread needs the GIL for its autograd hooks and the modules' forward. At
    Python's default of 5 ms a thread that wants the GIL can wait that long behind a comm
    thread holding it, many times per step (ResNet-56, 2 ranks, 1 Gbit/s: a few percent
    of the step, within run-to-run noise; docs/data_parallel.md). A process-wide setting,
    like `torch.set_num_threads`; None leaves it alone.
    """
    if ms is None:
        return
    if not ms > 0:
        raise ConfigError(f"gil_switch_ms = {ms} must be > 0 (Python's default is 5); e.g. 0.5, "
                          f"or None to leave the interpreter's setting")
    if sys.getswitchinterval() > ms / 1000:
        sys.setswitchinterval(ms / 1000)


class Balancer:
    """Which thread takes the next job: the one with the least weight so far (ties: the lowest).

    Weights are sizes (values to reduce), so big all-reduces land on different threads and
    share the link instead of queueing behind each other on one (MLP bf16 at 1 Gbit/s:
    the three big weights all fell on thread 0 under round robin, and the link idled
    between them). The choice depends only on the sequence of weights, which every rank
    submits in the same order, so every rank picks the same thread. Equal weights give
    round robin.
    """

    def __init__(self, threads: int) -> None:
        self.load = [0.0] * threads

    def reset(self) -> None:
        self.load = [0.0] * len(self.load)

    def pick(self, weight: float) -> int:
        i = min(range(len(self.load)), key=lambda k: (self.load[k], k))
        self.load[i] += weight
        return i


class CommPool:
    """`threads` communication threads plus a control lane for the main thread, all
    over `group` (each on its own fork of it; the members build their pools in the same
    order)."""

    def __init__(self, ctx: DistContext, group: Group, link: str | None, threads: int,
                 algorithm: str, calibration: Calibration | str | Path | None = None,
                 name: str = "dp", rec: Recorder = NULL_RECORDER,
                 gil_switch_ms: float | None = GIL_SWITCH_MS) -> None:
        shorten_gil_switch(gil_switch_ms)
        self.ctx, self.group = ctx, group
        spec = parse_link(link)
        lanes = ["control"] + [f"comm{i}" for i in range(threads)]
        control = Link(ctx, spec, group=group.fork(), hook=rec.transfer_hook(lanes[0]))
        links = [control] + [Link(ctx, spec, group=group.fork(), hook=rec.transfer_hook(s),
                                  shaper=control.shaper) for s in lanes[1:]]
        self.control = control
        self.control_reducer = AllReduce(self.control, "brd" if group.size > 1 else "ring",
                                         "fp32", check=False)
        # auto's calibration (`autocal`): agreed here, on the main thread, by every member
        calibration = resolve(control, calibration, algorithm)
        self.threads = [CommThread(f"approxdist-{name}-{s}", lk, algorithm, calibration, rec, s)
                        for s, lk in zip(lanes[1:], links[1:])]
        self._balance = Balancer(len(self.threads))

    def new_round(self) -> None:
        """Start counting `submit` weights afresh (each backward pass calls it)."""
        self._balance.reset()

    def submit(self, job: Job, weight: float = 1.0, **span: Any) -> None:
        """Give `job` to the least loaded thread this round (see `Balancer`)."""
        self.threads[self._balance.pick(weight)].submit(job, **span)

    @property
    def links(self) -> list[Link]:
        return [self.control] + [t.link for t in self.threads]

    def bytes_sent(self) -> int:
        return sum(lk.stats.bytes_sent for lk in self.links)

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent per directed link, `{"0->1": n, ...}` (global ranks)."""
        out: dict[str, int] = {}
        for lk in self.links:
            for peer, n in lk.stats.sent.items():
                key = f"{lk.me}->{peer}"
                out[key] = out.get(key, 0) + n
        return out

    def busy_seconds(self) -> float:
        return sum(t.busy_s for t in self.threads)

    def close(self) -> None:
        for t in self.threads:
            t.close()
        self.control.close()  # the shared shaper: posts what it still holds, then stops
        for lk in self.links:
            lk.group.release()  # the lanes go back to the group for the next engine
