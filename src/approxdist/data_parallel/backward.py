"""`DataParallel`'s backward: hooks fill the buckets, the reducer sends them, results land in `.grad`.

One `BackwardPass` serves one bucket layout (a codec switch builds the next): the first
gradient hook waits for the previous step's buckets, each gradient goes into its bucket
(full buckets go to the communication threads, `reducer.py`), and the end of backward
writes every reduced bucket back into `.grad`, unless early forward applies the
optimizer step per bucket on the thread that reduced it (`early_forward.py`) or the
caller asked to `finish()` later (`wait_in_backward=False`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torch import nn

from approxdist.data_parallel.early_forward import StepApplier
from approxdist.data_parallel.hooks import BackwardHooks
from approxdist.data_parallel.reducer import BucketState, Reducer
from approxdist.data_parallel.threads import CommPool, CommThread
from approxdist.data_parallel.usage import UsageFlags
from approxdist.trace.phases import OPTIMIZER, WAIT
from approxdist.trace.recorder import Recorder


class Waits:
    """Time the caller's thread blocks on communication, each block a `wait` span."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.seconds = 0.0

    def __call__(self, wait: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        with self.recorder.span(WAIT):
            wait()
        self.seconds += time.perf_counter() - t0


class BackwardPass:
    """The gradient hooks of one bucket layout and what they do, from the first gradient
    of a backward to the means in `.grad`."""

    def __init__(self, buckets: list[BucketState], pool: CommPool, waits: Waits, *,
                 overlap: bool, chunk_numel: int, op: str, find_unused: bool,
                 applier: StepApplier | None, wait_in_backward: bool) -> None:
        self.buckets, self.waits, self.applier = buckets, waits, applier
        self.wait_in_backward = wait_in_backward
        self.usage = UsageFlags(buckets, pool) if find_unused else None
        self.reducer = Reducer(buckets, pool, overlap=overlap, chunk_numel=chunk_numel,
                               on_reduced=self._on_reduced, op=op)
        slots = [(p, b.plan.index, s) for b in buckets for s, p in enumerate(b.params)]
        self.hooks = BackwardHooks(slots, self.start, self.add, self.end)

    def start(self) -> None:
        """The first gradient of a backward: wait for the previous step's buckets."""
        self.waits(self.reducer.start)
        if self.applier is not None:
            self.applier.snapshot()
        if self.usage is not None:
            self.usage.reset()

    def add(self, bucket: int, slot: int, param: nn.Parameter) -> None:
        """`param`'s gradient into its bucket (launched when the bucket is full)."""
        assert param.grad is not None
        held = self.reducer.add(bucket, slot, param.grad)
        if self.applier is not None:
            param.grad = None  # the engine owns the gradient; the update uses the bucket
        elif held.dtype == param.dtype:
            param.grad = held  # the mean lands in .grad in place: nothing to copy back

    def end(self) -> None:
        """The end of backward: launch what is left, then (by default) `finish`."""
        used = self.reducer.finish()
        if self.usage is not None:
            self.usage.reduce(used, [[p.grad is not None for p in b.params]
                                     for b in self.buckets])
        if self.applier is None and self.wait_in_backward:
            self.finish()

    def finish(self) -> None:
        """Wait for this backward's reductions and put the results in `.grad`."""
        self.wait()
        for b in self.buckets:
            self._write_back(b)

    def wait(self) -> None:
        """Block until every launched reduction (and early-forward update) has finished."""
        self.waits(self.reducer.wait_all)

    def reduce_now(self) -> None:
        """Reduce the current `.grad`s outside backward, as backward would."""
        self.start()
        for b in self.buckets:
            for slot, p in enumerate(b.params):
                if p.grad is not None:
                    self.add(b.plan.index, slot, p)
        self.end()

    def _on_reduced(self, bucket: BucketState, thread: CommThread) -> None:
        used = self.usage.wait(bucket) if self.usage is not None else None
        if self.applier is not None:
            with self.waits.recorder.span(OPTIMIZER, bucket=bucket.plan.index):
                self.applier.apply(bucket, used)

    def _write_back(self, b: BucketState) -> None:
        used = self.usage.wait(b) if self.usage is not None else None
        for slot, (p, view) in enumerate(zip(b.params, b.views)):
            if used is not None and not used[slot]:
                continue
            if p.grad is not None and p.grad.data_ptr() == view.data_ptr():
                continue  # .grad is the bucket's view or the reduced tensor itself
            if p.grad is None:
                p.grad = view.to(p.dtype, copy=True)
            else:
                p.grad.copy_(view)
