"""PipeDream (Narayanan et al., SOSP'19; seed 002): asynchronous 1F1B with weight stashing.

PipeDream has no micro-batches: each item in the pipeline is one of its mini-batches and
every stage steps its optimizer right after each backward. Here the stream's K*M
micro-batches are those items, so `pipedream` does the same work as `2bw` and the flushed
schedules over K mini-batches of M. No flush: stage s admits P - s forwards before its
first backward, then alternates one forward and one backward (1F1B), to the stream's end.

A forward uses the stage's newest version; its backward uses the same one (weight
stashing), so stage s holds up to P - s versions: the newest and one stashed for each
other micro-batch it has in flight. Stage s applies each gradient P - s - 1 steps after
the version it was computed at (the last stage: 0, synchronous).

Replicated stages (`dealing`, hybrid): replica n mod r_s of stage s runs item n, and
the stage steps once per round of r_s items (one per replica, `versions.step_ends`) on the
sum of the round's gradients, each computed at the version its own forward stashed:

    W_s(t+1) = W_s(t) - lr * sum_j lambda_n grad f_n(W_s(v_n)),  n = t*r_s + j, j < r_s

(lambda_n: item n's share of the round's samples). Of the P - s consecutive items stage
s has in flight, a replica holds at most ceil((P - s) / r_s), and so many versions.

`pipedream-vsync` adds PipeDream's vertical sync: every stage runs micro-batch n with the
version the first stage used for it, max(n - P + 1, 0), so each gradient comes from one
consistent set of weights across the stages; it costs P versions and a delay of P - 1 on
every stage.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.one_f_one_b import stage_order
from approxdist.pipeline.schedule.registry import register_async
from approxdist.pipeline.schedule.versions import AsyncSchedule, Stream, assign_versions
from approxdist.topology.dealing import Dealing


def _newest(stage: int, item: int, newest: int) -> int:
    return newest


def _every_item(item: int) -> bool:
    return True


def stashing_limit(stages: int, stage: int, replicas: int) -> int:
    """Versions a PipeDream replica holds at most: one per item of its own in flight, of the
    P - s consecutive items its stage has in flight: ceil((P - s) / r_s)."""
    return -(-(stages - stage) // replicas)


@register_async("pipedream", default_minibatches=2)
def pipedream(num_stages: int, stream: Stream, dealing: Dealing | None = None) -> AsyncSchedule:
    """PipeDream: 1F1B with no flush, an optimizer step after every backward, weight stashing."""
    p = num_stages
    counts = dealing.replicas if dealing is not None else (1,) * p
    compute = {s: stage_order(s, p, stream.items) for s in range(p)}
    return assign_versions("pipedream", p, stream, compute, _newest, _every_item,
                           {s: stashing_limit(p, s, counts[s]) for s in range(p)}, dealing)


@register_async("pipedream-vsync", default_minibatches=2)
def pipedream_vsync(num_stages: int, stream: Stream,
                    dealing: Dealing | None = None) -> AsyncSchedule:
    """PipeDream with vertical sync: every stage uses the first stage's version of each item."""
    p = num_stages
    if dealing is not None and max(dealing.replicas) > 1:
        raise ScheduleError(f"pipedream-vsync with replicated stages (replicas "
                            f"{','.join(map(str, dealing.replicas))}) is not available: its "
                            f"stages share version numbers, one step per micro-batch, but a "
                            f"replicated stage steps once per round of its replicas; use "
                            f"pipedream or 2bw")
    first = pipedream(p, stream, None)
    used = {a.microbatch: first.versions[(0, i)]
            for i, a in enumerate(first.order[0]) if a.is_compute}

    def first_stage(stage: int, item: int, newest: int) -> int:
        return used[item]

    compute = {s: stage_order(s, p, stream.items) for s in range(p)}
    return assign_versions("pipedream-vsync", p, stream, compute, first_stage, _every_item,
                           {s: p for s in range(p)})
