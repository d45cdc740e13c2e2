"""A rank's torch threads: its share of the machine's cores among the ranks on it."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from approxdist.launch.affinity import RANKS_PER_MACHINE_ENV
from approxdist.train.worker import set_threads


@pytest.fixture
def restore_threads() -> Any:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("restore_threads")
def test_ranks_sharing_the_machine_split_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    ctx: Any = SimpleNamespace(world_size=4)
    monkeypatch.delenv(RANKS_PER_MACHINE_ENV, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    set_threads(ctx, 0)
    assert torch.get_num_threads() == 2  # no launcher: the whole world is local
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun, one rank on each real host
    set_threads(ctx, 0)
    assert torch.get_num_threads() == 8
    # cluster run: 2 namespaced hosts x 2 ranks on this one machine
    monkeypatch.setenv(RANKS_PER_MACHINE_ENV, "4")
    set_threads(ctx, 0)
    assert torch.get_num_threads() == 2
    set_threads(ctx, 3)  # train.threads wins
    assert torch.get_num_threads() == 3
