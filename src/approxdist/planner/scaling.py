"""Seed 001's data-parallel speed-up s(N,b) predicted by the cost model, with a band for what is assumed.

Seed 001 (eq. 1): s(N,b) = t(1,B) / t(N,b) x b/B x N, t(N,b) one forward + backward +
update cycle on N nodes (one rank each) with per-node batch b, B = 256. Here t(N,b) is
`cost.dp_time` (buckets all-reduced in order while backward runs, the all-reduce the
cost model's, e.g. `auto`) of the profile's blocks with their compute scaled to the
hardware and batch asked for:

    compute(b) = profile compute x compute_scale x (b / B)^batch_exponent

on a link whose seconds per message are `alpha` (the link's latency and the software's:
each all-reduce phase pays it, so the tail grows with log2 N) and whose bandwidth is
`--link`'s x `bandwidth_scale`. Two terms beyond `dp_time`:

- **early forward** (seed 001 Sec. 4.3; `cost.early_forward`): small layers' all-reduces
  overtake large ones and the next forward of a layer starts once its weights are
  updated; the step is the steady-state period (`early_forward=True`);
- **synchronisation jitter**: every step waits for the slowest of N ranks. With each
  rank's compute C varying by a share `jitter` of it, the expected slowest exceeds the
  mean by `jitter x C x tail(N)`: tail = sqrt(2 ln N) for Gaussian noise (the expected
  maximum of N normals, asymptotically), H_N - 1 for exponential noise (shifted-
  exponential stragglers: the expected maximum of N exponentials is H_N times their mean,
  one of them H_1; Lee et al., "Speeding up distributed machine learning using codes",
  IEEE Trans. IT 2018). `jitter_s` is the term.

Every input is an `Input` labelled `measured` (from a profile), `calibrated` (fitted to
our benchmarks), `fitted` (to observed speed-ups, `planner.simfit`) or `assumed`, with a
low and a high value; the speed-up's band is the smallest and largest s over the inputs'
bands: s moves one way in each input over its band (checked one at a time by
`sensitivity`), so the two corners that move every input the same way as s are its ends.

A mesh `tp=T,dp=N` (T x N ranks, one per node) is N replicas of the model split over T
ranks each (`cost.tp_time` with the model's `TPLayout`: the split compute, the tp
all-reduces of b samples' activations on the same link, the replicas' all-reduce of a
shard's gradients), and s = t(1,B) / t(mesh,b) x b/B x N: samples per second against one
rank's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from approxdist.errors import ConfigError
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32
from approxdist.planner.cost.dp import DPOptions, dp_time
from approxdist.planner.cost.early_forward import early_forward_period
from approxdist.planner.cost.links import LinkLevel, Network
from approxdist.planner.cost.tensor import TPLayout, TPOptions, tp_time
from approxdist.planner.profile import Profile

SOURCES = ("measured", "calibrated", "fitted", "assumed")
#: the tails of a step's compute noise `jitter_s` knows
TAILS = ("gauss", "exp")


def jitter_s(compute_s: float, share: float, nodes: int, tail: str = "exp") -> float:
    """Expected wait for the slowest of `nodes` ranks whose compute (`compute_s` on
    average) varies by `share` of it: share x compute x sqrt(2 ln N) (Gaussian) or
    x (H_N - 1) (exponential); 0 on one node."""
    if tail not in TAILS:
        raise ConfigError(f"jitter tail {tail!r} is not one of {', '.join(TAILS)}")
    if nodes < 1:
        raise ConfigError(f"nodes = {nodes} must be >= 1")
    factor = math.sqrt(2 * math.log(nodes)) if tail == "gauss" else \
        sum(1.0 / k for k in range(2, nodes + 1))
    return share * compute_s * factor


@dataclass(frozen=True)
class Input:
    """One input of the prediction: its value, band and where it comes from."""

    name: str
    value: float
    low: float
    high: float
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"input {self.name!r} source {self.source!r} is not one of "
                              f"{', '.join(SOURCES)}")
        if not 0 <= self.low <= self.value <= self.high:
            raise ConfigError(f"input {self.name!r}: low {self.low!r} <= value {self.value!r} "
                              f"<= high {self.high!r} must hold, all >= 0")


@dataclass(frozen=True)
class ScalingModel:
    """The profile, the link between nodes and the inputs the prediction takes."""

    profile: Profile
    link: LinkLevel
    compute_scale: Input
    batch_exponent: Input
    bandwidth_scale: Input
    gamma: Input  # seconds per fp32 byte added (the all-reduce's sums)
    alpha: Input | None = None  # seconds per message (None: the link's latency, fixed)
    jitter: Input | None = None  # compute noise, a share of it (None: none)
    early_forward: bool = False
    tail: str = "exp"
    algorithm: str = "auto"
    codec: CodecCost = FP32
    overlap: bool = True
    #: tensor parallelism: the model's split (needed for tp > 1) and its wires
    layout: TPLayout | None = None
    tp_fwd: CodecCost = FP32
    tp_bwd: CodecCost = FP32
    tp_algorithm: str = "auto"

    @property
    def inputs(self) -> tuple[Input, ...]:
        extra = tuple(i for i in (self.alpha, self.jitter) if i is not None)
        return (self.compute_scale, self.batch_exponent, self.bandwidth_scale, self.gamma,
                *extra)

    def with_inputs(self, inputs: dict[str, Input]) -> ScalingModel:
        """This model with the inputs named in `inputs` replaced."""
        unknown = sorted(set(inputs) - {i.name for i in self.inputs})
        if unknown:
            raise ConfigError(f"input {unknown[0]!r} is not one of this model's: "
                              f"{', '.join(i.name for i in self.inputs)}")
        return replace(self, **inputs)  # type: ignore[arg-type]

    def step_s(self, nodes: int, batch: int, values: dict[str, float] | None = None,
               tp: int = 1) -> float:
        """t(N, b) with each input at its value, or as `values` overrides it; N replicas of
        `tp` ranks each."""
        v = {i.name: i.value for i in self.inputs} | (values or {})
        factor = v["compute_scale"] * (batch / self.profile.micro_batch_size) ** \
            v["batch_exponent"]
        blocks = tuple(replace(b, fwd_s=b.fwd_s * factor, bwd_s=b.bwd_s * factor)
                       for b in self.profile.blocks)
        scaled = replace(self.profile, micro_batch_size=batch, blocks=blocks)
        level = replace(self.link, beta_s_per_byte=self.link.beta_s_per_byte /
                        v["bandwidth_scale"], gamma_s_per_byte=v["gamma"],
                        alpha_s=v.get("alpha", self.link.alpha_s))
        options = DPOptions(algorithm=self.algorithm, codec=self.codec, overlap=self.overlap)
        compute = sum(b.fwd_s + b.bwd_s for b in blocks)
        noise = jitter_s(compute, v.get("jitter", 0.0), nodes * tp, self.tail)
        if tp == 1:
            dp = dp_time(scaled, nodes, Network(level), options)
            if not (self.early_forward and self.overlap):
                return dp.step_s + noise
            period = early_forward_period([b.fwd_s for b in blocks], [b.bwd_s for b in blocks],
                                          [(k.blocks, k.end_s - k.start_s) for k in dp.buckets])
            return period + dp.optimizer_s + dp.overhead_s + noise
        if self.layout is None:
            raise ConfigError(f"tp = {tp} needs the model's tensor-parallel layout; give "
                              f"ScalingModel a layout (planner.tp_layout)")
        return tp_time(scaled, self.layout, nodes, Network(level),
                       TPOptions(tp, self.tp_fwd, self.tp_bwd, self.tp_algorithm),
                       options).step_s + noise

    def speedup(self, nodes: int, batch: int, values: dict[str, float] | None = None,
                tp: int = 1) -> float:
        """s(N, b) = t(1, B) / t(N, b) x b / B x N (B: the profile's micro-batch; N
        replicas of `tp` ranks each)."""
        ref = self.profile.micro_batch_size
        return self.step_s(1, ref, values) / self.step_s(nodes, batch, values, tp) \
            * batch / ref * nodes

    def band(self, nodes: int, batch: int, tp: int = 1) -> tuple[float, float]:
        """The smallest and largest s(N, b) over the inputs' bands: the two corners that
        move every input the way s moves with it (`sensitivity`, one input at a time)."""
        one = self.sensitivity(nodes, batch, tp)
        worst = {i.name: i.low if one[i.name][0] <= one[i.name][1] else i.high
                 for i in self.inputs}
        best = {i.name: i.high if one[i.name][0] <= one[i.name][1] else i.low
                for i in self.inputs}
        values = [self.speedup(nodes, batch, worst, tp), self.speedup(nodes, batch, best, tp),
                  self.speedup(nodes, batch, tp=tp), *(x for pair in one.values() for x in pair)]
        return min(values), max(values)

    def sensitivity(self, nodes: int, batch: int, tp: int = 1) -> dict[str, tuple[float, float]]:
        """Per input: s(N, b) at its low and its high, the others at their values."""
        return {i.name: (self.speedup(nodes, batch, {i.name: i.low}, tp),
                         self.speedup(nodes, batch, {i.name: i.high}, tp))
                for i in self.inputs}


def curve(model: ScalingModel, nodes: list[int], batches: list[int],
          shards: list[int] | None = None) -> list[dict[str, float]]:
    """Rows of `nodes` (replicas), `tp` (`shards`, one per entry of `nodes`; default 1),
    `ranks`, `per_node_batch`, `speedup`, `speedup_low`, `speedup_high`."""
    tps = shards if shards is not None else [1] * len(nodes)
    if len(tps) != len(nodes):
        raise ConfigError(f"{len(tps)} tp sizes for {len(nodes)} node counts; give one each")
    rows = []
    for batch in batches:
        for n, tp in zip(nodes, tps):
            low, high = model.band(n, batch, tp)
            rows.append({"nodes": n, "tp": tp, "ranks": n * tp, "per_node_batch": batch,
                         "speedup": model.speedup(n, batch, tp=tp),
                         "speedup_low": low, "speedup_high": high})
    return rows

