"""One epoch's figures from every rank: losses per step, hits, times and bytes per link.

Each rank adds up what its engine reported; at the end of the epoch the trainer gathers
the sums over the world in two collectives (an all-reduce of the per-step losses, an
all-gather of one small row per rank) and turns them into the epoch record of
`metrics.jsonl`: losses and accuracy over the samples whose loss was computed (every
rank in data parallelism, the last stage in a pipeline), mean times per rank and step,
one row per rank (its place in the mesh, compute / comm / wait seconds per step,
peak activation bytes, steps skipped) and the bytes each directed link carried. In a
run that tolerates lost ranks the world gathers over the survivors only, and the record
names the ranks it did not hear from (`lost_ranks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from approxdist.launch.group import Group
from approxdist.topology import Mesh
from approxdist.trace.times import StepTimes
from approxdist.train.engine import StepOutcome


@dataclass
class EpochTally:
    """What this rank's engine reported over one epoch."""

    steps: int
    losses: torch.Tensor = field(init=False)  # (steps, 2): summed loss, samples
    correct: int = 0
    times: StepTimes = field(default_factory=StepTimes)
    peak_activation_bytes: int = 0
    peak_weight_version_bytes: int = 0
    skipped: int = 0  # steps the engine skipped (StepOutcome.skip)
    records: list[Mapping[str, Any]] = field(init=False)  # extra step-record fields

    def __post_init__(self) -> None:
        self.losses = torch.zeros(self.steps, 2, dtype=torch.float64)
        self.records = [{} for _ in range(self.steps)]

    def add(self, i: int, res: StepOutcome) -> None:
        self.losses[i, 0] = res.loss_sum
        self.losses[i, 1] = res.samples
        self.correct += res.correct
        self.times += res.times
        self.peak_activation_bytes = max(self.peak_activation_bytes, res.peak_activation_bytes)
        self.peak_weight_version_bytes = max(self.peak_weight_version_bytes,
                                             res.peak_weight_version_bytes)
        self.records[i] = res.record


def step_losses(tally: EpochTally, world: Group) -> list[float | None]:
    """The mini-batch loss of every step of the epoch, over all ranks (a collective)."""
    sums = world.all_reduce(tally.losses.clone())
    return [float(s / n) if n else None for s, n in sums.tolist()]


def gather_epoch(tally: EpochTally, sent: dict[str, int], world: Group, mesh: Mesh,
                 wall: float, global_batch: int) -> dict[str, Any]:
    """The epoch's training figures (a collective over the world); `sent` is this rank's
    bytes per link during the epoch."""
    steps = max(1, tally.steps)
    place = mesh.place(world.me)
    mine = {"rank": world.me, "stage": place.stage, "replica": place.replica,
            "compute_s": tally.times.compute_s / steps, "comm_s": tally.times.comm_s / steps,
            "wait_s": tally.times.wait_s / steps,
            "peak_activation_bytes": tally.peak_activation_bytes,
            "peak_weight_version_bytes": tally.peak_weight_version_bytes,
            "loss_sum": float(tally.losses[:, 0].sum()), "seen": float(tally.losses[:, 1].sum()),
            "correct": tally.correct, "sent": sent, "skipped_steps": tally.skipped}
    rows = world.all_gather_object(mine)
    seen = sum(r["seen"] for r in rows) or 1.0
    lost = sorted(set(world.ranks) - {r["rank"] for r in rows})
    return {
        **({"lost_ranks": lost} if lost else {}),
        "train_loss": sum(r["loss_sum"] for r in rows) / seen,
        "train_accuracy": sum(r["correct"] for r in rows) / seen,
        "epoch_time_s": wall,
        "step_time_s": wall / steps,
        "samples_per_s": tally.steps * global_batch / wall if wall > 0 else 0.0,
        "time_compute_s": _mean(rows, "compute_s") * steps,
        "time_comm_s": _mean(rows, "comm_s") * steps,
        "time_wait_s": _mean(rows, "wait_s") * steps,
        "ranks": [{k: r[k] for k in ("rank", "stage", "replica", "compute_s", "comm_s", "wait_s",
                                     "peak_activation_bytes", "peak_weight_version_bytes",
                                     "skipped_steps")}
                  for r in rows],
        "bytes_sent": {k: v for r in rows for k, v in sorted(r["sent"].items()) if v},
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in rows) / len(rows)


def bytes_delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Bytes per link sent since `before`."""
    return {k: v - before.get(k, 0) for k, v in now.items()}
