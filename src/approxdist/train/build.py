"""Assemble this rank's trainer: mesh and groups, data, the mode's engine, batches, resume.

    trainer = build_trainer(cfg, ctx, run_dir, resume=False)   # collective: every rank
    summary = trainer.run()

The run's mesh comes from its mode's record (`train/mode.py`, `mesh_of`); the groups its
engine needs are made once here (`topology.make_groups`) and handed to the engine the
record names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from approxdist.adaptive.candidates import candidate_rules
from approxdist.config.adaprec import candidates_of
from approxdist.config.schema import Config
from approxdist.config.wire import GRADIENT_WIRES
from approxdist.data import ShardedBatches, TensorDataset, load_dataset
from approxdist.data.holdout import hold_out
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.lost_ranks import LossBoard
from approxdist.launch.survivors import SurvivorGroup
from approxdist.topology.groups import MeshGroups, make_groups
from approxdist.trace import NULL_RECORDER, Recorder
from approxdist.train.check import check_parts
from approxdist.train.engine import Engine
from approxdist.train.mode import mode_of
from approxdist.train.optim import LRRule
from approxdist.train.sink import sink_for
from approxdist.train.speculation import attach_adaprec
from approxdist.train.straggler import stragglers_of
from approxdist.train.trainer import Trainer


def adaptive_wire(cfg: Config) -> str | None:
    """The gradient wire whose codec AdaPrec chooses during training (None: no AdaPrec)."""
    return next((name for name in GRADIENT_WIRES if cfg.wire.wire(name).adaptive), None)


def first_phase(cfg: Config) -> Config:
    """`cfg` with AdaPrec's first codec in place of `adaprec:...` (the engine starts with it)."""
    name = adaptive_wire(cfg)
    if name is None:
        return cfg
    wire = cfg.wire.wire(name)
    rules, codec = candidate_rules(cfg.adaprec.first, wire.rules)
    started = dataclasses.replace(wire, codec=codec, rules=rules)
    return dataclasses.replace(cfg, wire=dataclasses.replace(cfg.wire, **{name: started}))


def engine_for(cfg: Config, ctx: DistContext, data: TensorDataset,
               rec: Recorder = NULL_RECORDER) -> tuple[Engine, MeshGroups]:
    """This rank's engine of `cfg`'s mode on `data` and the groups it runs on (collective:
    every rank makes the groups). What `train` steps; `plan validate` times it too."""
    mode = mode_of(cfg)
    mesh = mode.mesh(cfg)
    groups = make_groups(mesh, ctx, mode.spans(mesh), lanes={("dp",): cfg.dp.threads + 2})
    if cfg.ps.tolerate_worker_loss:
        groups = survivable(groups, ctx)
    return mode.engine(first_phase(cfg), ctx, groups, data, rec), groups


def survivable(groups: MeshGroups, ctx: DistContext) -> MeshGroups:
    """`groups` whose world (and its one stage's replicas) runs its collectives over the
    ranks still alive (`launch.survivors`); needs the tolerant launcher's loss board."""
    if not ctx.board:
        raise ConfigError("--tolerate-worker-loss needs the local launcher (approxdist train "
                          "--workers N), which keeps the others running when a worker dies; "
                          "under torchrun the agent stops every rank: drop the flag")
    world = SurvivorGroup(groups.world.ranks, ctx.rank, LossBoard.connect(ctx.board, ctx.timeout_s),
                          ctx.timeout_s)
    spans = {span: world if group.ranks == world.ranks else group
             for span, group in groups.spans.items()}
    return dataclasses.replace(groups, world=world, spans=spans)


def build_trainer(cfg: Config, ctx: DistContext, run_dir: Path, resume: bool,
                  rec: Recorder = NULL_RECORDER) -> Trainer:
    """This rank's trainer (collective over the world); `rec` records its phases."""
    check_parts(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_dataset(cfg.data)
    adaptive = adaptive_wire(cfg)
    candidates = candidates_of(cfg.wire.wire(adaptive).codec) if adaptive else None
    if candidates is not None:  # AdaPrec's signal set (held out for the curve rule)
        data, val_x, val_y = hold_out(data, cfg.adaprec.val_fraction, cfg.train.seed,
                                      cfg.train.world_size, cfg.data.batch_size,
                                      remove=cfg.adaprec.holds_out)
    engine, groups = engine_for(cfg, ctx, data, rec)
    index, count = engine.shard
    batches = ShardedBatches(data, cfg.data.batch_size, index, count, cfg.train.seed,
                             cfg.data.augment and engine.feeds_inputs)
    rule = LRRule(cfg.optim, cfg.data.batch_size, batches.steps_per_epoch, cfg.train.epochs)
    trainer = Trainer(cfg, ctx, run_dir, data, engine, groups, batches, rule,
                      sink_for(cfg.train, run_dir, ctx.is_main), rec=rec,
                      stragglers=stragglers_of(cfg))
    if adaptive is not None and candidates is not None:
        attach_adaprec(trainer, adaptive, candidates, val_x, val_y)
    if resume:
        trainer.resume()
    engine.start()
    return trainer
