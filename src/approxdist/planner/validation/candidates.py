"""The plans `plan validate` measures in one setting, each with who would choose it (pure).

For one model on one cluster the candidates are: our planner's `keep` best plans (its
first is *the chosen plan*), data parallelism, the split torchgpipe's balance-by-time
would use (a straight pipeline of one stage per rank, blocks balanced by forward +
backward time, GPipe) and PipeDream's optimizer's plan (its own objective, transfers
ignored as by default). torchgpipe and PipeDream choose a split, not a micro-batch count
(torchgpipe's `chunks` and PipeDream's in-flight count are set by the user): for their
splits we take the schedule and micro-batch count our simulation ranks best, so the
comparison is between the splits. Plans chosen by several are measured once, with every
chooser named. In a tensor-parallel setting (`tensor_candidates`) the candidates are
every tp x dp mesh of the world the model's plan can split, and data parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from approxdist.errors import ConfigError
from approxdist.pipeline.partition import balance_costs
from approxdist.planner.choice import label
from approxdist.planner.cost.pipeline import PipelinePlan, Stage
from approxdist.planner.objective import SolverSettings
from approxdist.planner.pipedream_optimizer import Level, PipeDreamSettings
from approxdist.planner.profile import Profile
from approxdist.planner.search import (
    RankedPlan,
    TensorSpace,
    data_parallel,
    pipedream,
    search,
    simulated,
    tensor_plan,
)

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Candidate:
    """A plan, its prediction, and who chooses it (`ours`, `ours-2`, ..., `dp`,
    `torchgpipe`, `pipedream`)."""

    ranked: RankedPlan
    choosers: tuple[str, ...]

    @property
    def key(self) -> tuple[object, ...]:
        return self.ranked.key

    def describe(self) -> str:
        return label(self.ranked)


def candidates(profile: Profile, base: SolverSettings, microbatches: tuple[int, ...],
               levels: tuple[Level, ...], keep: int = 3) -> list[Candidate]:
    """Our `keep` best plans, data parallelism, torchgpipe's and PipeDream's splits."""
    if keep < 1:
        raise ConfigError(f"keep = {keep!r} must be >= 1 (our chosen plan is always measured)")
    ranked = search(profile, base, SCHEDULES, microbatches)
    picks: list[tuple[str, RankedPlan]] = [
        ("ours" if i == 0 else f"ours-{i + 1}", r) for i, r in enumerate(ranked[:keep])]
    picks += [("dp", r) for r in ranked if r.kind.axes <= {"dp"}][:1]
    gpipe = torchgpipe(profile, base, microbatches)
    if gpipe is not None:
        picks.append(("torchgpipe", gpipe))
    settings = PipeDreamSettings(levels)
    picks.append(("pipedream", pipedream(profile, base, settings, SCHEDULES, microbatches)[1][0]))
    merged: dict[tuple[object, ...], Candidate] = {}
    for who, r in picks:
        k = r.key
        merged[k] = Candidate(r, (*merged[k].choosers, who)) if k in merged \
            else Candidate(r, (who,))
    return list(merged.values())


def tensor_candidates(profile: Profile, base: SolverSettings, tensor: TensorSpace
                      ) -> list[Candidate]:
    """Every tp x dp mesh of `tensor` and data parallelism, our fastest named `ours`."""
    ranked = search(profile, replace(base, stages=1), SCHEDULES, (1,), tensor)
    return [Candidate(r, ("ours",) if i == 0 else (r.mode,)) for i, r in enumerate(ranked)]


def repriced(c: Candidate, profile: Profile, base: SolverSettings,
             tensor: TensorSpace | None = None) -> Candidate:
    """`c`'s plan (same stages, schedule, micro-batches, tp, choosers) priced again on
    another `profile` of the same model, e.g. one taken while the plan was being timed
    (`tensor`: the layout a tensor plan was priced with)."""
    r = c.ranked
    if r.tp > 1:
        if tensor is None:
            raise ConfigError(f"plan {c.describe()} splits layers: reprice it with its "
                              f"TensorSpace")
        again = tensor_plan(profile, tensor, replace(base, memory_bytes=None), r.tp)
        assert again is not None  # without a memory limit every shard fits
    elif not r.kind.scheduled:
        again = data_parallel(profile, replace(base, memory_bytes=None))
        assert again is not None  # without a memory limit data parallelism always fits
    else:
        again = simulated(profile, replace(base, schedule=r.plan.schedule,
                                           microbatches=r.plan.microbatches), r.plan.stages)
    return Candidate(again, c.choosers)


def torchgpipe(profile: Profile, base: SolverSettings,
               microbatches: tuple[int, ...]) -> RankedPlan | None:
    """torchgpipe's `balance_by_time`: one stage per rank, blocks balanced by forward +
    backward time (an exact minimax split), GPipe, at the micro-batch count our simulation
    prices best; None when there are fewer blocks than ranks."""
    n = base.world_size
    if n < 2 or len(profile.blocks) < n:
        return None
    split = balance_costs([b.fwd_s + b.bwd_s for b in profile.blocks], n)
    stages = tuple(Stage(first, end) for first, end in split.ranges)
    priced = [simulated(profile, replace(base, schedule="gpipe", microbatches=m), stages)
              for m in microbatches]
    return min(priced, key=lambda r: r.per_sample_s)


def busy_ranks(plan: PipelinePlan, profile: Profile) -> float:
    """How many of the plan's ranks compute at once, in effect: the participation ratio
    (sum c)^2 / sum c^2 of each rank's compute per step c (a replica of stage s runs
    ceil(M / r_s) of the M micro-batches, each the stage's forward + backward). N ranks
    of equal compute (data parallelism, a balanced pipeline) give N; two heavy stages and
    two replicas of a light one about 2."""
    shares = []
    for st in plan.stages:
        work = sum(b.fwd_s + b.bwd_s for b in profile.blocks[st.first:st.end])
        shares += [math.ceil(plan.microbatches / st.replicas) * work] * st.replicas
    total, squares = sum(shares), sum(c * c for c in shares)
    return total * total / squares if squares > 0 else float(len(shares))


def between(busy: float, count: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """The whole numbers of busy ranks around `busy` (1 .. `count`) and their weights
    (linear)."""
    at = min(max(busy, 1.0), float(count))
    lo = min(int(at), count - 1) if count > 1 else 1
    hi = min(lo + 1, count)
    w_hi = at - lo if hi != lo else 0.0
    return (lo, 1.0 - w_hi), (hi, w_hi)


def at_load(c: Candidate, profiles: tuple[Profile, ...], factors: tuple[float, ...],
            base: SolverSettings, tensor: TensorSpace | None = None
            ) -> tuple[float, float, float]:
    """(step seconds, busy ranks, load factor) of `c` priced on `profiles` (the profile
    with 1 .. N ranks computing, `factors` their load factors: `by_busy`'s) between the
    two whole numbers of busy ranks around its own (`busy_ranks`, every tp shard busy)."""
    busy = busy_ranks(c.ranked.plan, profiles[0]) * c.ranked.tp
    weights = [(k, w) for k, w in between(busy, len(profiles)) if w > 0]
    step = sum(w * repriced(c, profiles[k - 1], base, tensor).ranked.step_s
               for k, w in weights)
    return step, busy, sum(w * factors[k - 1] for k, w in weights)
