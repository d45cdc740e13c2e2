"""The interface between the one trainer and a parallel mode: an `Engine` per mode.

The trainer (`train/trainer.py`) owns epochs, the learning-rate rule, evaluation,
metrics, checkpoints and resume; an engine owns what differs between parallel modes:
how one mini-batch becomes a step on this rank (forward, backward, communication,
optimiser), how an evaluation batch is run, what this rank's state is, and what it sent.
Single-process, data-parallel, pipeline, hybrid and parameter-server training are
engines today (`train/engines/`); a new mode is a new engine named by its mode's record
(`train/mode.py`), never a new loop (docs/architecture.md walks through adding one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from approxdist.comm.update_error import Sums
from approxdist.trace.times import StepTimes

if TYPE_CHECKING:
    from approxdist.config.schema import Config
    from approxdist.data import TensorDataset
    from approxdist.launch.context import DistContext
    from approxdist.topology.groups import MeshGroups
    from approxdist.trace.recorder import Recorder


@dataclass(frozen=True)
class StepOutcome:
    """One mini-batch on this rank. Loss and hits count only the samples whose loss this
    rank computed (`samples`; 0 on ranks that compute no loss, e.g. early pipeline stages)."""

    loss_sum: float
    correct: int
    samples: int
    times: StepTimes = field(default_factory=StepTimes)
    peak_activation_bytes: int = 0
    #: bytes of the weight versions an asynchronous pipeline stage holds (0: none)
    peak_weight_version_bytes: int = 0
    #: extra fields of this step's record in metrics.jsonl (e.g. the weight versions an
    #: asynchronous pipeline's loss came from), as rank 0's engine reports them
    record: Mapping[str, Any] = field(default_factory=dict)
    #: steps of the epoch this rank skips after this one, their data unused (an N+b
    #: parameter-server worker whose gradient was dropped goes on from the newest
    #: parameters); the trainer moves on by 1 + skip steps
    skip: int = 0

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.samples if self.samples else None


class Engine(Protocol):
    """One parallel mode on this rank, as the trainer sees it."""

    #: what this rank trains: the whole model, or its stage of it (train/eval mode, state)
    module: nn.Module
    #: the optimisers whose learning rate the trainer sets each step
    optimizers: list[torch.optim.Optimizer]
    #: whether this rank needs the inputs / the labels of each mini-batch
    feeds_inputs: bool
    feeds_labels: bool
    #: (index, count): this rank draws shard `index` of `count` of every global batch
    shard: tuple[int, int]

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        """One mini-batch of `batch_size` samples: forward, backward, communication, update."""

    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        """(summed loss, correct, samples counted) of one test batch; zeros on ranks that
        compute no loss."""

    def end_epoch(self) -> None:
        """Before evaluation and the checkpoint (e.g. averaging batch-norm statistics)."""

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank has handed to torch.distributed so far, per link `"i->j"`."""

    def wires(self) -> dict[str, str]:
        """The wires of this rank's mode (`config.wire`) and the codec in force on each."""

    def set_wire(self, name: str, codec: str, rules: tuple[str, ...] = ()) -> None:
        """Send wire `name` in `codec` (and per-parameter `rules`) from the next step on,
        its error-feedback state kept (AdaPrec); every rank switches alike."""

    def update_error(self, measure: bool) -> Sums:
        """What the codecs of the wire AdaPrec switches did to this rank's gradients while
        watched, per parameter (||sent - exact||^2, ||exact||^2, size) summed over the steps
        (`comm.update_error`); `measure`: go on watching (from now, if not); False stops."""

    def score_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                    batch_size: int) -> tuple[float, int, int]:
        """(the true class's probability summed, correct, predictions) of one batch on this
        rank, in the module's current mode; zeros on ranks that compute no output
        (AdaPrec's signal)."""

    def local_state(self) -> dict[str, Any]:
        """This rank's state without collectives, as references (AdaPrec's snapshots copy
        it, `train/snapshot.py`)."""

    def load_local_state(self, state: Mapping[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (may be a collective over the engine's groups)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def start(self) -> None:
        """After construction and any resume, before the first step (weights broadcast)."""

    def summary(self) -> dict[str, Any]:
        """Mode-specific figures for summary.json."""

    def close(self) -> None: ...


#: builds the engine of a parallel mode on this rank; collective over the mesh's groups
EngineBuilder = Callable[["Config", "DistContext", "MeshGroups", "TensorDataset", "Recorder"],
                         Engine]


def trained_state(module: nn.Module, optimizer: torch.optim.Optimizer,
                  reducer: Mapping[str, Any]) -> dict[str, Any]:
    """An engine's state of one model (or stage): its module, its optimiser and its
    replicas' reducer (`dp`)."""
    return {"model": module.state_dict(), "optimizer": optimizer.state_dict(),
            "dp": dict(reducer)}


def load_trained(module: nn.Module, optimizer: torch.optim.Optimizer,
                 state: Mapping[str, Any]) -> Mapping[str, Any]:
    """Put `trained_state`'s module and optimiser back; the reducer's part, to load."""
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state.get("dp", {})


def seeded_model(cfg: Config, data: TensorDataset, ctx: DistContext) -> nn.Sequential:
    """The run's model, built from `train.seed` on this rank's device: every rank builds
    the same weights (a stage keeps its blocks; replicas start equal)."""
    from approxdist.models import build_model

    torch.manual_seed(cfg.train.seed)
    return build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
