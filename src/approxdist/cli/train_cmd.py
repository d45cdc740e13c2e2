"""`approxdist train`: train a model in any parallel mode (one record each, `train/mode.py`);
the main job."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from approxdist.cli.train_flags import (
    WORLD_KEYS,
    add_dp_flags,
    add_pipeline_flags,
    add_ps_flags,
    add_tp_flags,
    check_flags,
    flag_layer,
    flag_names,
    keys_of,
)
from approxdist.config.loader import (
    Sections,
    build_config,
    merge,
    merged,
    parse_overrides,
    read_toml,
    to_dict,
    write_config,
)
from approxdist.config.schema import BIND_POLICIES, Config, TrainConfig
from approxdist.data import DATASETS, load_dataset
from approxdist.data.holdout import hold_out
from approxdist.errors import ApproxDistError, ConfigError
from approxdist.launch.local import launch_local
from approxdist.launch.tolerant import launch_tolerant
from approxdist.models import MODELS, build_model
from approxdist.planner.plan_file import read_plan
from approxdist.trace.gather import TRACE_FILE
from approxdist.train.build import adaptive_wire
from approxdist.train.check import check_parts
from approxdist.train.mode import Mode, mesh_of, modes, plan_mode
from approxdist.train.plan_layer import check_agrees, check_input_shape, plan_sections
from approxdist.train.resumable import check_checkpoints, check_unchanged
from approxdist.train.run_dir import check_can_make, check_writable, make_run_dir
from approxdist.train.task import check_fits
from approxdist.train.tensorboard import check_log_dir
from approxdist.train.worker import run_worker


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train", help="train a model (the main job)",
        description="Train a model. With no arguments: digits, ResNet-20, 2 local workers, "
                    "data-parallel. Precedence: defaults < --config < flags < --set.",
    )
    known = modes()
    p.add_argument("--parallel", choices=known.names(),
                   help="parallelism (default dp): " + "; ".join(
                       f"{n} = {known.get(n).help}" for n in known.names()))
    p.add_argument("--world-size", type=int, help="number of local worker processes (default 2)")
    p.add_argument("--mesh", metavar="AXIS=SIZE,...",
                   help="the ranks as a mesh of named axes, e.g. dp=4, pp=2 or pp=2,dp=3/1 "
                        "(another way to say --world-size, --stages, --replicas); `approxdist "
                        "plan show --mesh ...` prints it")
    p.add_argument("--model", help=f"model: {', '.join(MODELS.names())}, or your own "
                                   f"package.module:function (arguments: --set model.args.K=V)")
    p.add_argument("--dataset", "--data", dest="dataset",
                   help=f"data set: {', '.join(DATASETS.names())}")
    p.add_argument("--data-dir", help="local directory of cifar10 / mnist files or class "
                                      "folders (imagefolder), or an .npz file (npz)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, help="global mini-batch size (split over ranks)")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--seed", type=int)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--link", help="emulated link for every transfer, e.g. bw=100mbit,lat=1ms")
    p.add_argument("--trace", action="store_true", default=None,
                   help="record every rank's timeline to RUN_DIR/trace.json (docs/tracing.md); "
                        "read it with `approxdist analyze RUN_DIR`")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the run's step and epoch figures as TensorBoard event "
                        "files into DIR (rank 0; `tensorboard --logdir DIR`; docs/training.md)")
    p.add_argument("--straggler", action="append", metavar="RANK:DELAY|random:P:DELAY",
                   help="slow a rank before each step (2:100ms), or each eligible rank with "
                        "probability P per step (random:0.1:50ms); seeded, any mode "
                        "(repeatable)")
    p.add_argument("--bind-cores", choices=BIND_POLICIES,
                   help="bind each rank's threads to cores: none (default), rank (a slice of "
                        "the cores each), row (a pipeline row's ranks share cores, a stage's "
                        "replicas on different ones; docs/hybrid.md)")
    add_pipeline_flags(p)
    add_dp_flags(p)
    add_ps_flags(p)
    add_tp_flags(p)
    p.add_argument("--out", help="run directory (default runs/<timestamp>)")
    p.add_argument("--config", help="TOML file with [train] [data] [model] [optim] sections")
    p.add_argument("--plan", help="plan file (`approxdist plan --json FILE`): model and its "
                                  "options, data set, mode, world size, stages, replicas, "
                                  "schedule, micro-batches, wire formats; flags and --set "
                                  "override the rest, not the model or data set")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set optim.momentum=0.8 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped run from its checkpoints (its mode, ranks, "
                        "partition and model stay; checked before anything is written)")
    p.add_argument("--check", action="store_true",
                   help="check everything a run would check before its workers start (the "
                        "config, plan, data, model, run directory, --resume's saved run and "
                        "checkpoints), then exit: 0 if the run would start; writes nothing")
    p.set_defaults(func=run)


def plan_layer(args: argparse.Namespace) -> list[dict[str, dict[str, Any]]]:
    """The plan file's config values, as a layer (none without --plan)."""
    path = getattr(args, "plan", None)
    if not path:
        return []
    plan = read_plan(path)
    mode = modes().get(args.parallel) if args.parallel else plan_mode(plan.mesh)
    check_agrees(plan, path, flag_layer(args, mode), parse_overrides(args.set))
    return [plan_sections(plan)]


def read_saved(run_dir: str) -> tuple[Sections, Config]:
    """A resumed run's saved config: its sections and the config they make."""
    saved = Path(run_dir) / "config.toml"
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir!r}: no config.toml there; pass a run directory")
    sections = read_toml(saved)
    try:
        return sections, build_config(sections)
    except ConfigError as exc:
        raise ConfigError(f"--resume {run_dir!r}: its config.toml is not a run's config "
                          f"({exc}); restore it from a copy, or start a new run with --out "
                          f"DIR") from None


def given_by(args: argparse.Namespace, mode: Mode, planned: list[Sections], flags: Sections,
             overrides: Sections) -> dict[str, str]:
    """config key -> what in this command set it (`--split`, `--set pipeline.split`,
    `--plan FILE`; the last layer that set it), for messages."""
    names = flag_names(mode)
    out = {key: f"--plan {args.plan}" for layer in planned for key in keys_of(layer)}
    out.update({key: names.get(key, key) for key in keys_of(flags)})
    out.update({key: f"--set {key}" for key in keys_of(overrides)})
    return out


def resolve(args: argparse.Namespace, world: int | None = None) -> tuple[Config, Path, bool]:
    """The config and run directory of this invocation (a resumed run keeps its own):
    defaults < the config file (< a resumed run's saved config) < the plan file < flags <
    --set, then what the mode's record says they imply (`Mode.implied`). `world`: the
    ranks torchrun started (the run's world when nothing else says one; refused when
    something says another). A resumed run that would change what its checkpoints were
    saved for is refused here, before anything is written."""
    saved, base = None, []
    if args.resume:
        sections, saved = read_saved(args.resume)
        base = [sections]
    overrides, planned = parse_overrides(args.set), plan_layer(args)
    early = merged(args.config, *base, *planned, overrides)
    name = args.parallel or early.get("train", {}).get("parallel", TrainConfig.parallel)
    mode = modes().get(name)
    flags = flag_layer(args, mode)
    given = given_by(args, mode, planned, flags, overrides)
    if saved is not None:
        asked = build_config(merge(base[0], merged(None, *planned, flags, overrides)))
        check_same_split(args.resume, base[0], asked)
        check_unchanged(saved, asked, Path(args.resume), given)
        if args.out and Path(args.out) != Path(args.resume):
            raise ConfigError(f"--resume {args.resume!r} continues the run in that folder, not "
                              f"in --out {args.out!r}: drop --out (or copy the run directory "
                              f"there and resume the copy)")
    check_flags(flags, mode)
    layers = [*base, *planned, flags, overrides]
    sections = mode.implied(merged(args.config, *layers))
    if world is not None:
        who = ", ".join(dict.fromkeys(given[k] for k in WORLD_KEYS if k in given)) or (
            f"--resume {args.resume}" if saved else "the config file or the mode's defaults")
        sections = world_of_torchrun(sections, world, who, mode)
    cfg = build_config(sections)
    if saved is not None:
        check_unchanged(saved, cfg, Path(args.resume), given)
        return cfg, Path(args.resume), True
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.train.out or f"runs/{stamp}-{cfg.model.name}-{cfg.train.parallel}")
    return cfg, run_dir, False


def check_same_split(run_dir: str, saved: dict[str, dict[str, Any]], cfg: Config) -> None:
    """A run's checkpoints hold its `tp` shards: resuming needs the same `tp` size (the
    replica count may change)."""
    size = int(saved.get("tp", {}).get("size", 1))
    if cfg.tp.size != size:
        raise ConfigError(f"--resume {run_dir}: its checkpoints hold the layers split over "
                          f"tp.size = {size} rank(s), not {cfg.tp.size}; resume with --tp "
                          f"{size}, or start a new run")


def world_of_torchrun(sections: Sections, world: int, who: str, mode: Mode) -> Sections:
    """`sections` with torchrun's world (`WORLD_SIZE`) when they say none; one error line
    when they say another (`who`: what in the command said it)."""
    said = sections.get("train", {}).get("world_size")
    if said is None:
        return mode.implied(merge(sections, {"train": {"world_size": world}}))
    if said != world:
        raise ConfigError(f"torchrun started {world} ranks (WORLD_SIZE={world}) but the run "
                          f"asks for {said} ({who}); start torchrun with {said} ranks in all "
                          f"(--nnodes x --nproc-per-node), or make the run ask for {world}")
    return sections


def preflight(cfg: Config, plan: str | None = None, make: bool = True) -> None:
    """Catch bad names, data paths and model/data mismatches here, before any worker starts
    (and samples of another shape than the plan file `plan` was profiled on). `make`: make
    the TensorBoard folder (`--check` only sees that it could be made)."""
    mode = check_parts(cfg)
    if cfg.train.tensorboard:
        check_log_dir(cfg.train.tensorboard, make)
    data = load_dataset(cfg.data)
    if plan:
        check_input_shape(read_plan(plan), plan, cfg.data.dataset, data.input_shape)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    check_fits(model, data, cfg.model.name)
    n = data.train_x.shape[0]
    if cfg.data.batch_size > n:
        raise ConfigError(f"data.batch_size ({cfg.data.batch_size}) is larger than the training "
                          f"set ({n} samples); use a batch size <= {n}")
    if adaptive_wire(cfg) is not None:
        hold_out(data, cfg.adaprec.val_fraction, cfg.train.seed, cfg.train.world_size,
                 cfg.data.batch_size, remove=cfg.adaprec.holds_out)
    mode.preflight(cfg, model, data)


def run(args: argparse.Namespace) -> int:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_under_torchrun(args)
    cfg, run_dir, resume = resolve(args)
    preflight(cfg, getattr(args, "plan", None), make=not args.check)
    epoch = check_resumed(run_dir, cfg) if resume else 0
    if args.check:
        return checked(cfg, run_dir, resume, epoch)
    start_run_dir(run_dir, resume)
    if not resume:  # a resumed run's rank 0 writes it once the run started (train/worker.py)
        write_config(cfg, run_dir / "config.toml")
    print(f"approxdist: {cfg.train.parallel} x{cfg.train.world_size}  {cfg.model.name} on "
          f"{cfg.data.dataset}  -> {run_dir}")
    if cfg.train.world_size == 1:
        summary = run_worker(to_dict(cfg), str(run_dir), resume)
    elif cfg.ps.tolerate_worker_loss:
        return run_tolerant(cfg, run_dir, resume)
    else:
        summary = launch_local(run_worker, cfg.train.world_size, to_dict(cfg), str(run_dir),
                               resume, describe=describe_ranks(cfg),
                               timeout_s=cfg.train.timeout_s)[0]
    return finish(run_dir, summary, cfg.train.trace)


def checked(cfg: Config, run_dir: Path, resume: bool, epoch: int | None) -> int:
    """`--check`: say the run would start, and what it would do (nothing is written);
    `epoch`: where a resumed run goes on (None: not known before its ranks load it)."""
    if not resume:
        check_can_make(run_dir, "--out")
    what = (f"trains {cfg.train.epochs} epoch(s)" if not resume else
            f"resumes after epoch {epoch} of {cfg.train.epochs}" if epoch is not None else
            f"resumes from its checkpoints up to epoch {cfg.train.epochs}")
    print(f"approxdist: check passed: {cfg.train.parallel} x{cfg.train.world_size}  "
          f"{cfg.model.name} on {cfg.data.dataset}  -> {run_dir} ({what}); nothing was "
          f"written: drop --check to train")
    return 0


def check_resumed(run_dir: Path, cfg: Config) -> int:
    """The epoch the resumed run's checkpoints were saved after, once they are all there,
    readable and agreeing (`train/resumable.py`) and the folder takes new files."""
    epoch = check_checkpoints(run_dir, mesh_of(cfg), cfg.train.epochs)
    check_writable(run_dir, "--resume")
    return epoch


def start_run_dir(run_dir: Path, resume: bool) -> None:
    """Create a fresh run's directory (one error line if it cannot be made or written),
    then remove an earlier run's outputs there, saying so (a resumed run's is kept)."""
    from approxdist.train.resume import clear_run_outputs

    if resume:
        return  # checked before: its checkpoints are there and it takes new files
    make_run_dir(run_dir, "--out")
    try:
        gone = clear_run_outputs(run_dir)
    except OSError as exc:
        raise ConfigError(f"--out {str(run_dir)!r} holds an earlier run whose outputs cannot "
                          f"be removed ({exc.strerror}: {exc.filename}); remove them, or "
                          f"pick another folder") from None
    if gone:
        print(f"approxdist: {run_dir} held an earlier run; replaced its {', '.join(gone)} "
              f"(--resume {run_dir} continues a run instead)", file=sys.stderr)


def run_tolerant(cfg: Config, run_dir: Path, resume: bool) -> int:
    """A parameter-server run that goes on when a worker dies (`--tolerate-worker-loss`):
    the launcher keeps the others running and tells them; exit 0 with the loss recorded."""
    mesh = mesh_of(cfg)
    outcome = launch_tolerant(run_worker, cfg.train.world_size, to_dict(cfg), str(run_dir),
                              resume, expendable=lambda rank: mesh.place(rank).role != "server",
                              describe=mesh.describe_rank, timeout_s=cfg.train.timeout_s)
    summary = ended(outcome.results[0])
    code = finish(run_dir, summary, cfg.train.trace)
    found = {row["rank"]: row for row in summary.get("ps", {}).get("lost_workers", [])}
    for rank, why in sorted(outcome.lost.items()):
        at = (f"at step {found[rank]['step']} (epoch {found[rank]['epoch']})" if rank in found
              else "after server 0's last step")
        print(f"approxdist: warning: the run lost {mesh.describe_rank(rank)} {at} ({why}) and "
              f"finished without it; summary.json: ps.lost_workers", file=sys.stderr)
    return code


def describe_ranks(cfg: Config) -> Callable[[int], str]:
    """How the launcher names a rank: its place in the run's mesh."""
    return mesh_of(cfg).describe_rank


def run_under_torchrun(args: argparse.Namespace) -> int:
    """Already inside a torchrun worker: the world comes from the environment (a run that
    asks for another is refused). Every rank runs the preflight; the checkpoints of a
    resumed run may lie on several hosts, so the ranks check them together as they load
    them (`train/resume.py`)."""
    world = torchrun_int("WORLD_SIZE")
    rank = torchrun_int("RANK")
    cfg, run_dir, resume = resolve(args, world)
    if cfg.ps.tolerate_worker_loss:
        raise ConfigError("--tolerate-worker-loss is available with the local launcher only "
                          "(approxdist train --parallel ps --workers N, without torchrun): "
                          "torchrun's agent stops every rank when one dies; drop the flag")
    preflight(cfg, getattr(args, "plan", None), make=not args.check)
    if args.check:
        return checked(cfg, run_dir, resume, None)
    if rank == 0:
        start_run_dir(run_dir, resume)
        if not resume:
            write_config(cfg, run_dir / "config.toml")
    summary = ended(run_worker(to_dict(cfg), str(run_dir), resume))
    return finish(run_dir, summary, cfg.train.trace) if rank == 0 else 0


def torchrun_int(name: str) -> int:
    """torchrun's `name` (RANK, WORLD_SIZE) as a number (one error line if it is not)."""
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} in the environment is not a number; approxdist "
                          f"train reads it as torchrun sets it (unset it to launch locally)"
                          ) from None


def ended(result: dict[str, Any] | ApproxDistError) -> dict[str, Any]:
    """A worker's summary, or the error every rank stopped with raised here."""
    if isinstance(result, ApproxDistError):
        raise result
    return result


def finish(run_dir: Path, result: dict[str, Any] | ApproxDistError,
           traced: bool = False) -> int:
    from approxdist.train.metrics import write_summary

    summary = ended(result)
    try:
        write_summary(run_dir, summary)
    except OSError as exc:
        raise ConfigError(f"the run finished but {run_dir / 'summary.json'} cannot be written "
                          f"({exc.strerror or exc}); its checkpoint and metrics.jsonl hold "
                          f"its figures") from None
    acc = summary["test_accuracy"]
    print(
        f"done: test accuracy {100 * acc:.2f}%  train loss {summary['train_loss']:.4f}  "
        f"time {summary['wall_time_s']:.1f} s  {summary['samples_per_s']:.0f} samples/s  "
        f"bytes sent {summary['bytes_sent'] / 1e6:.1f} MB\n"
        f"run directory: {run_dir} ({', '.join(sorted(p.name for p in run_dir.iterdir()))})"
    )
    if traced:
        print_trace_hint(run_dir)
    return 0


def print_trace_hint(run_dir: Path) -> None:
    """Where the merged timeline is and how to read it (`--trace`)."""
    path = run_dir / TRACE_FILE
    if not path.is_file():
        print(f"trace: {path} was not written; see the workers' errors above")
        return
    print(f"trace: {path} (open it in https://ui.perfetto.dev)\n"
          f"next: approxdist analyze {run_dir}")
