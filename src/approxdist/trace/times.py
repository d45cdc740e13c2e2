"""Where one rank's step time went: computing, communicating, or waiting (seed 002's question).

Every engine fills a `StepTimes` per step from its own clocks (no trace needed), and the
trainer adds them up per epoch: `metrics.jsonl` then reports, per rank, seconds of
compute (forward, backward, optimiser), communication work (encoding, posting,
communication threads) and time blocked waiting for a peer or a transfer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepTimes:
    """Seconds of one rank: compute (forward/backward), comm (encode/decode/post), wait (blocked)."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0
    wall_s: float = 0.0

    def __iadd__(self, other: StepTimes) -> StepTimes:
        self.compute_s += other.compute_s
        self.comm_s += other.comm_s
        self.wait_s += other.wait_s
        self.wall_s += other.wall_s
        return self

    @property
    def bubble(self) -> float:
        """Share of the wall time this rank did not compute (idle + communication)."""
        return 1.0 - self.compute_s / self.wall_s if self.wall_s > 0 else 0.0
