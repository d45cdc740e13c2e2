"""What the AdaPrec controller needs from a training run (`train/speculation.py` is the
trainer's side): snapshots, codec switches, speculative steps, the signal, agreement."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from approxdist.comm.update_error import Sums

T = TypeVar("T")


class SpeculativeRun(Protocol):
    """What the controller needs from a training run (collectives: every rank calls)."""

    #: the run's last step, and the signal a model that guesses would score
    total_steps: int
    chance: float

    def snapshot(self) -> None:
        """Remember the run's state at its current position (the one before is kept too)."""

    def restore(self) -> None:
        """Back to the latest snapshot (any number of times)."""

    def drop(self) -> None:
        """Forget the latest snapshot: the one before it is the latest again."""

    def rollback(self) -> None:
        """The latest snapshot's state (model, optimiser, residuals), at the run's current
        position (the steps since are undone, the data and learning rate go on)."""

    def use(self, candidate: str) -> None:
        """Send the gradients in `candidate`'s codecs from the next step on."""

    def train(self, steps: int) -> tuple[list[float], bool]:
        """Train `steps` steps on; (each step's seconds on the slowest rank, every loss
        finite)."""

    def signal(self) -> float:
        """The validation signal of the model now, agreed by every rank."""

    def watch(self, on: bool) -> None:
        """Start (afresh) or stop measuring what the codecs do to this rank's gradients."""

    def update_error(self) -> Sums:
        """Per parameter, what the codecs did to every rank's gradients since `watch(True)`
        (`comm.update_error`), agreed by every rank; the watch goes on."""

    def agree(self, value: T) -> T:
        """Rank 0's `value`, on every rank."""

    #: whether this rank fits the curves and decides (rank 0; the others `agree`)
    decides: bool

    def keep(self) -> Any:
        """The end of the speculation since the last restore (state, position, its steps),
        or None where the run cannot go on from it; for `adopt`."""

    def adopt(self, kept: Any) -> None:
        """Go on from a kept speculation's end: its steps become the run's own."""
