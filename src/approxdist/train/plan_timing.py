"""Time the steps of several plans on the same ranks, through the engines `train` runs.

    run_on_ranks(time_plans, world_size, [TimedPlan("dp", sections), ...], StepTiming())

Each plan is a set of config sections (a model, its data, and a plan file's layer:
`train/plan_layer.py`), so what is timed is what `approxdist train --plan FILE` would
step: the engine of its mode (`build.engine_for`), its groups, codecs, link and
optimiser, fed one fixed batch of this rank's share (no data loading, no evaluation).
Every plan is built first; then each round runs `steps` steps of every plan in turn,
alternating the order between rounds, between barriers (interleaved: load that drifts
during the run falls on every plan alike). The result, on every rank, is the seconds per
step of each round, per plan. `probe_plans` also calls a probe on every rank in each
round, in turn with the plans, and keeps rank 0's results (`plan validate` profiles the
model there, alone and under load, so the profile sees the same drift as the steps it
predicts).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from approxdist.bench.timing import interleave, repeat
from approxdist.config.loader import build_config
from approxdist.data import ShardedBatches, TensorDataset, load_dataset
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.train.build import engine_for
from approxdist.train.check import check_parts
from approxdist.train.engine import Engine
from approxdist.train.optim import set_lr

#: the probe's turn in the rounds (a plan may not use this key)
PROBE = "(probe)"


@dataclass(frozen=True)
class TimedPlan:
    """One plan to time: a key and the config sections of its run."""

    key: str
    sections: dict[str, dict[str, Any]] = field(hash=False)


@dataclass(frozen=True)
class StepTiming:
    """`rounds` rounds of `steps` steps per plan, after `warmup` steps each."""

    rounds: int = 3
    steps: int = 3
    warmup: int = 2
    threads: int = 1  # torch threads per rank
    lr: float = 0.01

    def __post_init__(self) -> None:
        for name in ("rounds", "steps", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} = {value!r} must be an integer >= 1")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup = {self.warmup!r} must be an integer >= 0")


def _stepper(engine: Engine, data: TensorDataset, cfg_batch: int, seed: int, dev: torch.device,
             lr: float) -> Any:
    index, count = engine.shard
    batches = ShardedBatches(data, cfg_batch, index, count, seed, False)
    x, y = next(iter(batches.epoch(0)))
    xs = x.to(dev) if engine.feeds_inputs else None
    ys = y.to(dev) if engine.feeds_labels else None
    for opt in engine.optimizers:
        set_lr(opt, lr)

    def step() -> None:
        engine.train_step(xs, ys, batches.local_batch)

    return step


def time_plans(ctx: DistContext, plans: list[TimedPlan], timing: StepTiming
               ) -> dict[str, list[float]]:
    """Seconds per step of each round, per plan key (run on every rank)."""
    return probe_plans(ctx, plans, timing)[0]


def probe_plans(ctx: DistContext, plans: list[TimedPlan], timing: StepTiming,
                probe: Callable[[DistContext], Any] | None = None
                ) -> tuple[dict[str, list[float]], list[Any]]:
    """`time_plans`, and `probe(ctx)` called on every rank once per round, in turn with the
    plans, between barriers (what it measures then sees the machine the plans ran on,
    drift included): (seconds per step of each round per plan key, what the probe returned
    on rank 0 each round; empty on other ranks and without a probe)."""
    torch.set_num_threads(timing.threads)
    datasets: dict[str, TensorDataset] = {}
    engines: list[Engine] = []
    steps: dict[str, Callable[[], None]] = {}
    probed: list[Any] = []
    try:
        for plan in plans:
            if plan.key == PROBE:
                raise ConfigError(f"plan key {PROBE!r} is the probe's; give the plan another")
            cfg = build_config(plan.sections)
            if cfg.train.world_size != ctx.world_size:
                raise ConfigError(f"plan {plan.key!r} is for {cfg.train.world_size} rank(s), "
                                  f"not the {ctx.world_size} it was started on")
            check_parts(cfg)
            key = json.dumps(plan.sections.get("data", {}), sort_keys=True)
            data = datasets.setdefault(key, load_dataset(cfg.data))
            torch.manual_seed(cfg.train.seed)
            engine, _ = engine_for(cfg, ctx, data)
            engine.start()
            engines.append(engine)
            steps[plan.key] = _stepper(engine, data, cfg.data.batch_size, cfg.train.seed,
                                       ctx.device, timing.lr)

        for step in steps.values():
            repeat(step, timing.warmup)()
            dist.barrier()
        ops = {k: repeat(s, timing.steps) for k, s in steps.items()}
        if probe is not None:
            def take() -> None:
                got = probe(ctx)
                if ctx.rank == 0:
                    probed.append(got)

            ops[PROBE] = take
        rounds = interleave(ops, timing.rounds, alternate=True, sync=dist.barrier)
    finally:
        for engine in engines:
            engine.close()
    return ({k: [t / timing.steps for t in ts] for k, ts in rounds.items() if k in steps},
            probed)
