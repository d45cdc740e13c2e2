"""Executing one run of an experiment: a config -> a run directory, like `approxdist train`.

Each run goes through the trainer's public builder (`train.build.build_trainer`, every
parallel mode) on N local gloo ranks started by `launch.spawn.run_on_ranks`
(a fork server with torch preloaded: seconds instead of the elastic launcher's start-up).
The run directory holds what `approxdist train` writes: `config.toml`, `metrics.jsonl`,
`summary.json`. A directory whose `config.toml` equals the new config and that holds a
`summary.json` is reused, so an interrupted experiment continues where it stopped. Each
run directory's time says when an invocation last used it (trained or reused), so that
`used_since` tells a report how many runs this invocation trained and how many it took
from earlier ones, and how long all of them trained.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from approxdist.config.loader import build_config, to_dict, write_config
from approxdist.errors import DataError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.train.metrics import read_jsonl, write_summary
from approxdist.train.resume import clear_run_outputs

Sections = dict[str, dict[str, Any]]

#: what a finished run leaves besides its figures; removed to keep experiment folders small
_BULKY = ("checkpoint.pt", "stage0", "stage1", "stage2", "stage3", "workers")


def _train_rank(ctx: DistContext, sections: Sections, run_dir: str) -> dict[str, Any]:
    """One rank of a training run (module level: `run_on_ranks` pickles it)."""
    from approxdist.train.worker import train_rank

    return train_rank(build_config(sections), ctx, Path(run_dir), False)


def _finished(run_dir: Path, config_text: str) -> dict[str, Any] | None:
    summary, config = run_dir / "summary.json", run_dir / "config.toml"
    if summary.is_file() and config.is_file() and config.read_text() == config_text:
        return dict(json.loads(summary.read_text()))
    return None


#: wall-clock limit per epoch of a run (CIFAR-10 / ResNet-56 on a CPU takes hours per epoch);
#: a hung collective is caught much earlier by the process group's `train.timeout_s`
EPOCH_LIMIT_S = 6 * 3600.0


def train_run(sections: Sections, run_dir: Path) -> dict[str, Any]:
    """Train once with `sections` (validated first) into `run_dir`; return summary.json's dict."""
    from approxdist.train.check import check_parts

    cfg = build_config(sections)
    check_parts(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    probe = run_dir / ".config.new.toml"
    write_config(cfg, probe)
    text = probe.read_text()
    probe.unlink()
    done = _finished(run_dir, text)
    if done is not None:
        os.utime(run_dir)  # used by this invocation (`used_since`)
        return done
    clear_run_outputs(run_dir)  # an unfinished or different earlier run's
    (run_dir / "config.toml").write_text(text)
    summary = run_on_ranks(_train_rank, cfg.train.world_size, to_dict(cfg), str(run_dir),
                           timeout_s=EPOCH_LIMIT_S * cfg.train.epochs,
                           comm_timeout_s=cfg.train.timeout_s)[0]
    _tidy(run_dir)
    write_summary(run_dir, summary)
    os.utime(run_dir)
    return dict(summary)


def used_since(out: Path, since: float) -> dict[str, float]:
    """The runs under `out/runs` an invocation started at `since` (epoch seconds) used:
    `trained` (their summary written since), `reused` (finished before it) and `train_s`,
    every used run's own training time (`wall_time_s`). Runs left from other invocations
    (another size's) do not count."""
    trained = reused = 0
    train_s = 0.0
    for summary in sorted((out / "runs").glob("*/summary.json")):
        if summary.parent.stat().st_mtime < since:
            continue
        if summary.stat().st_mtime >= since:
            trained += 1
        else:
            reused += 1
        train_s += float(json.loads(summary.read_text()).get("wall_time_s", 0.0))
    return {"trained": trained, "reused": reused, "train_s": round(train_s, 1)}


def _tidy(run_dir: Path) -> None:
    for name in _BULKY:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def records_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The records of one `kind` (epoch, adaprec, ...) of a run's metrics.jsonl, in order."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == kind]


def epochs_of(run_dir: Path) -> list[dict[str, Any]]:
    """The epoch records of a run's metrics.jsonl, in order; each epoch exactly once."""
    records = records_of(run_dir, "epoch")
    numbers = [r["epoch"] for r in records]
    if numbers != list(range(1, len(numbers) + 1)):
        raise DataError(f"{run_dir / 'metrics.jsonl'} holds epochs {numbers}, not 1..N once each "
                        f"(two experiments wrote into it?); delete {str(run_dir)!r} and run again")
    return records
