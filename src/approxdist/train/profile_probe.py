"""The profile `plan validate` takes while it times a setting's plans: alone and under load.

In each timed round (`train.plan_timing.probe_plans`, in turn with the plans) rank 0
profiles the model alone (`profile_built`, the other ranks waiting at a barrier) and takes
the CPU seconds of a whole pass (`pipeline.profiler.pass_cpu_s`); then every rank runs
whole passes at once, as the setting's N ranks share the cores during its steps, and
each takes the CPU seconds of its passes; their mean over the ranks is the loaded pass
(3 ranks on 2 cores: one may hold a core alone while two share the other, so no single
rank speaks for the load; rank 0's own read x1.01 in a run where the ranks' steps ran
15 % slower than in the run before). Each measurement is at least `load_repeat` passes
and `load_min_s` CPU seconds of them (a pass of the held-out shared MLP is 2 ms). The
ratio loaded / alone, the *load factor*, is what the same work costs more in CPU when N
processes share this machine's cores (each evicting the others' caches, all sharing the
memory bus); it is measured, not fitted: no step of a plan is timed for it. Each round's
profile is scaled by its own factor and the rounds join by median per block
(`under_load`); the setting's plans are priced on that.

Not every plan keeps its N ranks computing: a pipeline whose last stage is light, dealt
to two replicas, has two ranks computing and two mostly waiting for messages, and its
compute costs what it costs with two busy processes, not four (mlp-wide on 4 ranks:
its two heavy stages' CPU per micro-batch 1.04-1.08x alone where all four ranks
computing cost 1.19x). So the probe also takes the loaded pass with k = 2 .. N-1 ranks
computing and the rest waiting (`ProbeRound.factors`: the factor for 1 .. N busy ranks,
1 alone), and `by_busy` joins the rounds per k; `plan validate` prices each plan between
the two profiles around its effective number of busy ranks
(`planner.validation.candidates.busy_ranks`).

Measured here (`plan validate`, 2026-11-27, one thread per rank, 2 cores; two runs):
resnet20 at micro-batch 16 x0.98-1.01 on 2 ranks, x1.04-1.07 on 3 (2 of them computing:
x1.02-1.03) and x1.09-1.12 on 4 (2: x1.02-1.05, 3: x1.06-1.09); mlp-wide at 32
x1.04-1.06, x1.12-1.14 (x1.05-1.07) and x1.16-1.25 (x1.04-1.08, x1.11-1.15)
(docs/planner.md).

Before the rounds, `probe_before` takes the same probe `rounds` times on the ranks
before any plan is built or stepped: the *ex-ante* profile and load factors, what a
user's run could measure at plan time (the machine now, with the run's N processes),
which `plan validate` chooses and prices its plans on. `drift` compares its passes alone
with the rounds' (how much the machine's speed moved between the two; reported beside
the figures, never used to price a plan).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from approxdist.config.schema import DataConfig, ModelConfig
from approxdist.errors import ConfigError, DataError
from approxdist.launch.context import DistContext
from approxdist.pipeline.profiler import REPEAT, pass_cpu_s
from approxdist.planner.profile import Profile, median_profile, scale_times
from approxdist.planner.profiler import model_and_sample, profile_built

#: probes taken before the timed rounds or a plan (`probe_before`): three moments of a
#: machine whose speed drifts, 12 timed pairs at 4 passes each against one profile's 9
ANTE_ROUNDS = 3


@dataclass(frozen=True)
class ProbeRound:
    """One round's profile (alone) and CPU seconds per whole pass, alone, loaded (every
    rank computing) and with 2 .. N-1 ranks computing (`partial_s`)."""

    profile: Profile
    alone_s: float
    loaded_s: float
    partial_s: tuple[float, ...] = ()

    @property
    def load_factor(self) -> float:
        return self.loaded_s / self.alone_s

    @property
    def factors(self) -> tuple[float, ...]:
        """The load factor with 1, 2, .. N ranks computing (1.0 alone)."""
        return (1.0, *(p / self.alone_s for p in self.partial_s), self.load_factor)


@dataclass(frozen=True)
class ProfileProbe:
    """A round's probe of one model (picklable: `probe_plans` calls it on every rank):
    `loaded_s` of its round is the mean over the ranks of their CPU seconds per pass."""

    model: ModelConfig
    data: DataConfig
    micro_batch_size: int
    threads: int | None = None
    repeat: int = REPEAT
    fuse_accumulation: str = "auto"
    load_repeat: int = 2 * REPEAT
    load_min_s: float = 0.25

    def __call__(self, ctx: DistContext) -> ProbeRound | None:
        """On rank 0 the round's `ProbeRound`; None on the others (they make the load)."""
        model, sample = model_and_sample(self.model, self.data, self.micro_batch_size)
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads or before)
        try:
            if ctx.rank == 0:
                profile = profile_built(model, sample, self.model, self.data, self.threads,
                                        self.repeat, self.fuse_accumulation)
                alone = pass_cpu_s(model, sample, self.load_repeat, min_s=self.load_min_s)
            loaded = [self._loaded(ctx, model, sample, busy)
                      for busy in (ctx.world_size, *range(2, ctx.world_size))]
        finally:
            torch.set_num_threads(before)
        if ctx.rank != 0:
            return None
        return ProbeRound(profile, alone, loaded[0], tuple(loaded[1:]))

    def _loaded(self, ctx: DistContext, model: torch.nn.Module, sample: torch.Tensor,
                busy: int) -> float:
        """Mean CPU seconds per pass over ranks 0 .. busy-1 running passes at once (the
        others wait in the gather)."""
        dist.barrier()
        mine = pass_cpu_s(model, sample, self.load_repeat, min_s=self.load_min_s) \
            if ctx.rank < busy else None
        every: list[float | None] = [None] * ctx.world_size
        dist.all_gather_object(every, mine)
        got = [float(v) for v in every if v is not None]
        return sum(got) / len(got)


def probe_before(ctx: DistContext, probe: ProfileProbe, rounds: int) -> list[ProbeRound]:
    """`rounds` probes on every rank, between barriers, before anything else runs: rank
    0's `ProbeRound`s (empty on the other ranks)."""
    if rounds < 1:
        raise ConfigError(f"ex-ante probe rounds = {rounds!r} must be >= 1")
    got = []
    for _ in range(rounds):
        dist.barrier()
        taken = probe(ctx)
        if taken is not None:
            got.append(taken)
    return got


def drift(before: Sequence[ProbeRound], during: Sequence[ProbeRound]) -> float:
    """The median CPU seconds of a pass alone `during` the timed rounds over `before`
    them: > 1 where the machine slowed down after the ex-ante probe."""
    if not before or not during:
        raise DataError("the machine's drift needs probe rounds before and during the "
                        "timed rounds")
    return statistics.median(r.alone_s for r in during) / \
        statistics.median(r.alone_s for r in before)


def under_load(rounds: Sequence[ProbeRound]) -> tuple[Profile, float]:
    """Each round's profile times its own load factor (taken in the same seconds: a pass
    that ran slow alone read a slow profile too, and its lower factor makes up for it),
    joined by the median per block; and the rounds' median load factor (every rank
    computing: `by_busy`'s last)."""
    profiles, factors = by_busy(rounds)
    return profiles[-1], factors[-1]


def by_busy(rounds: Sequence[ProbeRound]) -> tuple[tuple[Profile, ...], tuple[float, ...]]:
    """`under_load` for 1, 2, .. N ranks computing: the profile and median load factor of
    each (the first: alone)."""
    if not rounds:
        raise DataError("joining probe rounds needs at least one probe round")
    counts = {len(r.factors) for r in rounds}
    if len(counts) > 1:
        raise DataError(f"probe rounds of different world sizes ({sorted(counts)} factors): "
                        "join the rounds of one setting")
    width = counts.pop()
    return (tuple(median_profile([scale_times(r.profile, r.factors[k]) for r in rounds])
                  for k in range(width)),
            tuple(statistics.median(r.factors[k] for r in rounds) for k in range(width)))
