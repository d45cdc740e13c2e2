"""Where an asynchronous stream pauses between trainer steps (`schedule.stream_cut`), pure.

The pieces must be safe (closed under dependencies: a forward or backward in step b only
consumes data sent within step b or earlier; no forward of stage 0 needs a later
mini-batch), maximal (the next action of every rank is blocked), grow to the whole lists,
and the send waits and buffer window must never make a rank wait for a receive posted
later or reuse a buffer an item still holds.
"""

from __future__ import annotations

import pytest

from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.stream_cut import (
    buffer_window,
    loss_versions,
    send_waits,
    step_cuts,
    step_of,
)
from approxdist.pipeline.schedule.versions import AsyncSchedule

SHAPES = [(name, p, m, k) for name in ("pipedream", "pipedream-vsync", "2bw")
          for p in (1, 2, 3, 4) for m in (3, 4) for k in (1, 2, 5)]


def _where(s: AsyncSchedule) -> dict[Action, tuple[int, int]]:
    return {a: (r, i) for r, actions in s.order.items() for i, a in enumerate(actions)}


def _feed(a: Action, p: int) -> Action | None:
    if a.kind is Kind.FORWARD and a.stage > 0:
        return Action(a.stage - 1, Kind.SEND_ACT, a.microbatch)
    if a.kind is Kind.BACKWARD and a.stage < p - 1:
        return Action(a.stage + 1, Kind.SEND_GRAD, a.microbatch)
    return None


def _blocked(s: AsyncSchedule, a: Action, b: int, ends: dict[int, int],
             where: dict[Action, tuple[int, int]]) -> bool:
    m = s.stream.microbatches
    if a.kind is Kind.FORWARD and a.stage == 0 and a.microbatch >= (b + 1) * m:
        return True
    feed = _feed(a, s.num_stages)
    return feed is not None and where[feed][1] >= ends[where[feed][0]]


@pytest.mark.parametrize("name,p,m,k", SHAPES)
def test_pieces_are_closed_maximal_and_grow_to_the_whole_stream(name: str, p: int, m: int,
                                                                k: int) -> None:
    if name == "2bw" and m < p - 1:
        return
    s = build_async_schedule(name, p, m, k)
    cuts, where = step_cuts(s), _where(s)
    for b in range(k):
        ends = {r: cuts[r][b] for r in s.order}
        for r, actions in s.order.items():
            assert all(not _blocked(s, a, b, ends, where) for a in actions[:ends[r]]), (r, b)
            if ends[r] < len(actions):  # maximal: the rank stops at an action it cannot run
                assert _blocked(s, actions[ends[r]], b, ends, where), (r, b)
    assert all(cuts[r][-1] == len(s.order[r]) for r in s.order)
    assert all(c == sorted(c) for c in cuts.values())


def test_pipedream_step_zero_stops_stage_zero_before_the_next_minibatch() -> None:
    s = build_async_schedule("pipedream", 4, 4, 3)
    cuts = step_cuts(s)
    next_forward = s.order[0][cuts[0][0]]
    assert next_forward == Action(0, Kind.FORWARD, 4)
    # the last stage ran every micro-batch of mini-batch 0 forward and backward
    ran = s.order[3][:cuts[3][0]]
    assert [a.microbatch for a in ran if a.kind is Kind.BACKWARD] == [0, 1, 2, 3]


@pytest.mark.parametrize("name,p,m,k", SHAPES)
def test_sends_are_waited_in_the_step_their_receive_is_posted(name: str, p: int, m: int,
                                                              k: int) -> None:
    if name == "2bw" and m < p - 1:
        return
    s = build_async_schedule(name, p, m, k)
    cuts, where = step_cuts(s), _where(s)
    waits = send_waits(s, cuts)
    seen = set()
    for r, per_step in waits.items():
        for b, sends in enumerate(per_step):
            for a in sends:
                assert a not in seen
                seen.add(a)
                i = where[a][1]
                peer, j = where[a.matching()]
                assert step_of(cuts[r], i) <= b and step_of(cuts[peer], j) <= b
                assert b == max(step_of(cuts[r], i), step_of(cuts[peer], j))
    assert seen == {a for actions in s.order.values() for a in actions if a.is_send}


@pytest.mark.parametrize("name,p,m,k", SHAPES)
def test_buffer_window_never_hands_a_held_buffer_to_a_later_item(name: str, p: int, m: int,
                                                                 k: int) -> None:
    if name == "2bw" and m < p - 1:
        return
    s = build_async_schedule(name, p, m, k)
    cuts = step_cuts(s)
    window = buffer_window(s, cuts)
    waits = send_waits(s, cuts)
    for r, actions in s.order.items():
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, a in enumerate(actions):
            first.setdefault(a.microbatch, i)
            last[a.microbatch] = i
        for b, sends in enumerate(waits[r]):
            for a in sends:
                last[a.microbatch] = max(last[a.microbatch], cuts[r][b] - 1)
        for n, start in first.items():
            older = n - window
            if older in last:  # item n reuses item n - window's buffer: it must be free
                assert last[older] < start, (r, n, window)
    assert window <= s.stream.items


def test_loss_versions_name_the_versions_of_each_steps_loss() -> None:
    s = build_async_schedule("2bw", 2, 2, 4)
    rows = loss_versions(s, step_cuts(s))
    assert len(rows) == 4
    # 2BW: every micro-batch of mini-batch b runs with version max(b - 1, 0) on every stage
    for row in rows:
        for lo, hi in row:
            assert lo == hi or lo == -1
    flat = [row[0][0] for row in rows if row[0][0] >= 0]
    assert flat == sorted(flat) and flat[0] == 0 and flat[-1] == 2


def test_weight_versions_that_do_not_fit_are_refused_in_one_line() -> None:
    from torch import nn

    from approxdist.pipeline.errors import PipelineError
    from approxdist.pipeline.weights import check_version_memory

    module = nn.Linear(256, 256)  # 257 KiB of parameters
    need = check_version_memory(module, 3, 0, "pipedream", free=None)
    assert need == 3 * (256 * 256 + 256) * 4
    assert check_version_memory(module, 3, 0, "pipedream", free=need) == need
    with pytest.raises(PipelineError, match=r"^pipedream keeps up to 3 weight version\(s\) on "
                       r"stage 0: 0\.8 MiB, but only 0\.5 MiB are free; use 2bw") as info:
        check_version_memory(module, 3, 0, "pipedream", free=2**19)
    assert "\n" not in str(info.value)
