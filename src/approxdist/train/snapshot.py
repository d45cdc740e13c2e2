"""An in-memory snapshot of a run mid-epoch, restored bit for bit (AdaPrec, seed 004).

Everything that decides what the next step computes, on this rank:
* the engine's local state (`Snapshottable`): model parameters and buffers, optimiser
  state (momentum), and, for `DataParallel`, the error-feedback residuals of every bucket;
* where the run is: epoch, index of the next batch in that epoch, and global step (the
  learning-rate rule is a pure function of the step, `train/optim.LRRule`; the batches a
  pure function of seed, epoch and index, `data.ShardedBatches`);
* every random number generator a step may draw from: torch's CPU generator (dropout),
  each CUDA device's when there is one, Python's `random` and numpy's global generator.

`RunSnapshot.take(engine, position)` copies all of it; `restore(engine)` puts it back
and returns the position, and can be called any number of times (the copies are never
handed out). A run that takes a snapshot, trains any steps, restores and continues
computes exactly what a run that never left computes (`tests/dist/test_snapshot.py`).
Checkpoints (`train/resume.py`) carry the same state between processes at epoch ends;
this is the in-process, mid-epoch form AdaPrec speculates from.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


class Snapshottable(Protocol):
    """An engine whose state on this rank can be copied and put back without collectives."""

    def local_state(self) -> dict[str, Any]:
        """This rank's state, as references (the snapshot copies it)."""

    def load_local_state(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Position:
    """Where a run is: the next batch is `index` of `epoch`, the next step is `step`."""

    epoch: int
    index: int
    step: int


@dataclass(frozen=True)
class RngState:
    """Every global generator a training step may draw from."""

    torch_cpu: torch.Tensor
    torch_cuda: tuple[torch.Tensor, ...]
    python: Any
    numpy: Any

    @staticmethod
    def capture() -> RngState:
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else ()
        return RngState(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())

    def apply(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda:
            torch.cuda.set_rng_state_all(list(self.torch_cuda))
        random.setstate(self.python)
        np.random.set_state(self.numpy)


@dataclass(frozen=True)
class RunSnapshot:
    """A private copy of an engine's state, the RNGs and the run's position."""

    state: dict[str, Any]
    rng: RngState
    position: Position

    @staticmethod
    def take(engine: Snapshottable, position: Position) -> RunSnapshot:
        return RunSnapshot(_copy(engine.local_state()), RngState.capture(), position)

    def restore(self, engine: Snapshottable) -> Position:
        """Put the state back (a fresh copy each time, so the snapshot stays intact)."""
        engine.load_local_state(_copy(self.state))
        self.rng.apply()
        return self.position

    @property
    def nbytes(self) -> int:
        """Bytes of tensors this snapshot holds."""
        return sum(t.numel() * t.element_size() for t in tensors_in(self.state))


def _copy(state: Any) -> Any:
    """A deep copy in which every tensor is a clone on its own device (no shared storage)."""
    with torch.no_grad():
        return copy.deepcopy(_detach(state))


def _detach(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach()
    if isinstance(state, Mapping):
        return {k: _detach(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_detach(v) for v in state)
    return state


def tensors_in(state: Any) -> list[torch.Tensor]:
    """Every tensor of `state` (a tensor, or mappings, lists and tuples of them, nested),
    in order; anything else holds none."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, Mapping):
        return [t for v in state.values() for t in tensors_in(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in tensors_in(v)]
    return []
