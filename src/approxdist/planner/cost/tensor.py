"""Step time of tensor parallelism on a `tp x dp` mesh: split compute, blocking all-reduces (Megatron-LM).

A tensor-parallel plan splits layers inside blocks; `TPLayout` says, per block of the
profile, what share of its compute is split (`split_share`: that work is divided over the
tp ranks, the rest runs whole on each) and which of its parameter tensors are split, and
lists every collective the split layers run per sample (`TPSite`): a row-parallel layer
(`rowwise`, `channel_in`, an attention's output projection) all-reduces its partial
outputs forward (the `tp_fwd` wire), a column-parallel one (`colwise`, `channel_out`, an
attention's fused q, k, v projection) all-reduces its input's gradient backward (the
`tp_bwd` wire) where that input needs one. Megatron's column-row pair therefore costs one
all-reduce of the activation each way, as do attention split by heads and a conv pair
split by channel. (`planner.tp_layout` measures a layout from a model and its plan.)

One shard of a replica runs the profile's blocks at

    compute = profile seconds x (1 - s + s / tp)      (s: the block's split share)

and waits in place for each of its all-reduces (`collectives.allreduce_time` of the
site's values x the micro-batch, on the level joining the tp ranks, with the wire's codec:
its bytes per value from the codec registry and its encode / decode seconds), plus the
tensor engine's own work per collective (`TPOptions.engine_s`, the calibration's
`overhead.RuntimeOverhead.tp_collective_s`: the autograd region, the codec path, the link
layer's call, the hand-off; CPU work, slowed by shared cores as compute is). Those
seconds enter `dp_time` as the blocks' `serial` work, and the replicas (the `dp` axis: tp
ranks apart, Megatron's layout with `tp` innermost) all-reduce their shard's gradients
there, bucketed and overlapped with backward as data parallelism does. The job keeps every
one of its tp x dp ranks busy: that sets the shared cores' load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from approxdist.errors import ConfigError
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32, allreduce_steps, allreduce_time, fastest
from approxdist.planner.cost.dp import DPOptions, DPTime, dp_time
from approxdist.planner.cost.links import LinkLevel, Network
from approxdist.planner.profile import Profile

DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class TPSite:
    """One all-reduce a split layer runs per step: its block, layer path, direction
    (`fwd`: partial outputs; `bwd`: an input's gradient) and fp32 values per sample."""

    block: int
    layer: str
    direction: str
    values: int

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"tp site {self.layer!r} direction = {self.direction!r} must be "
                              f"one of {', '.join(DIRECTIONS)}")
        if isinstance(self.values, bool) or not isinstance(self.values, int) or self.values < 1:
            raise ConfigError(f"tp site {self.layer!r} values = {self.values!r} must be an "
                              f"integer >= 1 per sample")


@dataclass(frozen=True)
class TPBlock:
    """One block: the share of its compute the plan splits, and each parameter tensor's
    bytes (registration order) with whether the plan splits it."""

    split_share: float
    params: tuple[tuple[int, bool], ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.split_share, (int, float)) and 0 <= self.split_share <= 1):
            raise ConfigError(f"split_share = {self.split_share!r} must be a share in [0, 1]")

    def factor(self, tp: int) -> float:
        """Seconds of one shard per second of the whole block: 1 - s + s / tp."""
        return 1.0 - self.split_share + self.split_share / tp

    def shard_sizes(self, tp: int) -> tuple[int, ...]:
        """Bytes of each parameter tensor one shard holds."""
        return tuple(size // tp if split else size for size, split in self.params)


@dataclass(frozen=True)
class TPLayout:
    """A model's tensor-parallel split under one plan: per block its split share and
    parameters, every collective per sample, and the tp sizes the plan cannot split
    (`refused`: size -> why, one line naming the layer)."""

    model: str
    plan: tuple[tuple[str, str], ...]
    blocks: tuple[TPBlock, ...]
    sites: tuple[TPSite, ...]
    refused: tuple[tuple[int, str], ...] = ()

    def check(self, tp: int, profile: Profile | None = None) -> None:
        """`ConfigError` (one line) if `tp` cannot split this plan or `profile` is of
        another model or block count."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tp = {tp!r} must be an integer >= 1 ranks per layer")
        why = dict(self.refused).get(tp)
        if why is not None:
            raise ConfigError(why)
        if profile is not None and len(profile.blocks) != len(self.blocks):
            raise ConfigError(f"the tp layout of {self.model!r} has {len(self.blocks)} blocks "
                              f"but profile {profile.model!r} has {len(profile.blocks)}; "
                              f"profile the model the layout was measured on")

    def sites_of(self, block: int) -> tuple[TPSite, ...]:
        return tuple(s for s in self.sites if s.block == block)


@dataclass(frozen=True)
class TPOptions:
    """The tp axis: its size, the wires' codecs, the collectives' algorithm (`tp.algorithm`)
    and the engine's CPU seconds per collective on one rank (`engine_s`, before core
    sharing; `RuntimeOverhead.tp_collective_s`)."""

    tp: int
    fwd_codec: CodecCost = FP32
    bwd_codec: CodecCost = FP32
    algorithm: str = "auto"
    segment_bytes: int | None = None
    engine_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.engine_s, bool) or not isinstance(self.engine_s, (int, float)) \
                or not math.isfinite(self.engine_s) or self.engine_s < 0:
            raise ConfigError(f"tp engine_s = {self.engine_s!r} must be a finite number of "
                              f"seconds >= 0 per collective (the calibration's "
                              f"tp_collective_s)")

    def codec(self, direction: str) -> CodecCost:
        return self.fwd_codec if direction == "fwd" else self.bwd_codec


@dataclass(frozen=True)
class SiteCost:
    """One collective at one micro-batch: the algorithm run, its seconds, the bytes one
    rank sends on its critical path (the codec's payload per message) and the engine's own
    seconds around it (`engine_s`, at the job's load)."""

    site: TPSite
    values: int
    algorithm: str
    seconds: float
    wire_bytes: int
    engine_s: float = 0.0

    @property
    def total_s(self) -> float:
        """What the shard waits in place: the all-reduce and the engine's work."""
        return self.seconds + self.engine_s


@dataclass(frozen=True)
class TPTime:
    """Predicted seconds of one step of a tp x dp mesh and where they go."""

    tp: int
    dp: DPTime
    compute_s: float  # one shard's forward + backward, at the job's load
    collective_s: dict[str, float]  # per direction, seconds of the tp all-reduces per step
    collectives: int  # tp all-reduces per step
    wire_bytes: dict[str, int]  # per direction, bytes one rank sends on the tp wires per step
    engine_s: float = 0.0  # the engine's own work around the tp collectives per step

    @property
    def step_s(self) -> float:
        return self.dp.step_s

    @property
    def samples_per_step(self) -> int:
        return self.dp.samples_per_step


def site_costs(layout: TPLayout, micro_batch: int, options: TPOptions, level: LinkLevel,
               busy: int, load: float = 1.0) -> list[SiteCost]:
    """Every collective of a micro-batch of `micro_batch` samples on the tp ranks' `level`
    (`busy`: the ranks sharing its cores; `load`: their compute's slow-down, which the
    engine's work per collective takes too)."""
    out = []
    for site in layout.sites:
        values, codec = site.values * micro_batch, options.codec(site.direction)
        name = options.algorithm
        if name == "auto":
            name = fastest(level, options.tp, values, codec, options.segment_bytes, busy)[0]
        seconds = allreduce_time(level, name, options.tp, values, codec, options.segment_bytes,
                                 busy)
        sent = sum(s.wire_bytes for s in allreduce_steps(name, options.tp, values, codec,
                                                          options.segment_bytes))
        out.append(SiteCost(site, values, name, seconds, sent, load * options.engine_s))
    return out


def shard_profile(profile: Profile, layout: TPLayout, tp: int) -> Profile:
    """The profile of one shard: each block's seconds and stash x (1 - s + s / tp), its
    split parameter tensors / tp (the output and its bytes stay whole)."""
    layout.check(tp, profile)
    blocks = []
    for b, t in zip(profile.blocks, layout.blocks):
        sizes = t.shard_sizes(tp) if t.params else b.param_sizes
        whole = sum(size for size, _ in t.params)
        if t.params and whole != b.param_bytes:
            raise ConfigError(f"block {b.name!r} holds {b.param_bytes} parameter bytes in the "
                              f"profile but {whole} in the tp layout; profile the model with "
                              f"the options the layout was measured with")
        k = t.factor(tp)
        blocks.append(replace(b.scaled(k), stash_bytes=math.ceil(b.stash_bytes * k),
                              param_bytes=sum(sizes), param_sizes=tuple(sizes)))
    return replace(profile, blocks=tuple(blocks))


def tp_time(profile: Profile, layout: TPLayout, replicas: int, network: Network,
            options: TPOptions, dp: DPOptions | None = None) -> TPTime:
    """One step of `replicas` data-parallel replicas of a model split over `options.tp`
    ranks each (ranks replica-major, shards consecutive), each replica on one profile
    micro-batch."""
    tp = options.tp
    shard = shard_profile(profile, layout, tp)
    world = tp * replicas
    busy = network.busy(world)
    load = network.compute_load(world)
    costs = site_costs(layout, profile.micro_batch_size, options, network.level(range(tp)), busy,
                       load)
    serial = [(sum(c.total_s for c in costs if c.site.block == i and c.site.direction == "fwd"),
               sum(c.total_s for c in costs if c.site.block == i and c.site.direction == "bwd"))
              for i in range(len(shard.blocks))]
    timed = dp_time(shard, replicas, network, dp, group=range(0, world, tp), world=world,
                    serial=serial)
    return TPTime(tp, timed, load * sum(b.compute_s for b in shard.blocks),
                  {d: sum(c.seconds for c in costs if c.site.direction == d) for d in DIRECTIONS},
                  len(costs),
                  {d: sum(c.wire_bytes for c in costs if c.site.direction == d)
                   for d in DIRECTIONS},
                  sum(c.engine_s for c in costs))
