"""The next push among the live workers, for a server that tolerates lost workers.

gloo's receive from any source cannot leave a rank out: once a dead worker's connection
is reset, every later any-source receive fails at once. A tolerant server instead keeps
one receive of the 8-byte version word posted per live worker (`Link.irecv_bytes`, from
that worker only) and takes the first to complete; a receive from a dead worker fails or
never completes and concerns that worker alone. gloo's `is_completed()` turns true only
inside `wait()`, so each receive is waited on by a helper thread and the server polls
(`next`, in slices, reading the loss board in between). The server posts receives only
for pushes still due (`ServerRules.owes`): a receive left pending at exit aborts it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from approxdist.comm.link import Link, RecvHandle
from approxdist.errors import CommError


@dataclass
class _Posted:
    """One posted receive and what its helper thread saw."""

    handle: RecvHandle[torch.Tensor]
    done: threading.Event = field(default_factory=threading.Event)
    value: torch.Tensor | None = None
    error: CommError | None = None
    at: float = 0.0  # when it completed (monotonic)


class FirstArrival:
    """Version-word receives from each worker of `link`'s group, the earliest taken first."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._posted: dict[int, _Posted] = {}  # member index -> its posted receive
        self._any_done = threading.Event()

    def post(self, members: Iterable[int], nbytes: int) -> None:
        """A receive of `nbytes` from each of `members` that has none posted."""
        for m in members:
            if m not in self._posted:
                posted = _Posted(self.link.irecv_bytes(m, nbytes))
                self._posted[m] = posted
                threading.Thread(target=self._wait, args=(posted,), daemon=True,
                                 name="approxdist-ps-arrival").start()

    def _wait(self, posted: _Posted) -> None:
        try:
            posted.value = posted.handle.wait()
        except CommError as exc:
            posted.error = exc
        posted.at = time.monotonic()
        posted.done.set()
        self._any_done.set()

    def forget(self, member: int) -> None:
        """Stop expecting `member` (it died): its receive is left to fail or hang alone."""
        self._posted.pop(member, None)

    def next(self, timeout: float) -> tuple[int, torch.Tensor | None, CommError | None] | None:
        """(member, bytes, None) of the earliest completed receive, (member, None, error)
        of a failed one, or None if none completed within `timeout` seconds."""
        self._any_done.wait(timeout)
        self._any_done.clear()
        done = [m for m, p in self._posted.items() if p.done.is_set()]
        if not done:
            return None
        if len(done) > 1:
            self._any_done.set()  # the others are still there for the next call
        member = min(done, key=lambda m: self._posted[m].at)
        posted = self._posted.pop(member)
        return member, posted.value, posted.error
