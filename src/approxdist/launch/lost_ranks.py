"""The loss board: which ranks of a run that tolerates it have died, posted by the launcher.

The tolerant local launcher (`launch/tolerant.py`) hosts the run's c10d `TCPStore` (the
ranks join the process group through it) and, when a rank's process ends without
finishing, posts that rank here. Every rank reads the board through its own store client:
a server stops waiting for a lost worker, and the survivors' collectives
(`launch/survivors.py`) leave it out. One writer (the launcher), many readers; an entry,
once posted, never changes.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

_PREFIX = "approxdist/lost"


class LossBoard:
    """The lost ranks of a run, on a c10d store (`store`: any `torch.distributed.Store`)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lost: dict[int, str] = {}
        self._posted = 0

    @classmethod
    def connect(cls, address: str, timeout_s: float) -> LossBoard:
        """The board of the store at `address` (`host:port`), as a client."""
        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        return cls(store)

    def post(self, rank: int, why: str) -> None:
        """Record that `rank` died (`why`: its exit code or error); the launcher's call."""
        self.store.set(f"{_PREFIX}/{self._posted}", f"{rank}:{why}")
        self._posted += 1
        self.store.add(f"{_PREFIX}/count", 1)  # readers see an entry only once it is set

    def lost(self) -> dict[int, str]:
        """Every rank posted so far, with why it died."""
        count = int(self.store.add(f"{_PREFIX}/count", 0))
        for i in range(len(self._lost), count):
            rank, _, why = self.store.get(f"{_PREFIX}/{i}").decode().partition(":")
            self._lost[int(rank)] = why
        return dict(self._lost)
