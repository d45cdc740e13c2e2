"""An ordered set of ranks that talk among themselves: the world, a stage's replicas, a pipeline.

Everything that communicates (links, all-reduces, `DataParallel`, pipeline stages) is
handed a `Group` and numbers its peers *inside* it: member `i` of a group is global rank
`group.ranks[i]`, and `group.rank` is this process's index. Nothing below the launcher
asks torch.distributed for the world's size or rank, so the same code runs on the whole
world, on a stage's replicas or on a pipeline placed on ranks [2, 0, 3] (picotron's
process-group manager; torch.distributed.pipelining's `stage_index_to_group_rank`).

A group owns one torch.distributed process group, its *lane*: messages and
collectives of different lanes never match each other. `fork()` hands out another
lane over the same members (communication threads each need their own) and
`release()` gives it back; the members fork and release in the same order. Creating a
process group is a collective over the whole world (torch.distributed's rule; its
members-only variant names groups by how many each rank already has, which differs
between ranks that belong to different sub-groups), so a sub-group's spare lanes are
made with it: `new_group(ctx, ranks, lanes=k)`. Only the world's own lanes are made
on demand, when every rank forks (every rank is a member). torch numbers a group's
members in sorted order whatever order they were given in; `Group` keeps that mapping
(`backend_rank`) so callers never see it. `approxdist.topology.make_groups` calls
`new_group` for every group of a topology, once, in the same order on every rank.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from approxdist.errors import CommError, ConfigError
from approxdist.launch.context import DistContext


def check_ranks(ranks: Sequence[int], world_size: int, what: str = "group") -> tuple[int, ...]:
    """`ranks` as a tuple, or `ConfigError` if they are empty, repeated or outside the world."""
    out = tuple(int(r) for r in ranks)
    if not out:
        raise ConfigError(f"{what} has no ranks; name at least one of 0..{world_size - 1}")
    outside = [r for r in out if not 0 <= r < world_size]
    if outside:
        raise ConfigError(f"{what} names rank(s) {', '.join(map(str, outside))} outside the world "
                          f"of {world_size} ranks (0..{world_size - 1}); use ranks in that range "
                          f"or start more workers (--world-size)")
    repeated = sorted({r for r in out if out.count(r) > 1})
    if repeated:
        raise ConfigError(f"{what} names rank(s) {', '.join(map(str, repeated))} more than once "
                          f"({list(out)}); give each rank once")
    return out


class Group:
    """This process's view of an ordered set of global ranks and one lane among them."""

    def __init__(self, ranks: Sequence[int], me: int, pg: Any = None, *, name: str = "world",
                 backend_ranks: Sequence[int] | None = None,
                 spares: collections.deque[Any] | None = None,
                 timeout_s: float | None = None) -> None:
        """`timeout_s`: the collective timeout of the lanes `fork()` makes (None: torch's
        default); a new lane must not wait longer on a lost peer than the job's own."""
        self.ranks = tuple(int(r) for r in ranks)
        if me not in self.ranks:
            raise CommError(f"rank {me} is not a member of {name} (ranks {list(self.ranks)})")
        self.me, self.name = me, name
        self.rank = self.ranks.index(me)
        self._pg = pg  # None: the default (world) group of torch.distributed, if any
        self._backend = tuple(backend_ranks) if backend_ranks is not None else self.ranks
        #: lanes over the same members not in use, shared by every fork of this group
        self._spares: collections.deque[Any] = spares if spares is not None else collections.deque()
        self._forked = False
        self._lane_timeout_s = timeout_s

    # -- who is who -------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def root(self) -> int:
        """The global rank of member 0 (broadcasts start there)."""
        return self.ranks[0]

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def global_rank(self, member: int) -> int:
        """The global rank of member `member` (an index in this group)."""
        return self.ranks[member]

    def member(self, global_rank: int) -> int:
        """The index in this group of `global_rank` (`CommError` if it is not a member)."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise CommError(f"rank {global_rank} is not a member of {self.describe()}") from None

    def backend_rank(self, member: int) -> int:
        """The rank torch.distributed gives member `member` inside this group's lane."""
        return self._backend[member]

    def lost_ranks(self) -> frozenset[int]:
        """Members known to have died (only a `launch.survivors.SurvivorGroup` knows any)."""
        return frozenset()

    def describe(self) -> str:
        return f"{self.name} (global ranks {', '.join(map(str, self.ranks))})"

    def __repr__(self) -> str:
        return f"Group({self.name!r}, ranks={list(self.ranks)}, rank={self.rank})"

    # -- the lane -----------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        """Whether messages can flow: more than one member and a process group exists."""
        return self.size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def pg(self) -> Any:
        """The torch.distributed process group of this lane."""
        return self._pg if self._pg is not None else dist.group.WORLD

    @property
    def spare_lanes(self) -> int:
        return len(self._spares)

    def fork(self, name: str | None = None) -> Group:
        """Another lane over the same members: a spare one, or for the world a new one.

        Every member calls it, in the same order; `release()` the result when done.
        """
        label = name or self.name
        if not self.distributed:
            return Group(self.ranks, self.me, self._pg, name=label, backend_ranks=self._backend,
                         spares=self._spares, timeout_s=self._lane_timeout_s)
        if self._spares:
            pg = self._spares.popleft()
        elif sorted(self.ranks) == list(range(dist.get_world_size())):
            # every rank is a member and forks with us
            pg = dist.new_group(list(self.ranks), timeout=_timeout(self._lane_timeout_s))
        else:
            raise CommError(f"{self.describe()} has no spare lane left; create it with more "
                            f"(new_group(ctx, ranks, lanes=N) gives N - 1 to fork; DataParallel "
                            f"with T communication threads forks T + 1)")
        forked = Group(self.ranks, self.me, pg, name=label, backend_ranks=self._backend,
                       spares=self._spares, timeout_s=self._lane_timeout_s)
        forked._forked = True
        return forked

    def release(self) -> None:
        """Give a lane from `fork()` back to the group's spares (members in the same order)."""
        if self._forked:
            self._forked = False
            self._spares.append(self._pg)

    # -- small collectives over the members ----------------------------------------------
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Member `root`'s `obj` on every member."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[root], group=self._pg)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's `obj`, in member order."""
        if not self.distributed:
            return [obj]
        every: list[Any] = [None] * self.size
        dist.all_gather_object(every, obj, group=self._pg)
        return [every[self._backend[i]] for i in range(self.size)]

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the members in place (exact, the backend's own all-reduce)."""
        if self.distributed:
            dist.all_reduce(t, group=self._pg)
        return t

    def broadcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Member `root`'s `t` into every member's `t`, in place."""
        if self.distributed:
            dist.broadcast(t, src=self.ranks[root], group=self._pg)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self._pg)


def _backend_ranks(pg: Any, ranks: Sequence[int]) -> tuple[int, ...]:
    return tuple(dist.get_group_rank(pg, r) for r in ranks)


def world_group(ctx: DistContext) -> Group:
    """Every rank of the job, in rank order, on torch.distributed's default lane."""
    return Group(range(ctx.world_size), ctx.rank, name="world", timeout_s=ctx.timeout_s)


def new_group(ctx: DistContext, ranks: Sequence[int], name: str = "group",
              lanes: int = 1) -> Group | None:
    """A sub-group of `ranks` in the given order with `lanes` lanes (one to use, the
    rest spares for `fork()`); None on ranks outside it.

    A collective over the whole world: every rank calls it with the same arguments, in
    the same order (torch.distributed's rule for `new_group`).
    """
    members = check_ranks(ranks, ctx.world_size, name)
    if lanes < 1:
        raise ConfigError(f"{name}: lanes = {lanes} must be >= 1")
    if not (ctx.distributed and dist.is_initialized()):
        return Group(members, ctx.rank, name=name) if ctx.rank in members else None
    # torch gives a new group its default timeout (30 min), not the world's: pass the job's
    pgs = [dist.new_group(sorted(members), timeout=_timeout(ctx.timeout_s)) for _ in range(lanes)]
    if ctx.rank not in members:
        return None
    return Group(members, ctx.rank, pgs[0], name=name,
                 backend_ranks=_backend_ranks(pgs[0], members), spares=collections.deque(pgs[1:]),
                 timeout_s=ctx.timeout_s)


def _timeout(seconds: float | None) -> datetime.timedelta | None:
    return None if seconds is None else datetime.timedelta(seconds=seconds)
