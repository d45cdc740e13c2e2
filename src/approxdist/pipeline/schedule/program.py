"""One rank's asynchronous stream as the executor runs it, with its weights as actions (PipeDream, 2BW).

`AsyncSchedule` keeps the weight version of every forward and backward and the optimizer
steps beside its actions (what `check_versions` proves, PipeDream SOSP'19 and 2BW
ICML'21); `weave` writes them into a rank's list, so the executor needs no other data to
switch weights or step:

- `sVv` before a forward or backward that uses version v where the one before used
  another (a backward runs on its forward's version: weight stashing);
- `sUv`, the optimizer step making version v, after the backward that completes its
  gradient and the sends and receives that follow it (the stage before need not wait
  for the step to get its gradient), or on a replicated stage right after the `AR` that
  sums the gradient over the stage's replicas.

`check_program` holds a list to the version rules on paper, on its actions alone;
`stream_program` adds the pieces each trainer step runs (`stream_cut`'s, moved onto the
list: a `V` goes with the compute after it, a `U` with the backward or `AR` before it),
the sends waited for, the buffer window, and what the executor derives from the list
(which backward completes which step's gradient, where each version is last used).
The share of each micro-batch in its step's gradient and loss, and each stage's
gradient delay (what `optim.delay` lowers momentum for), are functions of the same data.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind, format_actions
from approxdist.pipeline.schedule.stream_cut import Cuts, buffer_window, send_waits, step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule, Update, gradient_delays

_DIRECTION = {Kind.SEND_ACT: "act", Kind.SEND_GRAD: "grad"}
#: a send the executor waits for at the end of a step: (direction, micro-batch)
SendKey = tuple[str, int]
_COMPUTE = (Kind.FORWARD, Kind.BACKWARD)


@dataclass(frozen=True)
class StreamProgram:
    """Rank `rank`'s stream: `actions` (with `V` and `U`); after trainer step b the first
    `cuts[b]` have run and the sends `waits[b]` were waited for (None: all of them); item n
    transfers through buffer n mod `window`; the backward at position i completes the
    gradient of step `takes[i]`, and versions `drops[i]` are not used after position i;
    `used` are the versions any forward or backward runs on."""

    schedule: AsyncSchedule
    rank: int
    actions: list[Action]
    cuts: list[int]
    waits: list[set[SendKey] | None]
    window: int
    takes: dict[int, Update]
    drops: dict[int, list[int]]
    used: frozenset[int]

    @property
    def stage(self) -> int:
        return self.schedule.stage_of(self.rank)


def weave(schedule: AsyncSchedule, rank: int) -> tuple[list[Action], list[int], dict[int, Update]]:
    """Rank `rank`'s list with its `V` and `U` actions; where each action of
    `schedule.order[rank]` (and its end) lands in it; the step whose gradient the backward
    at each position completes."""
    order = schedule.order[rank]
    after = {u.after: u for u in schedule.updates.get(rank, [])}
    reduced = any(a.kind is Kind.ALL_REDUCE for a in order)  # a replicated stage
    out: list[Action] = []
    start: list[int] = []
    takes: dict[int, Update] = {}
    pending: deque[Update] = deque()
    current = -1
    due: Action | None = None  # a step, made after the sends that follow its backward
    for i, a in enumerate(order):
        if due is not None and not (a.is_send or a.is_recv):
            out.append(due)
            due = None
        start.append(len(out))
        v = schedule.versions.get((rank, i))
        if v is not None and v != current:
            out.append(Action(a.stage, Kind.VERSION, v))
            current = v
        out.append(a)
        if a.kind is Kind.ALL_REDUCE:
            out.append(Action(a.stage, Kind.UPDATE, pending.popleft().version))
        elif i in after:
            takes[len(out) - 1] = after[i]
            if reduced:
                pending.append(after[i])
            else:
                due = Action(a.stage, Kind.UPDATE, after[i].version)
    out += [due] if due is not None else []
    start.append(len(out))
    assert not pending, f"rank {rank}: steps {[u.version for u in pending]} have no AR"
    return out, start, takes


def _broken(i: int, a: Action, what: str, rule: str, fix: str) -> ScheduleError:
    return ScheduleError(f"invalid program: action {i} ({a}) {what} (rule {rule}); {fix}")


def check_program(actions: list[Action], takes: dict[int, Update]) -> None:
    """The version rules on a rank's list (`ScheduleError` naming the first broken one):
    `versioned` (a `V` precedes the first forward or backward), `version-exists` (a `V`
    selects a version the `U`s made already, 0 being the initial weights), `stash` (a
    backward runs on its forward's version) and `update` (the `U`s make 1, 2, ... in order,
    each after the backward that completes its gradient, `takes`)."""
    made, current = 0, -1
    forward_on: dict[int, int] = {}
    complete: set[int] = set()  # versions whose step's gradient is complete
    for i, a in enumerate(actions):
        if a.kind is Kind.VERSION:
            if a.microbatch > made:
                raise _broken(i, a, f"selects version {a.microbatch} but the stage made "
                              f"{made} so far", "version-exists", "select it after its U")
            current = a.microbatch
        elif a.kind is Kind.UPDATE:
            if a.microbatch != made + 1 or a.microbatch not in complete:
                raise _broken(i, a, f"makes version {a.microbatch} after version {made}",
                              "update", "each U makes the next version after the backward "
                              "that completes its gradient")
            made += 1
        elif a.kind in _COMPUTE:
            if current < 0:
                raise _broken(i, a, "runs before any V", "versioned",
                              "put a V before the stage's first forward")
            if a.kind is Kind.FORWARD:
                forward_on[a.microbatch] = current
            elif forward_on.get(a.microbatch) != current:
                raise _broken(i, a, f"runs on version {current} but its forward ran on "
                              f"{forward_on.get(a.microbatch)}", "stash",
                              "a backward uses its forward's weights (weight stashing)")
            if i in takes:
                complete.add(takes[i].version)


def stream_program(schedule: AsyncSchedule, rank: int, cuts: Cuts | None = None
                   ) -> StreamProgram:
    """Rank `rank`'s program over `schedule`'s stream (`cuts`: `step_cuts(schedule)`)."""
    cuts = cuts if cuts is not None else step_cuts(schedule)
    actions, start, takes = weave(schedule, rank)
    check_program(actions, takes)
    last = schedule.stream.minibatches - 1
    waits: list[set[SendKey] | None] = [
        {(_DIRECTION[a.kind], a.microbatch) for a in sends} if b < last else None
        for b, sends in enumerate(send_waits(schedule, cuts)[rank])]
    used: dict[int, int] = {}  # version -> the position of its last forward or backward
    current = -1
    for i, a in enumerate(actions):
        if a.kind is Kind.VERSION:
            current = a.microbatch
        elif a.kind in _COMPUTE:
            used[current] = i
    drops: dict[int, list[int]] = {}
    for v, i in used.items():
        drops.setdefault(i, []).append(v)
    return StreamProgram(schedule, rank, actions, [start[e] for e in cuts[rank]], waits,
                         buffer_window(schedule, cuts), takes, drops, frozenset(used))


def format_programs(schedule: AsyncSchedule, with_comm: bool = False) -> str:
    """Each rank's list as the executor runs it, with its `V` and `U` (`schedule show`),
    checked; without `with_comm` the sends and receives are left out."""
    lines = ["as executed (V<v>: the next forwards and backwards run on version v; U<v>: the "
             "optimizer step making version v" + ("" if with_comm else "; sends and receives "
                                                  "not shown") + "):"]
    for r in sorted(schedule.order):
        actions, _, takes = weave(schedule, r)
        check_program(actions, takes)
        shown = [a for a in actions if with_comm or not (a.is_send or a.is_recv)]
        lines.append(f"rank {r}: {format_actions(shown)}")
    return "\n".join(lines)


def stage_weights(schedule: AsyncSchedule, stage: int, sizes: dict[int, int]) -> dict[int, float]:
    """Each micro-batch's share of the samples of `stage`'s optimiser step that applies its
    gradient (PipeDream: its round of r_s micro-batches, one per replica; 2BW: the
    mini-batch), for the steps whose micro-batches are all in `sizes`. The k-th steps of a
    stage's replicas are one step of the stage."""
    weights: dict[int, float] = {}
    for steps in zip(*(schedule.updates[r] for r in schedule.slots_of(stage))):
        if steps[0].items[0] not in sizes:  # another mini-batch's: skip it cheaply (a piece
            continue                        # asks once per trainer step, K steps a stream)
        items = [n for u in steps for n in u.items]
        if all(n in sizes for n in items):
            total = sum(sizes[n] for n in items)
            weights.update({n: sizes[n] / total for n in items})
    return weights


def loss_weights_by_update(schedule: AsyncSchedule, sizes: dict[int, int]) -> dict[int, float]:
    """Each micro-batch's loss weight: its share of the samples of the last stage's step that
    applies its gradient (PipeDream: 1 on one replica, each micro-batch is a step of its
    own; 2BW: its share of the mini-batch), for the micro-batches in `sizes`."""
    return stage_weights(schedule, schedule.num_stages - 1, sizes)


def stage_delays(schedule: AsyncSchedule) -> list[int]:
    """Per stage, the most optimiser steps between the version a gradient was computed at
    and the version it updates (over the stage's replicas, which step alike): what the
    delay rule (`optim.delay`) lowers each stage's momentum for."""
    delays = gradient_delays(schedule)
    return [max(delays[r] for r in schedule.slots_of(s)) for s in range(schedule.num_stages)]
