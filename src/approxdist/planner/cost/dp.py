"""Step time of data parallelism: bucketed gradient all-reduces overlapped with backward (seed 001).

Each of N replicas runs the whole model on one profile micro-batch. Gradients are
bucketed as `DataParallel` buckets them (`data_parallel.buckets.plan_buckets` with its
default sizes: 1 MiB buckets, a 0.25 MiB first bucket, parameters of 1 MiB or more alone),
tensor by tensor where the profile lists each block's parameter tensors (`param_sizes`;
a profile that does not, as PipeDream's, has each block stand for one parameter).
Backward runs the blocks last to first; bucket k is ready when the backward of the
earliest block it holds a tensor of has ended, at r_k. Its
all-reduce (`collectives.allreduce_time` on the level joining the N ranks) starts when it
is ready and the previous bucket's has finished (one communication stream, buckets in
order, as the reducer launches them):

    s_k = max(r_k, e_{k-1}),   e_k = s_k + T_allreduce(bucket k)
    step = F + max(B, e_last) + optimizer

with F and B the summed forward and backward seconds. The exposed communication is
max(B, e_last) - B: what the backward did not hide. Without overlap every bucket is ready
at B. The optimizer step is a given number of seconds, and the engine's own work per
step (`DPOptions.step_overhead_s`, `overhead.RuntimeOverhead.dp_step_s`, measured on a tiny
model) is added like compute; its work per gradient byte (`byte_overhead_s`: copies into
and out of the bucket, averaging) lengthens each bucket's all-reduce.

With two or more communication threads (`DataParallel`'s default is 2) a bucket's
all-reduce is its CPU work w_k (the alpha, beta, gamma, coding and per-byte terms), then
its wait on an emulated link l_k; the next bucket's CPU work runs on another thread
during that wait, while the link carries one bucket at a time:

    u_k = max(r_k, u_{k-1}) + w_k,   e_k = max(u_k, e_{k-1}) + l_k

(u_k: when its CPU work ends; with one thread, or no emulated link, this is the single
stream above).

Where the ranks leave no core free (a `loopback` level whose busy ranks are at least its
cores) the all-reduce's CPU work (its alpha, beta, gamma and coding terms; an emulated
link's wait is not CPU work) cannot hide under backward: it takes the rank's core from
the backward, so bucket k is ready only after the backward *and* the CPU work of the
buckets before it, c_<k, and the backward ends at B + the CPU work of every bucket:

    r_k -> r_k + c_<k,   step = F + max(B + c_all, e_last) + optimizer

The replicas may be a sub-group of a larger job (`group`: their ranks, `world`: every rank
the job keeps busy, which sets the shared cores' load), and a block may wait in place for
a collective of its own (`serial`: per block, forward and backward seconds already at the
job's load, e.g. a tensor-parallel layer's all-reduces, `cost.tensor`), added to its
compute after the load stretches that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from approxdist.config.dp import DPConfig
from approxdist.data_parallel.buckets import BucketPlan, ParamInfo, plan_buckets
from approxdist.errors import ConfigError
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32, allreduce_time, fastest
from approxdist.planner.cost.links import Network
from approxdist.planner.profile import Profile

MB = 1 << 20  # as DataParallel counts bucket_mb
#: `DataParallel`'s solo_mb default (not a `DPConfig` field); a unit test keeps them equal
SOLO_MB = 1.0


@dataclass(frozen=True)
class DPOptions:
    """How the gradients travel: algorithm, codec and the `DataParallel` bucket sizes."""

    algorithm: str = DPConfig.algorithm
    codec: CodecCost = FP32
    bucket_mb: float = DPConfig.bucket_mb
    first_bucket_mb: float = DPConfig.first_bucket_mb
    solo_mb: float = SOLO_MB
    overlap: bool = DPConfig.overlap
    optimizer_s: float = 0.0
    segment_bytes: int | None = None  # None: each algorithm's own
    threads: int = DPConfig.threads  # communication threads (`--threads`)
    step_overhead_s: float = 0.0  # the engine's CPU work per step (before core sharing)
    byte_overhead_s: float = 0.0  # ... per gradient byte, with each bucket's all-reduce

    def __post_init__(self) -> None:
        for key in ("bucket_mb", "first_bucket_mb", "solo_mb", "optimizer_s",
                    "step_overhead_s", "byte_overhead_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"data-parallel {key} = {value!r} must be a finite number "
                                  f">= 0")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) \
                or self.threads < 1:
            raise ConfigError(f"data-parallel threads = {self.threads!r} must be an integer "
                              f">= 1")


@dataclass(frozen=True)
class BucketTime:
    """One bucket: its blocks, fp32 bytes, algorithm, and when it was ready, started, ended
    (seconds from the start of backward)."""

    index: int
    blocks: tuple[int, ...]
    fp32_bytes: int
    algorithm: str
    ready_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class DPTime:
    """Predicted seconds of one data-parallel step and where they go."""

    world_size: int
    forward_s: float
    backward_s: float
    comm_s: float  # all-reduce seconds, summed over buckets
    exposed_comm_s: float  # the part backward did not hide
    optimizer_s: float
    step_s: float
    samples_per_step: int
    buckets: tuple[BucketTime, ...] = field(default=())
    overhead_s: float = 0.0  # the engine's per-step work, after core sharing

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_s if self.step_s > 0 else math.inf


def dp_time(profile: Profile, world_size: int, network: Network,
            options: DPOptions | None = None, *, group: Sequence[int] | None = None,
            world: int | None = None,
            serial: Sequence[tuple[float, float]] | None = None) -> DPTime:
    """The step time of `world_size` data-parallel replicas of `profile` on `network`
    (`group`: their ranks, default 0 .. world_size - 1; `world`: the ranks the job keeps
    busy, default world_size; `serial`: per block, forward and backward seconds it waits
    in place, at the job's load)."""
    opts = options or DPOptions()
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"data-parallel world_size = {world_size!r} must be an integer >= 1")
    blocks = profile.blocks
    waits = list(serial) if serial is not None else [(0.0, 0.0)] * len(blocks)
    if len(waits) != len(blocks):
        raise ConfigError(f"serial seconds for {len(waits)} block(s), but profile "
                          f"{profile.model!r} has {len(blocks)}; give one pair per block")
    jobs = world_size if world is None else world
    shared = network.compute_load(jobs)  # every rank computes at once
    forward = shared * sum(b.fwd_s for b in blocks) + sum(w[0] for w in waits)
    # backward ends block i's gradient after the blocks behind it: sum over j >= i
    done = [shared * sum(b.bwd_s for b in blocks[i:]) + sum(w[1] for w in waits[i:])
            for i in range(len(blocks))]
    backward = done[0] if blocks else 0.0
    level = network.level(range(world_size) if group is None else group)
    busy = network.busy(jobs)
    # no free core: the all-reduce's CPU work (not an emulated link's wait) cannot overlap
    no_core = level.cores is not None and busy >= level.cores
    machine = replace(level, link_alpha_s=0.0, link_beta_s_per_byte=0.0)
    end = cpu_end = cpu = 0.0
    out = []
    for plan, owners in _buckets(profile, opts):
        values = plan.numel
        name = opts.algorithm
        if name == "auto":
            name = fastest(level, world_size, values, opts.codec, opts.segment_bytes, busy)[0]
        own = shared * opts.byte_overhead_s * 4 * values  # the engine's passes over it
        took = own + allreduce_time(level, name, world_size, values, opts.codec,
                                    opts.segment_bytes, busy)
        work = own + allreduce_time(machine, name, world_size, values, opts.codec,
                                    opts.segment_bytes, busy)  # its CPU part
        ready = (done[min(owners)] if opts.overlap else backward) + cpu
        if opts.threads > 1:  # CPU work, then the link's wait; the next bucket's CPU work
            start = max(ready, cpu_end)  # runs on another thread during this wait
            cpu_end = start + work
            end = max(cpu_end, end) + (took - work)
        else:
            start = max(ready, end)
            end = start + took
        if no_core:
            cpu += work
        out.append(BucketTime(plan.index, owners, 4 * values, name, ready, start, end))
    finish = max(backward + cpu, end)
    comm = sum(b.end_s - b.start_s for b in out)
    overhead = shared * opts.step_overhead_s
    return DPTime(world_size, forward, backward, comm, finish - backward, opts.optimizer_s,
                  forward + finish + opts.optimizer_s + overhead,
                  world_size * profile.micro_batch_size, tuple(out), overhead)


def _buckets(profile: Profile, opts: DPOptions) -> list[tuple[BucketPlan, tuple[int, ...]]]:
    """`plan_buckets` over the parameter tensors of the blocks (each block's `param_sizes`,
    or the block as one parameter where the profile does not list them), and the blocks
    each bucket holds tensors of, in order."""
    params: list[ParamInfo] = []
    owner: list[int] = []
    for i, b in enumerate(profile.blocks):
        for size in b.param_sizes or ((b.param_bytes,) if b.param_bytes > 0 else ()):
            if size > 0:
                params.append(ParamInfo(f"{b.name}[{len(params)}]", -(-size // 4),
                                        opts.codec.spec, len(params)))
                owner.append(i)
    plans = plan_buckets(params, int(opts.bucket_mb * MB), int(opts.first_bucket_mb * MB),
                         int(opts.solo_mb * MB))
    return [(plan, tuple(sorted({owner[j] for j in plan.positions}))) for plan in plans]
