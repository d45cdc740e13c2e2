"""Run a preset into a directory, and (re)write its report from the CSVs it left there.

Layout of an experiment directory:
`experiment.json` (preset name, settings, machine, timings and what the preset's
`collect` returned), the preset's CSV files, `runs/` (one run directory per training
run, as `approxdist train` writes them), the PNG plots and `report.md`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from approxdist.errors import ConfigError, DataError
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.registry import get_preset, preset_names
from approxdist.experiments.runs import used_since
from approxdist.experiments.shaping import check_shaper
from approxdist.experiments.studies import get_study

META_FILE = "experiment.json"
REPORT_FILE = "report.md"
LOCK_FILE = ".experiment.lock"


def machine() -> dict[str, Any]:
    """Where the figures were measured (the report states it next to the seed's V100s)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python":
            platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.is_available(), "load_avg_1min_at_start": round(load, 2)}


def command_line(name: str, settings: Settings) -> str:
    parts = ["approxdist experiment", name, "--out", str(settings.out)]
    if settings.size != "full":
        parts.append(f"--{settings.size}")
    if settings.data_dir:
        parts += ["--data-dir", settings.data_dir]
    if settings.seeds:
        parts += ["--seeds", str(settings.seeds)]
    if settings.link:
        parts += ["--link", settings.link]
    if settings.link_shaper != "inproc":
        parts += ["--link-shaper", settings.link_shaper]
    return " ".join(parts)


def run_experiment(name: str, settings: Settings) -> Path:
    """Execute preset `name` into `settings.out`; write experiment.json and the report."""
    preset = get_preset(name)
    why_not = mismatch(preset, settings)
    if why_not:
        raise ConfigError(why_not)
    if settings.link_shaper == "kernel":
        check_shaper("kernel")  # root or CAP_NET_ADMIN, before anything runs
    settings.out.mkdir(parents=True, exist_ok=True)
    with exclusive(settings.out):
        return _run(preset.name, settings)


def mismatch(preset: Preset, settings: Settings) -> str:
    """Why `settings`' link options do not apply to `preset` (one line that names the
    fix), or "" when they do; `run_experiment` refuses with it, `experiment all` skips."""
    if settings.link_shaper not in preset.shapers:
        offering = [n for n in preset_names() if settings.link_shaper in get_preset(n).shapers]
        return (f"--link-shaper {settings.link_shaper} does not apply to {preset.name}, which "
                f"has no link to shape; presets that take it: {', '.join(offering) or 'none'}")
    if settings.link and not preset.takes_link:
        offering = [n for n in preset_names() if get_preset(n).takes_link]
        how = ("it varies the link's rate itself" if "kernel" in preset.shapers else
               "it has no link to shape")
        return (f"--link {settings.link} does not apply to {preset.name} ({how}); drop "
                f"--link, or run a preset that takes it: {', '.join(offering) or 'none'}")
    if settings.link_shaper == "kernel" and preset.takes_link and not settings.link:
        return (f"--link-shaper kernel on {preset.name} needs --link bw=RATE, the rate tc "
                f"shapes the hosts' links to; e.g. --link bw=100mbit")
    return ""


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Refuse a second experiment writing into `out` at the same time (its runs would mix)."""
    lock = out / LOCK_FILE
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pid = int(lock.read_text().strip() or 0)
        if _alive(pid):
            raise ConfigError(f"another experiment (pid {pid}) is writing into {str(out)!r}; "
                              f"wait for it or pass another --out") from None
        lock.unlink()  # left by a run that was killed
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(name: str, settings: Settings) -> Path:
    preset = get_preset(name)
    start, since = time.perf_counter(), time.time()
    meta: Meta = {"experiment": name, "settings": settings.as_dict(), "machine": machine(),
                  "command": command_line(name, settings),
                  "started": datetime.datetime.now().isoformat(timespec="seconds")}
    meta.update(preset.collect(settings))
    meta["duration_s"] = round(time.perf_counter() - start, 1)
    meta["runs"] = used_since(settings.out, since - 1.0)  # file times have 1 s or better
    (settings.out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return render_report(settings.out)


def load_meta(out: Path) -> Meta:
    path = out / META_FILE
    if not path.is_file():
        raise DataError(f"{str(out)!r} is not an experiment directory (no {META_FILE}); pass the "
                        f"--out directory of `approxdist experiment NAME --out DIR`")
    return dict(json.loads(path.read_text()))


def render_report(out: Path) -> Path:
    """Regenerate the plots and report.md of `out` from its CSVs and experiment.json."""
    meta = load_meta(out)
    preset = get_preset(meta["experiment"])
    for file in preset.files:
        file.read(out)  # fails early, naming a missing file or column
    body = preset.render(out, meta)
    path = out / REPORT_FILE
    path.write_text(header(meta, preset) + "\n\n" + body + "\n")
    return path


def reused_runs(runs: dict[str, float] | None) -> str:
    """What the invocation's time leaves out when it reused runs of earlier invocations."""
    if not runs or not runs.get("reused"):
        return ""
    return (f"; this invocation trained {runs['trained']:.0f} runs and reused "
            f"{runs['reused']:.0f} that earlier invocations of the same command finished, so "
            f"its time is not the study's: the {runs['trained'] + runs['reused']:.0f} runs' "
            f"own training took {runs['train_s']:.0f} s")


def header(meta: Meta, preset: Preset) -> str:
    m, s = meta["machine"], meta["settings"]
    listed = preset.listing
    study = get_study(listed.study)
    lines = [f"# {meta['experiment']}: {listed.title}", "",
             f"Reproduces {listed.reproduces} of {study.cite()}; the study is described in "
             f"approxdist's {study.link}.", "",
             f"Command: `{meta['command']}` "
             f"(size `{s['size']}`), {meta['duration_s']:.0f} s on {m['cpus']} CPU cores "
             f"(torch {m['torch']}, GPU: {'yes' if m['cuda'] else 'no'}, load average "
             f"{m['load_avg_1min_at_start']} at start), started {meta['started']}"
             f"{reused_runs(meta.get('runs'))}. "
             f"Regenerate this page and its plots with `approxdist report {s['out']}`."]
    task = meta.get("task")
    if task:
        options = ", ".join(f"{k}={v}" for k, v in task["model"].items() if k != "name")
        lines += ["", f"**Task.** `{task['dataset']}`, model `{task['model']['name']}`"
                      f"{f' ({options})' if options else ''}, split `{task['split']}` "
                      f"(first block of stage 1), batch {task['batch_size']}, "
                      f"lr {task['lr']}, {task['epochs']} epochs, {task['microbatches']} "
                      f"micro-batches, {task['schedule']}. {task['why']}"]
    return "\n".join(lines)
