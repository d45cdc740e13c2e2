"""The trainer's pure parts: the epoch tally and its figures, the lost-peer error."""

from __future__ import annotations

import pytest
import torch

from approxdist.errors import CommError, ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import world_group
from approxdist.pipeline.errors import PipelineError
from approxdist.topology import Mesh
from approxdist.trace.times import StepTimes
from approxdist.train.engine import StepOutcome
from approxdist.train.epoch import EpochTally, bytes_delta, gather_epoch, step_losses
from approxdist.train.mode import modes
from approxdist.train.trainer import name_lost_peer


def test_epoch_figures_count_only_the_samples_whose_loss_was_computed() -> None:
    tally = EpochTally(3)
    tally.add(0, StepOutcome(8.0, 3, 4, StepTimes(0.1, 0.02, 0.03, 0.2), 100))
    tally.add(1, StepOutcome(0.0, 0, 0, StepTimes(0.1, 0.0, 0.1, 0.2), 300))  # no loss here
    tally.add(2, StepOutcome(2.0, 4, 4, StepTimes(0.1, 0.04, 0.05, 0.2), 200))
    assert step_losses(tally, world_group(DistContext())) == [2.0, None, 0.5]
    stats = gather_epoch(tally, {"0->1": 10, "0->2": 0}, world_group(DistContext()),
                         Mesh.single(), wall=0.5, global_batch=4)
    assert stats["train_loss"] == pytest.approx(10.0 / 8) and stats["train_accuracy"] == 7 / 8
    assert stats["samples_per_s"] == pytest.approx(3 * 4 / 0.5)
    assert stats["time_wait_s"] == pytest.approx(0.18) and stats["time_comm_s"] == pytest.approx(0.06)
    (row,) = stats["ranks"]
    assert (row["rank"], row["stage"], row["replica"], row["peak_activation_bytes"]) == (0, 0, 0, 300)
    assert row["wait_s"] == pytest.approx(0.06)  # per step
    assert stats["bytes_sent"] == {"0->1": 10}  # links that carried nothing are left out
    assert bytes_delta({"0->1": 15, "1->0": 3}, {"0->1": 10}) == {"0->1": 5, "1->0": 3}


def test_a_lost_peer_is_named_with_its_place() -> None:
    topo = Mesh.pipeline(3, [2, 0, 1])
    exc = PipelineError("stage 1 (rank 0) stopped at 1F0 waiting for ...\nmore", peer=1)
    named = name_lost_peer(exc, topo, rank=0)
    assert isinstance(named, CommError) and named.peer == 1
    assert str(named) == ("lost rank 1 (stage 2, replica 0), which may have died; rank 0 "
                          "(stage 1, replica 0) stopped: stage 1 (rank 0) stopped at 1F0 "
                          "waiting for ...")
    plain = RuntimeError("no peer known")
    assert name_lost_peer(plain, topo, 0) is plain


def test_every_mode_is_one_record_in_the_registry() -> None:
    assert modes().names() == ["dp", "hybrid", "pipeline", "ps", "single", "tensor"]
    with pytest.raises(ConfigError, match="unknown parallel mode 'zero'; valid: dp, hybrid"):
        modes().get("zero")


def test_step_outcome_loss() -> None:
    assert StepOutcome(6.0, 1, 3).loss == 2.0 and StepOutcome(0.0, 0, 0).loss is None
    assert torch.equal(EpochTally(2).losses, torch.zeros(2, 2, dtype=torch.float64))
