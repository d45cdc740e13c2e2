"""The loss board and the survivors' collectives (`launch/lost_ranks.py`, `launch/survivors.py`)
on an in-process store: members talk from threads, one of them "dies" before or after
posting, and every survivor combines the same members."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from approxdist.errors import CommError
from approxdist.launch.lost_ranks import LossBoard
from approxdist.launch.survivors import SurvivorGroup


def _on_members(store: Any, ranks: list[int], fn: Callable[[SurvivorGroup], Any],
                timeout_s: float = 10.0) -> dict[int, Any]:
    """`fn(group)` for each member in `ranks` of the world 0..3, each on its own thread."""
    out: dict[int, Any] = {}

    def run(rank: int) -> None:
        try:
            out[rank] = fn(SurvivorGroup(range(4), rank, LossBoard(store), timeout_s))
        except CommError as exc:
            out[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def test_the_board_lists_posted_ranks_with_why() -> None:
    store = dist.HashStore()
    launcher, reader = LossBoard(store), LossBoard(store)
    assert reader.lost() == {}
    launcher.post(3, "exit code -9 (SIGKILL)")
    launcher.post(1, "exit code 1: RuntimeError: boom")
    assert reader.lost() == {3: "exit code -9 (SIGKILL)", 1: "exit code 1: RuntimeError: boom"}


def test_a_rank_lost_before_posting_is_left_out_by_every_survivor() -> None:
    store = dist.HashStore()
    LossBoard(store).post(2, "exit code -9 (SIGKILL)")

    def collect(group: SurvivorGroup) -> tuple[Any, ...]:
        t = torch.tensor([float(group.me + 1)])
        group.all_reduce(t)
        return float(t), group.all_gather_object(group.me), group.members

    out = _on_members(store, [0, 1, 3], collect)
    assert out[0] == out[1] == out[3] == (1.0 + 2.0 + 4.0, [0, 1, 3], (0, 1, 3))


def test_a_rank_that_posted_before_dying_still_counts() -> None:
    store = dist.HashStore()
    board = LossBoard(store)

    def dying(group: SurvivorGroup) -> None:  # rank 3 posts its value, then dies
        group.board.store.set("approxdist/survivors/1/3", pickle.dumps(7))
        board.post(3, "exit code -9 (SIGKILL)")

    _on_members(store, [3], dying)
    out = _on_members(store, [0, 1, 2], lambda g: g.all_gather_object(g.me * 10))
    assert out[0] == out[1] == out[2] == [0, 10, 20, 7]


def test_a_member_neither_alive_nor_reported_times_out_naming_it() -> None:
    store = dist.HashStore()
    out = _on_members(store, [0, 1, 2], lambda g: g.barrier(), timeout_s=0.3)
    assert all(isinstance(e, CommError) and "rank(s) 3, neither alive nor reported dead" in str(e)
               for e in out.values())


def test_broadcast_from_a_dead_root_names_it() -> None:
    store = dist.HashStore()
    LossBoard(store).post(0, "exit code -9 (SIGKILL)")
    out = _on_members(store, [1, 2, 3], lambda g: g.broadcast_object("x"))
    with pytest.raises(CommError, match="the root of a broadcast, rank 0, died"):
        raise out[1]
