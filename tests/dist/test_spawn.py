"""The shared N-rank helper: results in rank order, failures named, no hang."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch
import torch.distributed as dist

from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext, shutdown
from approxdist.launch.spawn import run_on_ranks


def _sum_ranks(ctx: DistContext, scale: float) -> float:
    t = torch.tensor([float(ctx.rank) * scale])
    dist.all_reduce(t)
    return float(t.item())


def _rank1_raises(ctx: DistContext) -> None:
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()


def _rank2_dies(ctx: DistContext) -> None:
    if ctx.rank == 2:
        os._exit(7)
    t = torch.ones(1)
    dist.all_reduce(t)


def test_results_in_rank_order() -> None:
    assert run_on_ranks(_sum_ranks, 3, 2.0) == [6.0, 6.0, 6.0]


def test_single_rank_needs_no_group() -> None:
    assert run_on_ranks(_sum_ranks_single, 1) == [0]


def _sum_ranks_single(ctx: DistContext) -> int:
    assert not dist.is_initialized()
    return ctx.rank


def test_failure_names_rank() -> None:
    with pytest.raises(LaunchError, match="rank 1 failed:(.|\n)*boom on rank 1"):
        run_on_ranks(_rank1_raises, 2, comm_timeout_s=5)


def test_dead_rank_is_reported_not_hung() -> None:
    with pytest.raises(LaunchError, match="rank 2"):
        run_on_ranks(_rank2_dies, 3, comm_timeout_s=5, timeout_s=60)


def _late_rank1_shutdown(ctx: DistContext, board: str) -> tuple[float, float]:
    """(when this rank entered `shutdown`, when it left it); rank 1 gets there last."""
    if ctx.rank == 1:
        time.sleep(1.0)
    entered = time.monotonic()
    shutdown(dataclasses.replace(ctx, board=board), finished=True)
    return entered, time.monotonic()


def test_a_finished_rank_tears_down_only_when_every_rank_has_finished() -> None:
    """The flake it fixes: on two hosts one rank destroyed its group while the other's gloo
    threads still carried the group's last messages (SIGABRT at exit). A finished rank
    leaves `shutdown` only after the last rank entered it; with lost ranks tolerated
    (`board` set) it does not wait (a lost rank never arrives)."""
    (_, left0), (entered1, _) = run_on_ranks(_late_rank1_shutdown, 2, "")
    assert left0 >= entered1
    (_, left0), (entered1, _) = run_on_ranks(_late_rank1_shutdown, 2, "127.0.0.1:1")
    assert left0 < entered1
