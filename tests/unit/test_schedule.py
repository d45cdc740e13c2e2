"""Schedules as data: actions, registry, golden grids, and properties of every schedule."""

from __future__ import annotations

import pytest

from approxdist.errors import ApproxDistError
from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.schedule import (
    Action,
    Kind,
    build_schedule,
    format_grid,
    parse_actions,
    peak_in_flight,
    schedule_names,
    simulate,
)
from approxdist.pipeline.schedule.action import format_actions
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.pipeline.schedule.grid import theoretical_bubble, timeline_of
from approxdist.pipeline.schedule.validate import check_schedule

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 9)]


def test_action_prints_and_parses_like_torch() -> None:
    assert str(Action(1, Kind.FORWARD, 0)) == "1F0"
    assert str(Action(0, Kind.SEND_ACT, 2)) == "0SF2"
    assert str(Action(12, Kind.RECV_GRAD, 10)) == "12RB10"
    for text in ("1F0", "0B3", "0SF2", "1RF2", "2SB0", "1RB0", "12RB10"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ScheduleError, match="'1X0'.*e.g. '1F0'"):
        Action.parse("1X0")


def test_action_peers_and_matching() -> None:
    send = Action.parse("1SF3")
    assert send.peer_stage == 2 and send.channel == (1, 2)
    assert send.matching() == Action.parse("2RF3")
    assert send.compute() == Action.parse("1F3")
    recv = Action.parse("1RB0")
    assert recv.peer_stage == 2 and recv.channel == (2, 1)
    assert recv.matching() == Action.parse("2SB0")
    assert recv.compute() == Action.parse("1B0")
    with pytest.raises(ValueError):
        _ = Action.parse("0F0").peer_stage


def test_registry_names_and_unknown_name() -> None:
    assert {"gpipe", "1f1b"} <= set(schedule_names())
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'; valid: 1f1b, gpipe"):
        build_schedule("zb", 2, 2)
    assert issubclass(ScheduleError, PipelineError)
    assert issubclass(PipelineError, ApproxDistError)


@pytest.mark.parametrize("p, m", [(0, 2), (2, 0), (-1, 1)])
def test_bad_sizes_name_the_value(p: int, m: int) -> None:
    with pytest.raises(PipelineError, match=r"\((0|-1)\) must be an integer >= 1"):
        build_schedule("gpipe", p, m)


def test_gpipe_actions_with_comm_golden() -> None:
    order = build_schedule("gpipe", 2, 3)
    assert format_actions(order[0]) == "0F0 0SF0 0F1 0SF1 0RB0 0F2 0SF2 0RB1 0B0 0RB2 0B1 0B2"
    assert format_actions(order[1]) == "1RF0 1RF1 1F0 1RF2 1F1 1F2 1B0 1SB0 1B1 1SB1 1B2 1SB2"


def test_1f1b_actions_with_comm_golden() -> None:
    order = build_schedule("1f1b", 2, 3)
    assert format_actions(order[0]) == "0F0 0SF0 0RB0 0F1 0SF1 0B0 0RB1 0F2 0SF2 0RB2 0B1 0B2"
    assert format_actions(order[1]) == "1RF0 1F0 1RF1 1B0 1SB0 1F1 1RF2 1B1 1SB1 1F2 1B2 1SB2"


GPIPE_2_3 = """\
step     0   1   2   3   4   5   6   7
rank 0 0F0 0F1 0F2   .   . 0B0 0B1 0B2
rank 1   . 1F0 1F1 1F2 1B0 1B1 1B2   ."""

ONE_F_ONE_B_2_3 = """\
step     0   1   2   3   4   5   6   7
rank 0 0F0 0F1   . 0B0 0F2 0B1   . 0B2
rank 1   . 1F0 1B0 1F1 1B1 1F2 1B2   ."""

ONE_F_ONE_B_2_3_COMM = """\
step      0    1    2    3    4    5    6    7    8    9   10   11   12   13
rank 0  0F0 0SF0 0RB0  0F1 0SF1    .  0B0 0RB1  0F2 0SF2 0RB2  0B1    .  0B2
rank 1 1RF0    .  1F0 1RF1  1B0 1SB0  1F1 1RF2  1B1 1SB1  1F2  1B2 1SB2    ."""


def test_golden_grids() -> None:
    assert format_grid(build_schedule("gpipe", 2, 3)) == GPIPE_2_3
    assert format_grid(build_schedule("1f1b", 2, 3)) == ONE_F_ONE_B_2_3
    assert format_grid(build_schedule("1f1b", 2, 3), with_comm=True) == ONE_F_ONE_B_2_3_COMM


def test_1f1b_p4_m8_first_rank_warms_up_three_forwards() -> None:
    row0 = format_grid(build_schedule("1f1b", 4, 8)).splitlines()[1].split()
    assert row0[2:9] == ["0F0", "0F1", "0F2", "0F3", ".", ".", "."]


def test_grid_marks_a_deadlock() -> None:
    order = {0: parse_actions("0F0 0SF0 0RB0 0B0"), 1: parse_actions("1RF0 1SB0 1F0 1B0")}
    assert "deadlock" not in format_grid(order)  # send-before-compute is not a deadlock
    order = {0: parse_actions("0RB0 0B0 0F0 0SF0"), 1: parse_actions("1RF0 1F0 1B0 1SB0")}
    assert format_grid(order).endswith(
        "deadlock: rank 0 blocked at 0B0 waiting for 1SB0; rank 1 blocked at 1F0 waiting "
        "for 0SF0")


@pytest.mark.parametrize("name", schedule_names())
@pytest.mark.parametrize("p, m", SIZES)
def test_every_registered_schedule_validates(name: str, p: int, m: int) -> None:
    order = build_schedule(name, p, m)  # raises if invalid
    assert sorted(order) == list(range(p))
    assert timeline_of(order, p, with_comm=True).completed


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", SIZES)
def test_textbook_bubble(name: str, p: int, m: int) -> None:
    timeline = timeline_of(build_schedule(name, p, m), p)
    assert timeline.makespan == 2 * (m + p - 1)
    assert timeline.bubble_fraction() == pytest.approx(theoretical_bubble(p, m))


@pytest.mark.parametrize("name", schedule_names())
@pytest.mark.parametrize("p, m", SIZES)
def test_backward_follows_downstream_backward(name: str, p: int, m: int) -> None:
    order = build_schedule(name, p, m)
    t = simulate(order, p)
    end = {a: e for r in order for a, e in zip(order[r], t.end[r])}
    start = {a: s for r in order for a, s in zip(order[r], t.start[r])}
    grad = Kind.BACKWARD_INPUT if name.startswith("zb") else Kind.BACKWARD  # who sends it
    for s in range(p - 1):
        for mb in range(m):
            assert start[Action(s, grad, mb)] >= end[Action(s + 1, grad, mb)]
            assert start[Action(s + 1, Kind.FORWARD, mb)] >= end[Action(s, Kind.FORWARD, mb)]


@pytest.mark.parametrize("p, m", SIZES)
def test_peak_in_flight_gpipe_m_and_1f1b_bounded_by_depth(p: int, m: int) -> None:
    assert peak_in_flight(build_schedule("gpipe", p, m)) == {s: m for s in range(p)}
    assert peak_in_flight(build_schedule("1f1b", p, m)) == {s: min(p - s, m) for s in range(p)}


@pytest.mark.parametrize("prepost", [0, 1, 3])
def test_any_prepost_depth_is_valid(prepost: int) -> None:
    from approxdist.pipeline.schedule.one_f_one_b import stage_order

    compute = {s: stage_order(s, 3, 5) for s in range(3)}
    assert check_schedule(with_comm(compute, 3, prepost), 3, 5) == []


def test_simulation_with_slower_backward() -> None:
    from approxdist.pipeline.schedule import Durations

    for name in ("gpipe", "1f1b"):
        t = simulate(build_schedule(name, 3, 4), 3, Durations(forward=1.0, backward=2.0))
        assert t.completed and t.makespan == 3 * (4 + 3 - 1)


def test_simulation_names_a_send_that_never_comes() -> None:
    order = {0: parse_actions("0F0 0RB0 0B0"), 1: parse_actions("1RF0 1F0 1B0 1SB0")}
    t = simulate(order, 2)
    assert t.stuck == {0: Action.parse("0B0"), 1: Action.parse("1F0")}
    assert t.waiting_for == {0: Action.parse("1SB0"), 1: Action.parse("0SF0")}


def test_stage_durations_queue_messages_on_their_channel() -> None:
    """Per-stage times: messages of 3 s link time on one channel leave one after another
    (as on netem's link clock) and arrive 0.5 s later; consumers wait for the arrival."""
    from approxdist.pipeline.schedule import Durations, StageDurations, StageTimes

    durations = StageDurations((StageTimes(act_wire=3.0, act_latency=0.5), StageTimes()))
    t = simulate(build_schedule("gpipe", 2, 3), 2, durations)
    starts = {a: s for r in t.order for a, s in zip(t.order[r], t.start[r])}
    # 0F0..0F2 end at 1, 2, 3; their messages leave at 1, 4, 7 and arrive at 4.5, 7.5, 10.5
    assert [starts[Action(1, Kind.FORWARD, m)] for m in range(3)] == [4.5, 7.5, 10.5]
    # 1F2 [10.5, 11.5], 1B0..1B2 to 14.5; gradients are free; 0B0..0B2 from 12.5 to 15.5
    assert t.makespan == 15.5
    assert Durations().transfer(Action(0, Kind.SEND_ACT, 0)) == (0.0, 0.0)
    assert durations.of(Action(1, Kind.RECV_ACT, 0)) == 0.0


def test_stage_durations_are_checked() -> None:
    from approxdist.pipeline.schedule import StageDurations, StageTimes

    with pytest.raises(PipelineError, match=r"stage time act_wire = -1.0 must be a number of "
                                            r"seconds >= 0"):
        StageTimes(act_wire=-1.0)
    with pytest.raises(PipelineError, match=r"action 2RF0 is on stage 2 but durations are given "
                                            r"for 2 stage\(s\)"):
        simulate(build_schedule("gpipe", 3, 1), 3, StageDurations((StageTimes(),) * 2))


# -- ranks sharing cores (processor sharing) -------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (3, 5), (4, 8)])
def test_on_one_core_the_makespan_is_all_the_compute(name: str, p: int, m: int) -> None:
    """One core, free messages: some rank can always compute, so the core never idles and
    the step is every forward and backward of every rank, one after another."""
    from approxdist.pipeline.schedule import Durations

    t = simulate(build_schedule(name, p, m), p, Durations(forward=1.0, backward=2.0), cores=1)
    assert t.completed and t.makespan == pytest.approx(p * m * 3.0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_with_a_core_per_rank_sharing_changes_nothing(name: str) -> None:
    from approxdist.pipeline.schedule import Durations

    order = build_schedule(name, 3, 6)
    alone = simulate(order, 3, Durations(forward=1.0, backward=2.0))
    for cores in (3, 8):
        shared = simulate(order, 3, Durations(forward=1.0, backward=2.0), cores=cores)
        assert shared.makespan == pytest.approx(alone.makespan)
        assert all(shared.end[r] == pytest.approx(alone.end[r]) for r in order)


def test_a_waiting_rank_holds_no_core_by_hand() -> None:
    """GPipe, 2 stages, 2 micro-batches, forward 1 s, backward 2 s, one core: 0F0 alone
    [0, 1]; 0F1 and 1F0 share the core [1, 3]; 1F1 alone [3, 4]; 1B0 alone [4, 6] (rank 0
    waits for its gradient and holds nothing); 1B1 and 0B0 share it [6, 10]; 0B1 [10, 12]."""
    from approxdist.pipeline.schedule import Durations

    t = simulate(build_schedule("gpipe", 2, 2), 2, Durations(forward=1.0, backward=2.0), cores=1)
    ends = {a: e for r in t.order for a, e in zip(t.order[r], t.end[r]) if a.is_compute}
    assert [ends[Action.parse(a)] for a in ("0F0", "0F1", "1F0", "1F1", "1B0", "1B1", "0B0",
                                             "0B1")] == pytest.approx([1, 3, 3, 4, 6, 10, 10, 12])


def test_cores_must_be_a_positive_integer() -> None:
    for bad in (0, 1.5, True):
        with pytest.raises(PipelineError, match=f"cores = {bad!r} must be an integer >= 1"):
            simulate(build_schedule("gpipe", 2, 2), 2, cores=bad)  # type: ignore[arg-type]
