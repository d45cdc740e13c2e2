"""Round-robin dealing and replicated schedules (PipeDream's 1F1B-RR with flush), no processes."""

from __future__ import annotations

import pytest

from approxdist.cli.main import main
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import Action, Kind, build_schedule, parse_actions
from approxdist.pipeline.schedule.replicated import (
    check_replicated,
    replicated_schedule,
    slot_route,
)
from approxdist.pipeline.schedule.simulate import Durations, simulate
from approxdist.topology import Mesh
from approxdist.topology.dealing import Dealing


def test_dealing_is_round_robin_per_stage() -> None:
    d = Dealing.of(Mesh.stages(3, [3, 1, 2]))
    assert [d.replica(0, m) for m in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [d.slot(2, m) for m in range(4)] == [4, 5, 4, 5]  # stage 2 holds slots 4, 5
    assert [d.place(s) for s in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1)]
    assert d.microbatches(0, 1, 7) == [1, 4] and d.microbatches(1, 0, 3) == [0, 1, 2]
    assert Dealing.single(3).slot(2, 5) == 2
    with pytest.raises(ValueError, match="slot 6 is outside the 6 slots"):
        d.place(6)


@pytest.mark.parametrize("replicas", [(2, 2), (3, 1), (1, 3), (1, 2, 1), (2, 1, 3)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_every_micro_batch_runs_once_per_stage_on_its_replica(replicas: tuple[int, ...],
                                                              name: str) -> None:
    d, m = Dealing(replicas), 7
    order = replicated_schedule(name, d, m)
    assert sorted(order) == list(range(sum(replicas)))
    for slot, actions in order.items():
        stage, replica = d.place(slot)
        assert {a.stage for a in actions} == {stage}
        mine = [a for a in actions if a.kind is not Kind.ALL_REDUCE]
        assert all(d.replica(stage, a.microbatch) == replica for a in mine)
        base = [a for a in build_schedule(name, len(replicas), m)[stage] if a in set(mine)]
        assert mine == base  # the base schedule's order, filtered
        ar = [a for a in actions if a.kind is Kind.ALL_REDUCE]
        if replicas[stage] > 1:  # replicated stages end with the all-reduce
            assert ar == [actions[-1]] and ar[0].microbatch == max(d.microbatches(stage, replica, m))
        else:
            assert ar == []
    timeline = simulate(order, len(replicas), Durations(comm=1.0), route=slot_route(d))
    assert timeline.completed
    for stage, count in enumerate(replicas):  # an all-reduce starts when every replica is there
        starts = {timeline.start[slot][-1] for slot in range(sum(replicas[:stage]),
                                                               sum(replicas[:stage + 1]))
                  if order[slot][-1].kind is Kind.ALL_REDUCE}
        assert len(starts) <= 1 and (count == 1) == (not starts)


def test_ar_prints_and_parses() -> None:
    a = Action(0, Kind.ALL_REDUCE, 6)
    assert str(a) == "0AR6" and Action.parse("0AR6") == a
    assert parse_actions("0F0 0B0 0AR0")[-1].kind is Kind.ALL_REDUCE
    with pytest.raises(ValueError, match="not a send or receive"):
        _ = a.peer_stage


def test_a_bad_dealing_or_order_is_refused() -> None:
    from approxdist.pipeline.schedule.replicated import check_dealing

    with pytest.raises(ScheduleError, match=r"micro-batches \(2\) must be at least the largest "
                                            r"replica count \(3\)"):
        check_dealing(Dealing((3, 1)), 2)
    d = Dealing((2, 1))
    order = replicated_schedule("gpipe", d, 4)
    swapped = dict(order)
    swapped[2] = [a for a in order[2] if a != Action(1, Kind.RECV_ACT, 0)]
    swapped[2].insert(swapped[2].index(Action(1, Kind.RECV_ACT, 2)) + 1,
                      Action(1, Kind.RECV_ACT, 0))  # 2 posted before 0, both from slot 0
    with pytest.raises(ScheduleError, match="invalid replicated schedule: deadlock: .*slot 2 "
                                            "blocked at 1F0 waiting for 1RF0"):
        check_replicated(swapped, d)


def test_schedule_show_prints_replicated_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "show", "1f1b", "-p", "2", "-m", "6", "--replicas", "3,1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "replicas 3,1 (4 ranks, stage-major)" in out[0]
    assert out[2].split()[:3] == ["rank", "0", "0F0"] and "1F5" in out[5]
    assert main(["schedule", "show", "gpipe", "-p", "2", "-m", "2", "--replicas", "3,1"]) == 2
    assert "at least the largest replica count (3)" in capsys.readouterr().err
