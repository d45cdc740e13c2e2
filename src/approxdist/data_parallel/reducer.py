"""The bucket state machine: gradients in, fragments out to the threads, means back (seed 001).

Per backward pass:
1. `start()` (first gradient hook): every bucket waits for its previous reduction, then
   expects all its parameters again.
2. `add(bucket, slot, grad)` copies one gradient into its bucket; with overlap, buckets
   whose gradients are all in are *launched* — strictly in bucket order, as DDP does, so
   every rank submits the same fragments to the same threads in the same order whatever
   the timing (a rank never needs to ask the others what they are doing).
3. `finish()` (end of backward): parameters that got no gradient contribute their
   current `.grad` or zeros; the buckets not launched yet go out — in bucket order with
   overlap, in the order the next forward needs them without.
Copies: a bucket of one parameter is reduced in place in that parameter's `.grad` (no
copy at all); a bucket of several gets one copy in, and its views then become the
parameters' `.grad` (DDP's `gradient_as_bucket_view`), so nothing is copied back.
A launched bucket is cut into fragments (`buckets.fragments`), one all-reduce each (the
mean, or the sum where each replica's gradient is already its share of the whole batch),
spread round robin over the threads. When a bucket's last fragment lands, `on_reduced`
runs on that thread (early forward applies the optimizer step there) and `done` is set.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

import torch
from torch import nn

from approxdist.comm.compressors import Compressor, Where, check_compressor, get_compressor, is_compressor
from approxdist.comm.compressors.gathered_together import GatheredTogether
from approxdist.comm.compressors.together import Member, Together
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.comm.update_error import UpdateError, sent_values
from approxdist.data_parallel.buckets import BucketPlan, forward_order, fragments
from approxdist.data_parallel.compressed import GATHERS, reduce_compressed
from approxdist.data_parallel.threads import CommPool, CommThread
from approxdist.errors import CommError


class BucketState:
    """One bucket's flat fp32 buffer, per-parameter views, and this step's progress."""

    def __init__(self, plan: BucketPlan, params: Sequence[nn.Parameter], device: torch.device,
                 error_feedback: bool, worker: int = 0, seed: int = 0) -> None:
        self.plan, self.params = plan, list(params)
        self._own = torch.zeros(plan.numel, dtype=torch.float32, device=device)
        self._own_views = [self._own[o:o + n].view(p.shape)
                           for o, n, p in zip(plan.offsets, plan.numels, self.params)]
        self.flat, self.views = self._own, list(self._own_views)
        self.solo = len(self.params) == 1 and self.params[0].dtype == torch.float32
        #: the bucket's compressor (its members keep their own residuals), or None: one
        #: parameter's that needs all-gather, or several parameters' compressors and exact
        #: fp32 values as one exchange (`comm.compressors.together`: one all-reduce a
        #: round; `comm.compressors.gathered_together`: one all-gather)
        self.compressor = _compressor(plan, self.params, device, worker, seed)
        #: whether the compressor's state is more than its first (it ran, or was loaded)
        self.compressor_used = False
        self._worker, self._seed = worker, seed
        self.residuals = ErrorFeedback(list(zip(plan.names, plan.offsets, plan.numels)),
                                       plan.numel, device) \
            if error_feedback and self.compressor is None else None
        #: what the codec does to this rank's gradients, while AdaPrec measures it
        self.probe: UpdateError | None = None
        self.have = [False] * len(self.params)
        self.missing = len(self.params)
        self.launched = False
        self.done = threading.Event()
        self.done.set()
        self.error: BaseException | None = None
        self._left = 0
        self._lock = threading.Lock()

    def hold(self, slot: int, grad: torch.Tensor | None) -> torch.Tensor:
        """Put this step's gradient of `slot` in the bucket; return the tensor now holding it.

        A solo bucket reduces a contiguous fp32 `grad` where it is; otherwise the values
        are copied into the bucket's own buffer (zeros when `grad` is None).
        """
        if self.solo and grad is not None and grad.dtype == torch.float32 \
                and grad.is_contiguous() and grad.device == self._own.device:
            self.flat, self.views[0] = grad.view(-1), grad
            return grad
        if self.solo:
            self.flat, self.views[0] = self._own, self._own_views[0]
        view = self.views[slot]
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        return view

    def fresh_compressor(self) -> None:
        """The bucket's compressor rebuilt with its first state (a restore that holds none)."""
        self.compressor = _compressor(self.plan, self.params, self._own.device, self._worker,
                                      self._seed)
        self.compressor_used = False

    def named_compressors(self) -> list[tuple[str, Compressor]]:
        """Each compressed parameter's name and compressor (what `wire_state` keeps)."""
        if isinstance(self.compressor, (Together, GatheredTogether)):
            return [(m.name, m.compressor) for m in self.compressor.members
                    if m.compressor is not None]
        return [(self.plan.names[0], self.compressor)] if self.compressor is not None else []

    def wait(self) -> None:
        """Block until this bucket's reduction (and its update) finished; re-raise its error."""
        self.done.wait()
        if self.error is not None:
            err, self.error = self.error, None
            if isinstance(err, CommError):
                raise err
            raise CommError(f"reducing gradients of {', '.join(self.plan.names[:3])}"
                            f"{' ...' if len(self.plan.names) > 3 else ''} failed: {err}") from err


def _compressor(plan: BucketPlan, params: list[nn.Parameter], device: torch.device,
                worker: int, seed: int) -> Compressor | None:
    """The bucket's compressor(s), each parameter's streams from the run's `seed`, its name
    and `worker` (`Where`)."""
    if not is_compressor(plan.codec):
        return None
    gathered = check_compressor(plan.codec) == "all-gather"
    if gathered and len(params) == 1:
        return get_compressor(plan.codec, Where(tuple(params[0].shape), plan.names[0], seed,
                                                worker, device))
    members = []
    for slot, (name, offset, p) in enumerate(zip(plan.names, plan.offsets, params)):
        comp = get_compressor(plan.codec, Where(tuple(p.shape), name, seed, worker, device)) \
            if is_compressor(plan.codec_of(slot)) else None
        members.append(Member(name, offset, p.shape, comp))
    return GatheredTogether(members, device) if gathered else Together(members, device)


class Reducer:
    """Collects gradients into buckets and reduces them on a `CommPool`."""

    def __init__(self, buckets: Sequence[BucketState], pool: CommPool, *, overlap: bool,
                 chunk_numel: int,
                 on_reduced: Callable[[BucketState, CommThread], None] | None = None,
                 op: str = "mean") -> None:
        self.buckets, self.pool = list(buckets), pool
        self.overlap, self.chunk_numel, self.op = overlap, chunk_numel, op
        self.on_reduced = on_reduced
        self._next = 0  # next bucket to launch, with overlap

    # -- one backward pass --------------------------------------------------------------
    def start(self) -> None:
        for b in self.buckets:
            b.wait()
            b.have = [False] * len(b.params)
            b.missing = len(b.params)
            b.launched = False
        self._next = 0
        self.pool.new_round()

    def add(self, bucket: int, slot: int, grad: torch.Tensor) -> torch.Tensor:
        """Take one parameter's gradient; the tensor that now holds it (see `hold`)."""
        b = self.buckets[bucket]
        if b.have[slot]:
            raise CommError(f"parameter {b.plan.names[slot]!r} got a second gradient in one "
                            f"backward pass; DataParallel reduces once per backward (run extra "
                            f"backward passes inside `with dp.no_sync():`)")
        held = b.hold(slot, grad)
        b.have[slot] = True
        b.missing -= 1
        if self.overlap:
            self._launch_ready()
        return held

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].missing == 0:
            self._launch(self.buckets[self._next])
            self._next += 1

    def finish(self) -> list[list[bool]]:
        """Fill what backward did not produce, launch the rest; the local usage per bucket."""
        used = [list(b.have) for b in self.buckets]
        for b in self.buckets:
            for slot, p in enumerate(b.params):
                if not b.have[slot]:
                    b.hold(slot, p.grad)  # its current .grad, or zeros
        order = range(len(self.buckets)) if self.overlap else forward_order(len(self.buckets))
        for i in order:
            if not self.buckets[i].launched:
                self._launch(self.buckets[i])
        return used

    def wait_all(self) -> None:
        for b in self.buckets:
            b.wait()

    # -- fragments on the threads -------------------------------------------------------
    def _launch(self, b: BucketState) -> None:
        pieces = fragments(b.plan.numel, 0 if b.compressor else self.chunk_numel)
        b.launched = True
        if not pieces:
            return
        b.done.clear()
        b._left = len(pieces)
        for start, stop in pieces:
            self.pool.submit(functools.partial(self._reduce, b, start, stop),
                             weight=float(stop - start), bucket=b.plan.index)

    def _reduce(self, b: BucketState, start: int, stop: int, thread: CommThread) -> None:
        try:
            if b.compressor is not None:  # the whole bucket in one exchange
                b.compressor_used = True
                gather = thread.gatherer(GATHERS[thread.algorithm]) \
                    if b.compressor.collective == "all-gather" else None
                reduce_compressed(b.compressor, b.flat, thread.reducer("fp32"), gather, self.op,
                                  b.probe)
            else:
                reducer = thread.reducer(b.plan.codec)
                x = b.flat[start:stop]
                lossy = not reducer.codec.lossless and reducer.world_size > 1
                exact = x.clone() if b.probe is not None and lossy else x
                residual = None
                if b.residuals is not None and lossy:
                    b.residuals.compensate(x, start, reducer.codec)
                    residual = b.residuals.flat[start:stop]  # x - Q(x) now
                if b.probe is not None:
                    b.probe.observe(start, exact, sent_values(x, reducer.codec, residual)
                                    if lossy else None)
                reducer(x, op=self.op)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            b.error = b.error or exc
        with b._lock:
            b._left -= 1
            last = b._left == 0
        if not last:
            return
        if b.error is None and self.on_reduced is not None:
            try:
                self.on_reduced(b, thread)
            except BaseException as exc:  # noqa: BLE001 - as above
                b.error = exc
        b.done.set()
