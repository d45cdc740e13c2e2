"""`approxdist plan profile`: measure a model's blocks into a profile file (docs/planner.md).

    approxdist plan profile --model resnet20 --microbatch-size 32 --threads 1 --json prof.json

Builds the model the run trains (`--dataset`, `--set model.KEY=VALUE` as for `train`),
takes the first micro-batch of its training set and measures each block's forward and
backward seconds at that micro-batch size and thread count, its output, parameter and
stashed bytes (`planner.profiler`); prints them and writes the profile file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.cli.groups import command
from approxdist.config.loader import load_config, parse_overrides
from approxdist.config.schema import Config
from approxdist.data import DATASETS
from approxdist.models import MODELS
from approxdist.pipeline.profiler import REPEAT
from approxdist.planner.profile import Profile, write_profile
from approxdist.planner.profiler import profile_run


def register(actions: Any) -> None:
    p = command(actions, "profile", help="measure a model's blocks into a profile file", doc=__doc__)
    add_model_flags(p)
    p.add_argument("--microbatch-size", type=int, required=True,
                   help="samples per micro-batch: the batch every block is timed at")
    p.add_argument("--threads", type=int,
                   help="torch threads while timing: what each rank of the run will use "
                        f"(default: all {os.cpu_count()} cores)")
    p.add_argument("--repeat", type=int, default=REPEAT,
                   help=f"timed runs per block (median; default {REPEAT})")
    p.add_argument("--json", type=Path, help="write the profile file here")
    p.set_defaults(func=run)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The flags that say which model is measured (shared with `approxdist plan`)."""
    p.add_argument("--model", help=f"model: {', '.join(MODELS.names())}")
    p.add_argument("--dataset", help=f"data set giving the input shape and the samples: "
                                     f"{', '.join(DATASETS.names())} (default digits)")
    p.add_argument("--data-dir", help="local directory of cifar10 / mnist files")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="model or data option as for train, e.g. --set model.hidden=512")


def model_config(args: argparse.Namespace) -> Config:
    """The config of the model and data set the flags name (defaults elsewhere)."""
    layer: dict[str, dict[str, Any]] = {"model": {}, "data": {}}
    for flag, (section, key) in {"model": ("model", "name"), "dataset": ("data", "dataset"),
                                 "data_dir": ("data", "data_dir")}.items():
        if getattr(args, flag, None) is not None:
            layer[section][key] = getattr(args, flag)
    return load_config(None, layer, parse_overrides(args.set))


def measure(args: argparse.Namespace, micro_batch_size: int, threads: int | None) -> Profile:
    """Profile the model the flags name."""
    cfg = model_config(args)
    return profile_run(cfg.model, cfg.data, micro_batch_size, threads, args.repeat,
                       fuse_accumulation=cfg.pipeline.fuse_accumulation)


def run(args: argparse.Namespace) -> int:
    profile = measure(args, args.microbatch_size, args.threads)
    print(describe(profile))
    if args.json:
        write_profile(profile, args.json)
        print(f"profile: {args.json}")
    return 0


def describe(profile: Profile) -> str:
    """A header line and one row per block."""
    kib = 1 / 1024
    rows = [{"i": i, "name": b.name, "fwd": b.fwd_s * 1e3, "bwd": b.bwd_s * 1e3,
             "acc": b.acc_s * 1e3, "out": b.out_bytes * kib, "par": b.param_bytes * kib,
             "in": None if b.input_s is None else b.input_s * 1e3,
             "w": None if b.weight_s is None else b.weight_s * 1e3,
             "stash": b.stash_bytes * kib}
            for i, b in enumerate(profile.blocks)]
    cols = [Column("block", 5, "i"), Column("name", 24, "name", left=True),
            Column("fwd ms", 9, "fwd", ".3f"), Column("bwd ms", 9, "bwd", ".3f"),
            Column("I ms", 8, "in", ".3f"), Column("W ms", 8, "w", ".3f"),
            Column("acc ms", 9, "acc", ".3f"), Column("out KiB", 10, "out", ".1f"),
            Column("params KiB", 11, "par", ".1f"),
            Column("stash KiB", 10, "stash", ".1f")]
    head = (f"profile: {profile.model}, {len(profile.blocks)} blocks, micro-batch "
            f"{profile.micro_batch_size} x {list(profile.input_shape)}, threads "
            f"{profile.threads}, torch {profile.torch_version}, {profile.machine}")
    return head + "\n" + render(cols, rows)
