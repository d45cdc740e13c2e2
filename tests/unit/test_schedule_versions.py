"""`check_versions` catches hand-made asynchronous schedules that break a version rule and
names the rank, the action and the rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import (
    Action,
    AsyncSchedule,
    Kind,
    Order,
    Stream,
    Update,
    build_async_schedule,
    check_versions,
    parse_actions,
    validate_versions,
)
from approxdist.pipeline.schedule.action import format_actions
from approxdist.pipeline.schedule.one_f_one_b import stage_order
from approxdist.pipeline.schedule.versions import assign_versions, peak_versions


def _rules(s: AsyncSchedule) -> list[tuple[str, int, str]]:
    return [(v.rule, v.rank, str(v.action)) for v in check_versions(s)]


def _slot(s: AsyncSchedule, rank: int, text: str) -> tuple[int, int]:
    return (rank, s.order[rank].index(Action.parse(text)))


def test_hand_written_schedule_with_versions_is_valid() -> None:
    """Two stages, one micro-batch each of two mini-batches, a step after each backward."""
    order: Order = {0: parse_actions("0F0 0SF0 0RB0 0B0 0F1 0SF1 0RB1 0B1"),
                    1: parse_actions("1RF0 1F0 1B0 1SB0 1RF1 1F1 1B1 1SB1")}
    versions = {(0, 0): 0, (0, 3): 0, (0, 4): 1, (0, 7): 1,
                (1, 1): 0, (1, 2): 0, (1, 5): 1, (1, 6): 1}
    updates = {0: [Update(0, 3, 1, (0,), 0), Update(0, 7, 2, (1,), 1)],
               1: [Update(1, 2, 1, (0,), 0), Update(1, 6, 2, (1,), 1)]}
    s = AsyncSchedule("hand", 2, Stream(1, 2), order, versions, updates, {0: 1, 1: 1})
    assert check_versions(s) == []
    validate_versions(s)


def test_backward_with_another_version_than_its_forward() -> None:
    s = build_async_schedule("pipedream", 2, 2, 2)
    slot = _slot(s, 0, "0B1")
    assert s.versions[slot] == 0
    bad = replace(s, versions={**s.versions, slot: 1})
    assert _rules(bad) == [("stash", 0, "0B1")]
    with pytest.raises(ScheduleError, match=r"invalid asynchronous schedule 'pipedream': rank 0: "
                                            r"0B1 uses version 1 but 0F1 ran with version 0 "
                                            r"\(rule stash\); a backward uses its forward's "
                                            r"weights \(weight stashing\): give 0B1 version 0"):
        validate_versions(bad)


def test_a_step_must_state_the_version_its_gradient_was_computed_at() -> None:
    """2BW's step after mini-batch 1 applies gradients computed at v0; claiming v1 is caught."""
    s = build_async_schedule("2bw", 2, 2, 3)
    step = s.updates[1][1]
    assert (step.version, step.computed_at) == (2, 0)
    bad = replace(s, updates={**s.updates, 1: [s.updates[1][0], replace(step, computed_at=1),
                                               s.updates[1][2]]})
    rules = _rules(bad)
    assert rules[0] == ("update", 1, "1B3") and len(rules) == 2  # micro-batches 2 and 3
    assert "computed at version 1 but 1B2 used 0" in str(check_versions(bad)[0])


def test_forward_with_a_version_not_made_yet() -> None:
    s = build_async_schedule("pipedream", 2, 2, 2)
    bad = replace(s, versions={**s.versions, _slot(s, 1, "1F1"): 2,
                               _slot(s, 1, "1B1"): 2})
    assert _rules(bad) == [("version-exists", 1, "1F1"), ("version-exists", 1, "1B1")]
    assert "1F1 uses version 2 but stage 1 has made versions 0..1 so far" in str(
        check_versions(bad)[0])


def test_stage_with_too_many_versions() -> None:
    """The last stage may hold 1 version under PipeDream; running a second forward before the
    first backward and stepping in between makes it hold 2."""
    compute: Order = {0: parse_actions("0F0 0F1 0B0 0F2 0B1 0B2"),
                      1: parse_actions("1F0 1F1 1B0 1F2 1B1 1B2")}
    s = assign_versions("pipedream", 2, Stream(3, 1), compute, lambda stage, n, newest: newest,
                        lambda n: True, {0: 2, 1: 1})
    assert peak_versions(s) == {0: 2, 1: 2}
    assert _rules(s) == [("versions-alive", 1, "1B0")]
    with pytest.raises(ScheduleError, match=r"rank 1: 2 weight versions alive after 1B0 "
                                            r"\(0, 1\), more than pipedream's limit of 1 on "
                                            r"stage 1 \(rule versions-alive\)"):
        validate_versions(s)


def test_2bw_limit_with_forwards_on_the_newest_version() -> None:
    """2BW holds 2 versions because its forwards run one version behind and step once per
    mini-batch; forwards on the newest version with a step per micro-batch (one micro-batch
    per mini-batch, 3 stages) keep three on stage 0."""
    stream = Stream(1, 4)
    compute: Order = {s: stage_order(s, 3, 4) for s in range(3)}
    s = assign_versions("2bw", 3, stream, compute, lambda stage, n, newest: newest,
                        lambda n: True, {s: 2 for s in range(3)})
    assert peak_versions(s)[0] == 3
    assert _rules(s) == [("versions-alive", 0, "0B1")]
    assert "3 weight versions alive after 0B1 (0, 1, 2), more than 2bw's limit of 2" in str(
        check_versions(s)[0])


def test_step_after_a_send_and_a_gradient_never_applied() -> None:
    compute: Order = {0: parse_actions("0F0 0B0 0F1 0B1"), 1: parse_actions("1F0 1B0 1F1 1B1")}
    s = assign_versions("hand", 2, Stream(1, 2), compute, lambda stage, n, newest: 0,
                        lambda n: n == 0, {0: 2, 1: 2})  # one step, after micro-batch 0
    assert format_actions(s.order[1]) == "1RF0 1F0 1RF1 1B0 1SB0 1F1 1B1 1SB1"
    # move stage 1's step from after 1B0 to after 1SB0; micro-batch 1 is never applied
    step = s.updates[1][0]
    bad = replace(s, updates={**s.updates, 1: [replace(step, after=step.after + 1)]})
    rules = _rules(bad)
    assert ("update", 1, "1SB0") in rules
    assert ("update", 1, "1B1") in rules  # the gradient of 1B1 is never applied
    assert rules.count(("update", 0, "0B1")) == 1


def test_missing_version_and_version_on_a_send() -> None:
    s = build_async_schedule("2bw", 2, 1, 2)
    f0 = _slot(s, 0, "0F0")
    versions = {k: v for k, v in s.versions.items() if k != f0}
    versions[_slot(s, 0, "0SF0")] = 0
    rules = _rules(replace(s, versions=versions))
    assert rules == [("versioned", 0, "0F0"), ("versioned", 0, "None")]


def test_structure_rules_still_apply() -> None:
    """`check_versions` includes every rule of `check_schedule` (here: a missing send)."""
    s = build_async_schedule("pipedream", 2, 1, 2)
    order = {**s.order, 0: [a for a in s.order[0] if a != Action(0, Kind.SEND_ACT, 1)]}
    versions = {(r, order[r].index(s.order[r][i])): v for (r, i), v in s.versions.items()}
    updates = {r: [replace(u, after=order[r].index(s.order[r][u.after])) for u in us]
               for r, us in s.updates.items()}
    assert _rules(replace(s, order=order, versions=versions, updates=updates)) == [
        ("matched", 0, "0SF1")]
