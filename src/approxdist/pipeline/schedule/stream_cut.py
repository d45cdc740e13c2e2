"""Where an asynchronous stream pauses between the trainer's steps (PipeDream, PipeDream-2BW).

The trainer hands a pipeline one mini-batch per step; an asynchronous schedule runs a
stream of K mini-batches with no flush. So each rank executes its actions in pieces:
during step b it runs the longest prefix of its list that needs no data of a later
mini-batch, directly or through a neighbour. The pieces are computed here, as data:

- `step_cuts`: per rank, the end (exclusive) of its prefix after each step. A forward
  of stage 0 needs its mini-batch's inputs; a forward of stage s > 0 needs the matching
  send of stage s - 1 inside that stage's prefix; a backward of stage s < P - 1 needs
  the matching send of stage s + 1 likewise. The prefixes shrink from the full lists to
  the fixed point (an `AR` of a replicated stage, a collective, needs the same
  all-reduce's `AR` inside every replica's prefix), so the result is the largest set of
  prefixes that is closed under these dependencies: executing it cannot deadlock (each
  blocking action's data is sent within the same step), and no rank stops earlier than
  it has to. The last step's prefix is the whole list (the stream drains).
- `send_waits`: the sends a rank waits for at the end of each step: those whose
  receive its peer posts within the same step. A send whose receive is posted in a
  later step stays pending across the step boundary (waiting for it would deadlock).
- `buffer_window`: how many micro-batch buffers a rank's transfers cycle through
  (buffer of item n = n mod window), so no buffer is reused while an item that
  received into it is still in flight or a send from it is still pending.
"""

from __future__ import annotations

import bisect

from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.schedule.versions import AsyncSchedule

Cuts = dict[int, list[int]]  # rank -> end of its prefix after step b, for b in 0..K-1


def step_cuts(schedule: AsyncSchedule) -> Cuts:
    """Per rank, the end (exclusive) of the actions it has run after each of the K steps."""
    m, k = schedule.stream.microbatches, schedule.stream.minibatches
    where = _positions(schedule)
    reduces = _reduce_peers(schedule)
    cuts: Cuts = {r: [] for r in schedule.order}
    done = {r: 0 for r in schedule.order}  # each step's prefixes contain the previous step's
    for b in range(k):
        limit = (b + 1) * m  # items of later mini-batches have no data yet
        ends = {r: len(actions) for r, actions in schedule.order.items()}
        changed = True
        while changed:
            changed = False
            for r, actions in schedule.order.items():
                end = _first_blocked(r, actions, done[r], ends, where, reduces, limit,
                                     schedule.num_stages)
                if end < ends[r]:
                    ends[r], changed = end, True
        done = dict(ends)
        for r in schedule.order:
            cuts[r].append(ends[r])
    for r, ends_r in cuts.items():
        assert ends_r == sorted(ends_r) and ends_r[-1] == len(schedule.order[r]), \
            f"rank {r}'s prefixes {ends_r} do not grow to its whole list"
    return cuts


def _positions(schedule: AsyncSchedule) -> dict[Action, tuple[int, int]]:
    """Action -> (rank, index); every action of a stream is unique."""
    return {a: (r, i) for r, actions in schedule.order.items() for i, a in enumerate(actions)}


def _reduce_peers(schedule: AsyncSchedule) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(slot, index) of each `AR` -> (slot, index) of the same all-reduce's `AR` on every
    replica of the stage (the k-th `AR` of each)."""
    by_k: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, actions in schedule.order.items():
        reduces = [i for i, a in enumerate(actions) if a.kind is Kind.ALL_REDUCE]
        for k, i in enumerate(reduces):
            by_k.setdefault((schedule.stage_of(r), k), []).append((r, i))
    return {member: group for group in by_k.values() for member in group}


def _first_blocked(rank: int, actions: list[Action], start: int, ends: dict[int, int],
                   where: dict[Action, tuple[int, int]],
                   reduces: dict[tuple[int, int], list[tuple[int, int]]], limit: int,
                   num_stages: int) -> int:
    """The first action from `start` on that cannot run within the prefixes `ends`."""
    for i in range(start, ends[rank]):
        a = actions[i]
        if a.kind is Kind.FORWARD and a.stage == 0 and a.microbatch >= limit:
            return i
        if any(j >= ends[peer] for peer, j in reduces.get((rank, i), [])):
            return i
        feed = _feeding_send(a, num_stages)
        if feed is not None:
            peer, index = where[feed]
            if index >= ends[peer]:
                return i
    return ends[rank]


def _feeding_send(a: Action, num_stages: int) -> Action | None:
    """The send whose data the forward or backward `a` consumes (None at the pipeline ends)."""
    if a.kind is Kind.FORWARD and a.stage > 0:
        return Action(a.stage - 1, Kind.SEND_ACT, a.microbatch)
    if a.kind is Kind.BACKWARD and a.stage < num_stages - 1:
        return Action(a.stage + 1, Kind.SEND_GRAD, a.microbatch)
    return None


def step_of(cuts: list[int], index: int) -> int:
    """The step during which the action at `index` runs."""
    return bisect.bisect_right(cuts, index)


def send_waits(schedule: AsyncSchedule, cuts: Cuts) -> dict[int, list[list[Action]]]:
    """Per rank and step, the sends to wait for at the end of that step: every send whose
    matching receive the peer posts by the end of the step and that was not waited for
    before."""
    where = _positions(schedule)
    k = schedule.stream.minibatches
    waits: dict[int, list[list[Action]]] = {}
    for r, actions in schedule.order.items():
        per_step: list[list[Action]] = [[] for _ in range(k)]
        for i, a in enumerate(actions):
            if not a.is_send:
                continue
            peer, j = where[a.matching()]
            per_step[max(step_of(cuts[r], i), step_of(cuts[peer], j))].append(a)
        waits[r] = per_step
    return waits


def buffer_window(schedule: AsyncSchedule, cuts: Cuts) -> int:
    """The fewest buffers per (direction, rank) such that item n's buffer n mod window is
    free again when item n + window needs it: on every rank, an item holds its buffers
    from its first action until its last action ran and its sends were waited for."""
    waits = send_waits(schedule, cuts)
    window = 1
    for r, actions in schedule.order.items():
        held: dict[int, list[int]] = {}  # item -> [first index, last index holding a buffer]
        for i, a in enumerate(actions):
            if a.kind is Kind.ALL_REDUCE:  # sums the stage's gradients, no buffer
                continue
            span = held.setdefault(a.microbatch, [i, i])
            span[1] = i
        for b, sends in enumerate(waits[r]):
            for a in sends:  # a pending send holds its buffer to the end of the step it is waited
                held[a.microbatch][1] = max(held[a.microbatch][1], cuts[r][b] - 1)
        items = sorted(held)
        firsts = [held[n][0] for n in items]
        assert firsts == sorted(firsts), f"rank {r} starts its items out of order"
        for q in items:  # the newest item that starts while item q still holds its buffer
            newest = items[bisect.bisect_right(firsts, held[q][1]) - 1]
            window = max(window, newest - q + 1)
    return window


def loss_versions(schedule: AsyncSchedule, cuts: Cuts) -> list[list[tuple[int, int]]]:
    """Per step, per stage, the (oldest, newest) weight version of the forwards that produced
    the step's loss: those of the micro-batches whose last-stage forward ran in the step, on
    any replica of the last stage ((-1, -1) for a step in which the last stage ran none)."""
    forward_at = {(schedule.stage_of(r), a.microbatch): schedule.versions[(r, i)]
                  for r, actions in schedule.order.items()
                  for i, a in enumerate(actions) if a.kind is Kind.FORWARD}
    out: list[list[tuple[int, int]]] = []
    for b in range(schedule.stream.minibatches):
        items = []
        for r in schedule.slots_of(schedule.num_stages - 1):
            start = cuts[r][b - 1] if b else 0
            items += [a.microbatch for a in schedule.order[r][start:cuts[r][b]]
                      if a.kind is Kind.FORWARD]
        row = []
        for s in range(schedule.num_stages):
            used = [forward_at[(s, n)] for n in items]
            row.append((min(used), max(used)) if used else (-1, -1))
        out.append(row)
    return out
