"""PipeDream-2BW (Narayanan et al., ICML'21; seed 002): double-buffered weights, no flush.

The stream's K mini-batches of M micro-batches run in one 1F1B order, as PipeDream's, but
each stage steps its optimizer once per mini-batch, right after the backward of the
mini-batch's last micro-batch, with the gradients of its M micro-batches summed. Every
micro-batch of mini-batch b runs, on every stage, with version max(b - 1, 0), so the step
that ends mini-batch b applies a gradient computed one version back:

    W(t+1) = W(t) - lr * grad f(W(t-1))        (W(-1) = W(0))

and each stage holds at most 2 versions: the one in use and the newest. Version b - 1 must
exist when the first forward of mini-batch b runs; stage 0 runs it after P - 1 warm-up
forwards, so this needs M >= P - 1 (the paper takes M >= P).

Replicated stages (`dealing`, hybrid): replica n mod r_s of stage s runs item n; M must
be a multiple of r_s, so each mini-batch is whole rounds and every replica steps once per
mini-batch on the gradient of its own last backward of it summed over the replicas; the
`AR` that sums and applies it waits until the first forward of mini-batch b + 2, the
first user of the version it makes. All of mini-batch b's items use version
max(b - 1, 0) on every replica, so the update is the same as with one rank per stage:
W(t+1) = W(t) - lr * grad f(W(t-1)), the gradient of the whole mini-batch.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.one_f_one_b import stage_order
from approxdist.pipeline.schedule.registry import register_async
from approxdist.pipeline.schedule.versions import AsyncSchedule, Stream, assign_versions
from approxdist.topology.dealing import Dealing

#: versions a 2BW stage holds at most: double buffering
TWO_BW_VERSIONS = 2


@register_async("2bw", default_minibatches=3)
def two_bw(num_stages: int, stream: Stream, dealing: Dealing | None = None) -> AsyncSchedule:
    """PipeDream-2BW: 1F1B with no flush, a step per mini-batch, two weight versions per stage."""
    p, m = num_stages, stream.microbatches
    if p > 1 and m < p - 1:
        raise ScheduleError(
            f"2bw needs at least P - 1 = {p - 1} micro-batches per mini-batch for {p} stages, "
            f"got {m}: stage 0 would start mini-batch 2 before it made version 1; use "
            f"--microbatches {p - 1} or more")

    def previous(stage: int, item: int, newest: int) -> int:
        return max(stream.minibatch_of(item) - 1, 0)

    def last_of_minibatch(item: int) -> bool:
        return item % m == m - 1

    compute = {s: stage_order(s, p, stream.items) for s in range(p)}
    return assign_versions("2bw", p, stream, compute, previous, last_of_minibatch,
                           {s: TWO_BW_VERSIONS for s in range(p)}, dealing)
