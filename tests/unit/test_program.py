"""An asynchronous stream's weights as actions (`schedule.program`), pure.

The program of a rank is its schedule's list with `V` (the version the next computes run
on) and `U` (the optimizer step making a version) woven in: without them it is the
schedule's list, the pieces are `stream_cut`'s, every step and version of the schedule's
data is there, and `check_program` refuses a list that breaks a version rule.
"""

from __future__ import annotations

import pytest

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind, format_actions, parse_actions
from approxdist.pipeline.schedule.program import check_program, stream_program, weave
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.stream_cut import buffer_window, step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule
from approxdist.topology.dealing import Dealing

WEIGHTS = (Kind.VERSION, Kind.UPDATE)
SHAPES = [(name, p, m, k, None) for name in ("pipedream", "pipedream-vsync", "2bw")
          for p in (1, 2, 3, 4) for m in (3, 4) for k in (1, 2, 3)
          if not (name == "2bw" and m < p - 1)]
SHAPES += [(name, 2, 4, k, (2, 1)) for name in ("pipedream", "2bw") for k in (1, 3)]
SHAPES += [("2bw", 3, 2, 3, (1, 2, 1))]


def _build(name: str, p: int, m: int, k: int, replicas: tuple[int, ...] | None) -> AsyncSchedule:
    return build_async_schedule(name, p, m, k, dealing=Dealing(replicas) if replicas else None)


@pytest.mark.parametrize("name,p,m,k,replicas", SHAPES)
def test_a_program_is_its_schedule_with_every_version_and_step(
        name: str, p: int, m: int, k: int, replicas: tuple[int, ...] | None) -> None:
    s = _build(name, p, m, k, replicas)
    cuts = step_cuts(s)
    for r, order in s.order.items():
        prog = stream_program(s, r, cuts)
        plain = [a for a in prog.actions if a.kind not in WEIGHTS]
        assert plain == order
        # the pieces are stream_cut's: each piece without V and U is that step's prefix
        assert len(prog.cuts) == k and prog.cuts[-1] == len(prog.actions)
        for b in range(k):
            assert [a for a in prog.actions[:prog.cuts[b]] if a.kind not in WEIGHTS] \
                == order[:cuts[r][b]]
        assert [a.microbatch for a in prog.actions if a.kind is Kind.UPDATE] \
            == [u.version for u in s.updates[r]]
        # each compute runs on the version the schedule names for it
        current, i = -1, 0
        for a in prog.actions:
            if a.kind is Kind.VERSION:
                current = a.microbatch
            elif a.kind not in WEIGHTS:
                assert s.versions.get((r, i), current) == current, (r, i, a)
                i += 1
        # a step's gradient is taken at its last backward; a version is dropped once
        assert {u.version for u in prog.takes.values()} == {u.version for u in s.updates[r]}
        assert all(prog.actions[i].kind is Kind.BACKWARD for i in prog.takes)
        dropped = [v for vs in prog.drops.values() for v in vs]
        assert sorted(dropped) == sorted(prog.used) and len(set(dropped)) == len(dropped)


def test_2bw_on_two_stages_as_executed() -> None:
    s = build_async_schedule("2bw", 2, 2, 3)
    compute = {r: format_actions([a for a in weave(s, r)[0] if not (a.is_send or a.is_recv)])
               for r in s.order}
    assert compute[0] == "0V0 0F0 0F1 0B0 0F2 0B1 0U1 0F3 0B2 0V1 0F4 0V0 0B3 0U2 0V1 0F5 " \
                         "0B4 0B5 0U3"
    assert compute[1] == "1V0 1F0 1B0 1F1 1B1 1U1 1F2 1B2 1F3 1B3 1U2 1V1 1F4 1B4 1F5 1B5 1U3"


def test_a_replicated_stage_steps_after_its_all_reduce() -> None:
    s = build_async_schedule("2bw", 2, 4, 3, dealing=Dealing((2, 1)))
    for r in s.slots_of(0):
        actions = weave(s, r)[0]
        reduces = [i for i, a in enumerate(actions) if a.kind is Kind.ALL_REDUCE]
        assert reduces and all(actions[i + 1].kind is Kind.UPDATE for i in reduces)
        assert sum(a.kind is Kind.UPDATE for a in actions) == len(reduces)


def test_weight_actions_print_and_parse() -> None:
    assert [str(a) for a in parse_actions("0V1 2U3")] == ["0V1", "2U3"]
    assert Action.parse("1U2") == Action(1, Kind.UPDATE, 2)


def _broken(text: str, takes_at: dict[int, int]) -> None:
    s = build_async_schedule("2bw", 2, 2, 3)
    update = {u.version: u for u in s.updates[0]}
    check_program(parse_actions(text), {i: update[v] for i, v in takes_at.items()})


def test_check_program_names_the_broken_rule() -> None:
    _broken("0V0 0F0 0F1 0B0 0B1 0U1 0V1 0F2", {4: 1})  # a valid start
    with pytest.raises(ScheduleError, match=r"action 0 \(0F0\) runs before any V \(rule "
                                            r"versioned\)"):
        _broken("0F0 0B0", {})
    with pytest.raises(ScheduleError, match=r"0V1\) selects version 1 but the stage made 0 so "
                                            r"far \(rule version-exists\)"):
        _broken("0V1 0F0", {})
    with pytest.raises(ScheduleError, match=r"0B0\) runs on version 1 but its forward ran on 0 "
                                            r"\(rule stash\)"):
        _broken("0V0 0F0 0F1 0B1 0U1 0V1 0B0", {3: 1})
    with pytest.raises(ScheduleError, match=r"0U1\) makes version 1 after version 0 \(rule "
                                            r"update\)"):
        _broken("0V0 0F0 0U1 0B0", {3: 1})  # before the backward completing its gradient
    with pytest.raises(ScheduleError, match=r"rule update"):
        _broken("0V0 0F0 0B0 0U2", {2: 2})  # not the next version


def test_a_program_keeps_the_schedule_data() -> None:
    s = build_async_schedule("pipedream", 3, 3, 2)
    prog = stream_program(s, 1)
    assert prog.stage == 1 and prog.rank == 1 and prog.schedule is s
    assert prog.waits[-1] is None and all(w is not None for w in prog.waits[:-1])
    assert prog.window == buffer_window(s, step_cuts(s))
