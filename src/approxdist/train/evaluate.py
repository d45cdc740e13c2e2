"""A finished run's checkpoint scored on its test set, at any `tp` size (`approxdist evaluate`).

A tensor-parallel run leaves one checkpoint per shard (`shard<t>/`); its pieces are merged
into the whole model (`tensor_parallel.reshard`), which is then scored in one process
(`tp=1`) or split again over `tp` fresh ranks by the run's plan. A data-parallel run's
checkpoint is the whole model already, so it too can be scored split. The collectives of
the split evaluation are exact (fp32): the figures depend on the weights only, so they
equal the run's own last evaluation when its forward wire was fp32.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from approxdist.api.tensor_parallel import TensorParallel
from approxdist.config.loader import build_config, read_toml, to_dict
from approxdist.config.schema import Config
from approxdist.data import TensorDataset, load_dataset
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import world_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.tensor_parallel import check_plan
from approxdist.tensor_parallel.reshard import merge_shards
from approxdist.train.checkpoint import NAME, load_checkpoint
from approxdist.train.engines.tp_split import plan_of
from approxdist.train.task import task_named


@dataclass(frozen=True)
class Scored:
    """What `evaluate_run` found: the run's saved `tp` size and epoch, the figures."""

    saved_tp: int
    epoch: int
    accuracy: float
    loss: float


#: a shard's checkpoint folder
_SHARD = re.compile(r"^shard(\d+)$")


def run_config(run_dir: Path) -> Config:
    """The config a run saved (`config.toml`)."""
    saved = run_dir / "config.toml"
    if not saved.is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no config.toml; pass the --out directory "
                          "of a finished `approxdist train` run")
    return build_config(read_toml(saved))


def _shard_dirs(run_dir: Path) -> list[Path]:
    found = {int(m.group(1)): d for d in run_dir.iterdir()
             if (m := _SHARD.match(d.name)) and d.is_dir()}
    if found and sorted(found) != list(range(len(found))):
        raise ConfigError(f"{str(run_dir)!r} holds shards {sorted(found)}: one is missing; "
                          "evaluate a whole run directory")
    return [found[t] for t in sorted(found)]


def whole_state(run_dir: Path, model: nn.Module) -> tuple[dict[str, torch.Tensor], int, int,
                                                           dict[str, str]]:
    """The run's model state as one process holds it (shards merged), its saved `tp`
    size, its epoch and its plan (empty when it was not split)."""
    whole = model.state_dict()
    if (run_dir / "stage0").is_dir():
        raise ConfigError(f"{str(run_dir)!r} is a pipeline run (stage0/, ...): evaluate reads "
                          "data- and tensor-parallel runs; its last test figures are in its "
                          "metrics.jsonl")
    shards = _shard_dirs(run_dir)
    if shards:
        for d in shards:
            if not (d / NAME).is_file():
                raise ConfigError(f"{str(d)!r} holds no {NAME}: the run did not finish an "
                                  "epoch; evaluate a run that did")
        states = [load_checkpoint(d) for d in shards]
        tables = [s.get("tp", {}).get("index") for s in states]
        if any(t is None for t in tables):
            raise ConfigError(f"{str(run_dir)!r}: a shard's checkpoint holds no shard index "
                              "(written by an older approxdist); train the run again")
        epochs = {s["epoch"] for s in states}
        if len(epochs) > 1:
            raise ConfigError(f"{str(run_dir)!r}: the shards' checkpoints are at epochs "
                              f"{sorted(epochs)}; a shard died while saving")
        merged = merge_shards(whole, [(s["model"], t) for s, t in zip(states, tables,
                                                                      strict=True)],
                              prefix="module.")
        return merged, len(states), states[0]["epoch"], dict(states[0]["tp"]["plan"])
    if not (run_dir / NAME).is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no {NAME} (nor shard<t>/ folders); pass "
                          "a run directory that finished at least one epoch")
    state = load_checkpoint(run_dir)
    if "model" not in state or set(state["model"]) != set(whole):
        raise ConfigError(f"{str(run_dir / NAME)!r} does not hold the run's whole model (a "
                          "parameter server's or another model's); evaluate a data- or "
                          "tensor-parallel run")
    return dict(state["model"]), 1, int(state["epoch"]), {}


def score(model: nn.Module, data: TensorDataset, cfg: Config) -> tuple[float, float]:
    """(test accuracy, mean test loss) of `model` over the whole test set, batched as the
    trainer does."""
    task, bs = task_named(data.task), cfg.data.test_batch_size
    sums = torch.zeros(3, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for lo in range(0, data.test_x.shape[0], bs):
            counted = task.evaluate(model(data.test_x[lo:lo + bs]), data.test_y[lo:lo + bs])
            sums += torch.tensor(counted, dtype=torch.float64)
    return float(sums[1] / sums[2]), float(sums[0] / sums[2])


def _loaded(cfg: Config, run_dir: Path) -> tuple[nn.Module, TensorDataset, int, int,
                                                 dict[str, str]]:
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    state, saved_tp, epoch, plan = whole_state(run_dir, model)
    model.load_state_dict(state)
    return model, data, saved_tp, epoch, plan


def _score_split(ctx: DistContext, sections: Mapping[str, Any], run_dir: str,
                 plan: Mapping[str, str]) -> tuple[float, float]:
    """One rank of a split evaluation: the whole model loaded, then cut by `plan`."""
    cfg = build_config(sections)
    model, data, *_ = _loaded(cfg, Path(run_dir))
    split = TensorParallel(model, plan=plan, group=world_group(ctx))
    try:
        return score(split, data, cfg)
    finally:
        split.close()


def evaluate_run(run_dir: Path, tp: int = 1) -> Scored:
    """Score `run_dir`'s checkpoint at `tp` ranks (1: one process, the shards merged)."""
    if tp < 1:
        raise ConfigError(f"--tp {tp}: the ranks to evaluate on must be >= 1")
    cfg = run_config(run_dir)
    model, data, saved_tp, epoch, plan = _loaded(cfg, run_dir)
    if tp == 1:
        accuracy, loss = score(model, data, cfg)
        return Scored(saved_tp, epoch, accuracy, loss)
    plan = plan or plan_of(cfg, model)
    check_plan(model, plan, tp)
    results = run_on_ranks(_score_split, tp, to_dict(cfg), str(run_dir), plan, timeout_s=1800)
    accuracy, loss = results[0]
    return Scored(saved_tp, epoch, accuracy, loss)
