"""The world of a run that tolerates lost ranks: collectives over the members still alive.

A gloo collective over a group holding a dead rank fails on some members and hangs on
others, and a new process group cannot be agreed on while a member may die during its
rendezvous. `SurvivorGroup` keeps the world's stream for point-to-point messages (links,
pushes and pulls) and runs its small collectives (`all_reduce`, `all_gather_object`,
`broadcast_object`, `barrier`: the trainer's end-of-epoch figures, evaluation sums,
batch-norm averaging and the checkpoint's gather) through the launcher's store instead:
each member posts its value under the collective's sequence number, then reads the value
of every other member, leaving out a member that the loss board lists *and* that never
posted. A member that died after posting still counts, so every survivor gets the same
members whenever a rank dies (the board's entries and the posts never change once set).
Only for small values: each goes through the store (one TCP server, the launcher).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from typing import Any

import torch

from approxdist.errors import CommError
from approxdist.launch.group import Group
from approxdist.launch.lost_ranks import LossBoard

_PREFIX = "approxdist/survivors"
_POLL_S = 0.002


class SurvivorGroup(Group):
    """The world (`ranks`) as rank `me` sees it, with `board` naming the dead members."""

    def __init__(self, ranks: Sequence[int], me: int, board: LossBoard, timeout_s: float,
                 name: str = "world") -> None:
        super().__init__(ranks, me, name=name)
        self.board, self.timeout_s = board, timeout_s
        self._seq = 0
        #: the members whose values the last collective combined
        self.members: tuple[int, ...] = self.ranks

    def lost_ranks(self) -> frozenset[int]:
        return frozenset(self.board.lost())

    def _exchange(self, value: Any) -> dict[int, Any]:
        """Every surviving member's `value` (this member's included), by global rank."""
        self._seq += 1
        key = f"{_PREFIX}/{self._seq}"
        store = self.board.store
        store.set(f"{key}/{self.me}", pickle.dumps(value))
        got: dict[int, Any] = {}
        pending = list(self.ranks)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            lost = self.board.lost()
            for r in list(pending):
                if store.check([f"{key}/{r}"]):
                    got[r] = pickle.loads(store.get(f"{key}/{r}"))
                    pending.remove(r)
                elif r in lost:  # listed first, then still no post: it never will
                    pending.remove(r)
            if pending and time.monotonic() > deadline:
                raise CommError(f"rank {self.me}: {self.describe()} waited {self.timeout_s:.0f} s "
                                f"for rank(s) {', '.join(map(str, pending))}, neither alive nor "
                                f"reported dead", peer=pending[0])
            if pending:
                time.sleep(_POLL_S)
        if self._seq > 1:  # every survivor posted this one, so has read the last one
            store.delete_key(f"{_PREFIX}/{self._seq - 1}/{self.me}")
        self.members = tuple(r for r in self.ranks if r in got)
        return got

    # -- the collectives, over the survivors ------------------------------------------------
    @property
    def distributed(self) -> bool:
        return self.size > 1

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        got = self._exchange(obj if self.rank == root else None)
        if self.ranks[root] not in got:
            raise CommError(f"{self.describe()}: the root of a broadcast, rank "
                            f"{self.ranks[root]}, died", peer=self.ranks[root])
        return got[self.ranks[root]]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """The objects of the surviving members, in member order (`members` names them)."""
        got = self._exchange(obj)
        return [got[r] for r in self.members]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the surviving members in place (in member order, on every member)."""
        got = self._exchange(t.detach().cpu())
        total = torch.zeros_like(got[self.me])
        for r in self.members:
            total += got[r]
        t.copy_(total)
        return t

    def broadcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        t.copy_(self.broadcast_object(t.detach().cpu() if self.rank == root else None, root))
        return t

    def barrier(self) -> None:
        self._exchange(None)
