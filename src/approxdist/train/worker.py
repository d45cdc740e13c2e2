"""What each worker process runs: join the group, agree on the run directory, train.

With `train.trace` every rank records its timeline (`approxdist.trace`) and rank 0
writes the merged `trace.json` into the run directory after training. An error every rank
raised together (`AgreedError`: a checkpoint that could not be written or read) is
returned, not raised, so the launcher reports it once instead of as a failed worker; a
resumed run's rank 0 writes its `config.toml` once its checkpoints are loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any

import tomli_w
import torch
import torch.distributed as dist

from approxdist.config.loader import build_config, read_toml, to_dict
from approxdist.config.schema import Config
from approxdist.errors import ApproxDistError
from approxdist.launch.affinity import RANKS_PER_MACHINE_ENV, bind_rank
from approxdist.launch.context import DistContext, init_from_env, shutdown
from approxdist.launch.malloc import hold_freed_memory
from approxdist.trace import Recorder, finish_trace, open_recorder, save_rank_trace
from approxdist.train.build import build_trainer
from approxdist.train.mode import mesh_of
from approxdist.train.resume import AgreedError


def set_threads(ctx: DistContext, requested: int) -> None:
    """`requested` threads, or an even share of this machine's cores among the ranks on it:
    `RANKS_PER_MACHINE_ENV` where set (`approxdist cluster run`, whose hosts are namespaces
    of one machine: torchrun's LOCAL_WORLD_SIZE counts one host's ranks, and each rank took
    every core, 2 threads per rank on 2 cores, which made the compute 4.6x slower than
    locally, docs/links.md), else LOCAL_WORLD_SIZE, else the world."""
    if requested:
        torch.set_num_threads(requested)
        return
    sharing = os.environ.get(RANKS_PER_MACHINE_ENV) or os.environ.get("LOCAL_WORLD_SIZE")
    local = int(sharing) if sharing else ctx.world_size
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))


def machine_ranks(ctx: DistContext) -> range:
    """The global ranks on this rank's machine: every rank under `approxdist cluster run`
    (`RANKS_PER_MACHINE_ENV`: its hosts share one machine) and the local launcher;
    torchrun's node (LOCAL_RANK, LOCAL_WORLD_SIZE: contiguous ranks) otherwise."""
    if os.environ.get(RANKS_PER_MACHINE_ENV) or "LOCAL_WORLD_SIZE" not in os.environ:
        return range(ctx.world_size)
    first = ctx.rank - int(os.environ.get("LOCAL_RANK", "0"))
    return range(first, first + int(os.environ["LOCAL_WORLD_SIZE"]))


def bind_cores(cfg: Config, ctx: DistContext) -> None:
    """`train.bind_cores`: bind this rank's threads among its machine's ranks, by rank or
    by pipeline row (`launch/affinity.py`)."""
    if cfg.train.bind_cores == "none":
        return
    mesh = mesh_of(cfg)
    machine = machine_ranks(ctx)
    rows = [mesh.place(r).replica for r in machine]
    bind_rank(cfg.train.bind_cores, ctx.rank, machine, rows)


def agree_on_run_dir(ctx: DistContext, run_dir: str) -> Path:
    """Rank 0's choice wins (under torchrun each rank may have picked its own default)."""
    box = [run_dir]
    if ctx.distributed:
        dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def record_worker(run_dir: Path, ctx: DistContext) -> None:
    """workers/rankN.json: pid, host and the cores it may run on (`--bind-cores`) of each
    rank (for operators, and the fault test)."""
    wdir = run_dir / "workers"
    wdir.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    info = {"rank": ctx.rank, "pid": os.getpid(), "host": socket.gethostname(), "cores": cores}
    (wdir / f"rank{ctx.rank}.json").write_text(json.dumps(info))


def run_worker(cfg_sections: dict[str, Any], run_dir: str, resume: bool,
               board: str = "") -> dict[str, Any] | AgreedError:
    """The entry point of every rank; returns rank 0's summary (others return theirs), or
    the `AgreedError` every rank stopped with (the caller raises it).
    `board`: where the tolerant launcher posts lost ranks (`launch/tolerant.py`)."""
    cfg = build_config(cfg_sections)
    ctx = dataclasses.replace(init_from_env(cfg.train.device, cfg.train.timeout_s), board=board)
    finished = False
    try:
        set_threads(ctx, cfg.train.threads)
        bind_cores(cfg, ctx)
        hold_freed_memory()  # launch.malloc: no page faults from a trimmed heap every step
        path = agree_on_run_dir(ctx, run_dir)
        path.mkdir(parents=True, exist_ok=True)
        record_worker(path, ctx)
        summary = train_rank(cfg, ctx, path, resume)
        finished = True
        return summary
    except AgreedError as exc:
        finished = True  # every rank stopped with it together
        return exc
    finally:
        shutdown(ctx, finished)


def train_rank(cfg: Config, ctx: DistContext, path: Path, resume: bool) -> dict[str, Any]:
    """One rank's run into `path`, traced when `cfg.train.trace` (the recorder is labelled
    with the rank's stage in a pipeline)."""
    mesh = mesh_of(cfg)
    label = f"stage {mesh.place(ctx.rank).stage}" if mesh.num_stages > 1 else ""
    rec = open_recorder(ctx, cfg.train.trace, label=label)  # collective when tracing
    return train_traced(cfg, ctx, path, resume, rec)


def train_traced(cfg: Config, ctx: DistContext, path: Path, resume: bool,
                 rec: Recorder) -> dict[str, Any]:
    """Train, then write the merged trace (a collective, only when every rank got there).

    A rank whose training raised writes only its own `trace.rank<N>.json` (no
    collective: the other ranks may be gone) and lets the error propagate.
    """
    try:
        trainer = build_trainer(cfg, ctx, path, resume, rec)
        if resume and ctx.is_main:
            keep_config(cfg, path)
        summary = trainer.run()
    except BaseException:
        with contextlib.suppress(Exception):  # never hide the training error
            save_rank_trace(rec, path)
        raise
    finish_trace(rec, ctx, path)
    return summary


def keep_config(cfg: Config, run_dir: Path) -> None:
    """A resumed run's `config.toml`, written once its checkpoints are loaded and only when
    this run changed it (e.g. more --epochs); atomically, so a failed write keeps the old."""
    path = run_dir / "config.toml"
    sections = to_dict(cfg)
    with contextlib.suppress(ApproxDistError):
        if read_toml(path) == sections:
            return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomli_w.dumps(sections))
    os.replace(tmp, path)
