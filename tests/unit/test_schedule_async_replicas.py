"""Asynchronous schedules on replicated stages as data (no processes): dealing, lockstep steps,
`AR` placement, version limits, the validator's rules `dealt`, `deadlock` and `lockstep`,
and the stream's pieces waiting for a stage's all-reduce together."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind, format_actions
from approxdist.pipeline.schedule.check_versions import check_versions
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.stream_cut import loss_versions, step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule, peak_versions
from approxdist.topology.dealing import Dealing

TOPOLOGIES = [(2, 1), (1, 2), (2, 2), (3, 1), (1, 2, 1), (2, 1, 1, 1), (1, 1, 3), (3, 3, 1)]


def _build(name: str, replicas: tuple[int, ...], m: int, k: int) -> AsyncSchedule:
    return build_async_schedule(name, len(replicas), m, k, dealing=Dealing(replicas))


def _rules(s: AsyncSchedule) -> list[tuple[str, int, str]]:
    return [(v.rule, v.rank, str(v.action)) for v in check_versions(s)]


def test_pipedream_2_1_golden_lists() -> None:
    """Stage 0's replicas each take every other micro-batch and step after each backward, at
    the `AR` right before the next forward (which uses the new version); stage 1 steps after
    every backward, as without replicas."""
    s = _build("pipedream", (2, 1), 2, 2)
    assert format_actions(s.order[0]) == "0RB0 0F0 0SF0 0B0 0RB2 0AR0 0F2 0SF2 0B2 0AR2"
    assert format_actions(s.order[1]) == "0RB1 0F1 0SF1 0B1 0RB3 0AR1 0F3 0SF3 0B3 0AR3"
    assert [(u.version, u.items, u.computed_at) for u in s.updates[0]] == [(1, (0,), 0),
                                                                           (2, (2,), 1)]
    assert [u.items for u in s.updates[2]] == [(0,), (1,), (2,), (3,)]
    assert s.version_of(1, Action(0, Kind.FORWARD, 3)) == 1


def test_2bw_defers_each_all_reduce_to_the_first_use_of_its_version() -> None:
    """2BW's step after mini-batch b makes version b + 1, first used by mini-batch b + 2: the
    replica runs mini-batch b + 1 (on version b) before it waits for the all-reduce."""
    s = _build("2bw", (1, 2), 2, 3)
    assert format_actions(s.order[1]) == ("1RF0 1F0 1RF2 1B0 1SB0 1F2 1RF4 1B2 1SB2 1AR0 "
                                          "1F4 1B4 1SB4 1AR2 1AR4")
    assert [(s.order[1][u.after], u.version) for u in s.updates[1]] == [
        (Action(1, Kind.BACKWARD, 0), 1), (Action(1, Kind.BACKWARD, 2), 2),
        (Action(1, Kind.BACKWARD, 4), 3)]


@pytest.mark.parametrize("name", ["pipedream", "2bw"])
@pytest.mark.parametrize("replicas", TOPOLOGIES)
def test_every_topology_builds_valid_lockstep_schedules(name: str,
                                                        replicas: tuple[int, ...]) -> None:
    p, m = len(replicas), math.lcm(*replicas) * 2
    s = _build(name, replicas, m, 3)  # validated on construction
    assert check_versions(s) == []
    for stage, count in enumerate(replicas):
        slots = s.slots_of(stage)
        steps = [s.updates[r] for r in slots]
        assert len({len(x) for x in steps}) == 1
        per_step = m if name == "2bw" else count  # 2bw: a mini-batch; pipedream: a round
        for k, together in enumerate(zip(*steps)):
            assert sorted(n for u in together for n in u.items) == list(
                range(k * per_step, (k + 1) * per_step))
        for r in slots:
            reduces = [a for a in s.order[r] if a.kind is Kind.ALL_REDUCE]
            assert len(reduces) == (len(s.updates[r]) if count > 1 else 0)
    peaks = peak_versions(s)
    for slot, peak in peaks.items():
        stage = s.stage_of(slot)
        want = 2 if name == "2bw" else math.ceil((p - stage) / replicas[stage])
        assert s.version_limit[slot] == want and peak <= want


def test_2bw_on_replicas_uses_the_versions_of_one_rank_per_stage() -> None:
    """Every micro-batch of mini-batch b runs at version max(b - 1, 0) on every replica."""
    plain, hybrid = build_async_schedule("2bw", 3, 4, 3), _build("2bw", (1, 2, 1), 4, 3)
    for s in (plain, hybrid):
        for (r, i), v in s.versions.items():
            assert v == max(s.order[r][i].microbatch // 4 - 1, 0)


def test_microbatches_must_be_whole_rounds_and_vsync_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"pipedream with replicas 2,3 steps each stage once "
                                            r"per round of its replicas: micro-batches \(4\) "
                                            r"must be a multiple of 6; try 6 or 12"):
        _build("pipedream", (2, 3), 4, 2)
    with pytest.raises(ScheduleError, match=r"replicas 2,1 name 2 stages, not 3"):
        build_async_schedule("2bw", 3, 4, 2, dealing=Dealing((2, 1)))
    with pytest.raises(ScheduleError, match=r"pipedream-vsync with replicated stages "
                                            r"\(replicas 2,1\) is not available"):
        _build("pipedream-vsync", (2, 1), 2, 2)


def test_validator_catches_a_missing_or_late_all_reduce() -> None:
    s = _build("pipedream", (2, 1), 2, 2)
    order = {**s.order, 1: [a for a in s.order[1] if str(a) != "0AR3"]}
    found = check_versions(replace(s, order=order))
    assert [(v.rule, v.rank) for v in found] == [("lockstep", 1)]
    assert "1 all-reduce(s) for 2 optimizer step(s)" in str(found[0])
    # 0AR1 moved after 0F3, which already uses the version it makes
    late = [a for a in s.order[1] if str(a) != "0AR1"]
    late.insert(late.index(Action(0, Kind.FORWARD, 3)) + 1, Action(0, Kind.ALL_REDUCE, 1))
    index = {a: i for i, a in enumerate(late)}
    versions = {**{k: v for k, v in s.versions.items() if k[0] != 1},
                **{(1, index[s.order[1][i]]): v for (r, i), v in s.versions.items() if r == 1}}
    updates = {**s.updates, 1: [replace(u, after=index[s.order[1][u.after]])
                                for u in s.updates[1]]}
    rules = _rules(replace(s, order={**s.order, 1: late}, versions=versions, updates=updates))
    assert rules == [("lockstep", 1, "0B1")]


def test_validator_catches_replicas_that_step_apart() -> None:
    s = _build("2bw", (2, 1), 2, 2)
    updates = {**s.updates, 1: s.updates[1][:1]}
    found = check_versions(replace(s, updates=updates))
    assert [v.rule for v in found][:1] == ["update"]  # micro-batch 3's gradient never applied
    lockstep = [v for v in found if v.rule == "lockstep"]
    assert lockstep and "take 2 (slot 0), 1 (slot 1) optimizer steps" in str(lockstep[0])


def test_validator_catches_a_microbatch_on_the_wrong_replica() -> None:
    s = _build("pipedream", (2, 1), 2, 1)
    swapped = {**s.order, 0: s.order[1], 1: s.order[0]}
    versions = {((1 - r) if r < 2 else r, i): v for (r, i), v in s.versions.items()}
    rules = _rules(replace(s, order=swapped, versions=versions))
    assert rules[0] == ("dealt", 0, "0F1")


def test_validator_catches_a_deadlock_between_replicas() -> None:
    """Replica 0 of stage 0 waits at its all-reduce before the backward its peer needs from
    stage 1, which waits for replica 0's activation: no order completes."""
    s = _build("2bw", (2, 1), 2, 1)
    order = dict(s.order)
    order[0] = [Action(0, Kind.ALL_REDUCE, 0), *[a for a in s.order[0]
                                                 if a.kind is not Kind.ALL_REDUCE]]
    versions = {(r, i + (1 if r == 0 else 0)): v for (r, i), v in s.versions.items()}
    updates = {**s.updates, 0: [replace(u, after=u.after + 1) for u in s.updates[0]]}
    rules = _rules(replace(s, order=order, versions=versions, updates=updates))
    assert ("deadlock", 0, "0AR0") in rules


def test_stream_pieces_run_a_stage_all_reduce_in_one_step() -> None:
    """Every `AR` of a stage's replicas runs within the same trainer step on all of them."""
    for replicas, m in (((2, 1), 2), ((1, 2, 1), 4), ((2, 2), 2), ((3, 1), 3)):
        for name in ("pipedream", "2bw"):
            s = _build(name, replicas, m, 4)
            cuts = step_cuts(s)
            for stage in range(len(replicas)):
                per_slot = []
                for r in s.slots_of(stage):
                    at = [i for i, a in enumerate(s.order[r]) if a.kind is Kind.ALL_REDUCE]
                    per_slot.append([sum(1 for end in cuts[r] if end <= i) for i in at])
                assert all(x == per_slot[0] for x in per_slot), (replicas, name, stage)
            # the last stage's replicas together report every micro-batch's loss once
            rows = loss_versions(s, cuts)
            assert len(rows) == 4 and rows[-1][-1] != (-1, -1)


@pytest.mark.parametrize("argv,message", [
    (["train", "--parallel", "hybrid", "--stages", "2", "--replicas", "2,1", "--microbatches",
      "4", "--schedule", "pipedream-vsync", "--model", "mlp"],
     "pipedream-vsync with replicated stages (replicas 2,1) is not available"),
    (["train", "--parallel", "hybrid", "--stages", "2", "--replicas", "3,1", "--microbatches",
      "4", "--schedule", "2bw", "--model", "mlp"],
     "micro-batches (4) must be a multiple of 3; try 3 or 6"),
    (["bench", "hybrid", "--model", "mlp", "--stages", "2", "--replicas", "2",
      "--microbatches", "4", "--schedule", "1f1b,2bw"],
     "--schedule 2bw: bench hybrid compares flushed schedules (gpipe, 1f1b)"),
])
def test_what_does_not_run_on_replicas_is_one_line_exit_2(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    assert main([*argv, *(["--out", str(tmp_path / "run")] if argv[0] == "train" else [])]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
