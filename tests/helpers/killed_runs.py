"""Training runs started together, each with one rank killed mid-run: the fault tests'
CLI processes overlap their interpreter and fork-server starts instead of paying them one
after the other, and every victim is killed as soon as its own run is mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.waiting import wait_until


@dataclass(frozen=True)
class KilledRun:
    """`approxdist train --out out *args`, whose rank `victim` is SIGKILLed once epoch 1's
    checkpoint exists."""

    out: Path
    victim: int
    args: tuple[str, ...]


def run_and_kill(runs: dict[str, KilledRun], timeout_s: float = 120.0
                 ) -> dict[str, tuple[int, str]]:
    """Start every run at once, kill each victim when its run has a checkpoint (whichever run
    gets there first is killed first), wait for all to end: per name, (exit code, stderr)."""
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "approxdist", "train", "--out", str(run.out), *run.args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name, run in runs.items()}
    pending = dict(runs)

    def kill_the_ready() -> bool:
        for name, run in list(pending.items()):
            info = run.out / "workers" / f"rank{run.victim}.json"
            if not ((run.out / "checkpoint.pt").is_file() and info.is_file()):
                assert procs[name].poll() is None, f"{name}: the run ended before its checkpoint"
                continue
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
            del pending[name]
        return not pending

    ended: dict[str, tuple[int, str]] = {}
    try:
        wait_until(kill_the_ready, f"a checkpoint of every run of {sorted(runs)}", timeout_s)
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=timeout_s)
            ended[name] = proc.returncode, err
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return ended
