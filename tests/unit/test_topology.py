"""The topology alone (no processes): places, groups, rows, text, plan files and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.errors import CommError, ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, check_ranks, new_group, world_group
from approxdist.topology import (
    GroupSpec,
    Place,
    Topology,
    TopologyError,
    from_plan,
    parse_replicas,
    render,
    to_plan,
)


def test_modes_are_special_cases_of_one_grid() -> None:
    assert Topology.single().kind == "single" and Topology.single().world_size == 1
    dp = Topology.data_parallel(4)
    assert dp.stages == ((0, 1, 2, 3),) and dp.kind == "data-parallel"
    pp = Topology.pipeline(3)
    assert pp.stages == ((0,), (1,), (2,)) and pp.kind == "pipeline"
    hybrid = Topology.grid(2, 2)
    assert hybrid.stages == ((0, 1), (2, 3)) and hybrid.kind == "hybrid" and hybrid.equal
    uneven = Topology.grid(2, [3, 1])
    assert uneven.stages == ((0, 1, 2), (3,)) and not uneven.equal and uneven.replicas == (3, 1)


def test_placement_puts_stages_on_any_ranks() -> None:
    t = Topology.pipeline(3, [2, 0, 1])
    assert t.stages == ((2,), (0,), (1,)) and t.pipelines() == [(2, 0, 1)]
    assert [t.place(r).stage for r in range(3)] == [1, 2, 0]


def test_places_slots_and_descriptions() -> None:
    t = Topology.grid(3, [2, 1, 1], placement=[3, 1, 0, 2])
    assert t.stages == ((3, 1), (0,), (2,))
    assert [t.place(r) for r in range(4)] == [Place(1, 0), Place(0, 1), Place(2, 0), Place(0, 0)]
    assert [t.slot(r) for r in range(4)] == [2, 1, 3, 0]  # stage-major, whatever the ranks
    assert t.describe_rank(0) == "rank 0 (stage 1, replica 0)"
    with pytest.raises(TopologyError, match="rank 7 is not in this topology of 4 ranks"):
        t.place(7)


def test_groups_of_each_rank() -> None:
    t = Topology.grid(2, 2)
    g = t.groups_of(3)
    assert (g.place, g.replicas, g.upstream, g.downstream, g.pipeline, g.world) == (
        Place(1, 1), (2, 3), (0, 1), (), (1, 3), (0, 1, 2, 3))
    u = Topology.grid(2, [3, 1]).groups_of(3)
    assert u.upstream == (0, 1, 2) and u.pipeline is None and u.replicas == (3,)
    assert Topology.grid(2, [3, 1]).groups_of(0).downstream == (3,)


def test_group_specs_are_one_fixed_order_without_singletons() -> None:
    assert Topology.grid(2, 2, [3, 0, 2, 1]).group_specs() == [
        GroupSpec("stage 0 replicas", (3, 0)), GroupSpec("stage 1 replicas", (2, 1)),
        GroupSpec("pipeline", (3, 0, 2, 1))]  # every rank, stage-major: index = slot
    assert Topology.pipeline(3, [2, 0, 1]).group_specs() == [GroupSpec("pipeline", (2, 0, 1))]
    assert Topology.grid(2, [3, 1]).group_specs() == [GroupSpec("stage 0 replicas", (0, 1, 2)),
                                                      GroupSpec("pipeline", (0, 1, 2, 3))]
    assert Topology.single().group_specs() == []
    assert Topology.data_parallel(3).group_specs() == [GroupSpec("stage 0 replicas", (0, 1, 2))]
    with pytest.raises(TopologyError, match="replicas 3,1 differ between stages"):
        Topology.grid(2, [3, 1]).pipelines()


def test_render_is_a_grid_and_a_table_of_groups() -> None:
    text = render(Topology.grid(3, [2, 1, 1]))
    lines = text.splitlines()
    assert lines[0] == "topology: 4 rank(s), 3 stage(s), replicas 2,1,1 (hybrid)"
    assert lines[2].split() == ["replica", "0", "rank", "0", "rank", "2", "rank", "3"]
    assert lines[3].split() == ["replica", "1", "rank", "1", "-", "-"]
    row = next(line for line in lines if line.startswith("2 "))
    assert row.split()[:6] == ["2", "1", "0", "2", "0,1", "3"]
    assert all(line == line.rstrip() for line in lines)


@pytest.mark.parametrize("topology", [Topology.single(), Topology.data_parallel(3),
                                      Topology.pipeline(3, [2, 0, 1]), Topology.grid(2, [3, 1]),
                                      Topology.grid(2, 2, [3, 0, 2, 1])])
def test_plan_round_trip(topology: Topology) -> None:
    plan = json.loads(json.dumps(to_plan(topology)))
    assert from_plan(plan) == topology
    assert plan["world_size"] == topology.world_size


def test_plan_without_ranks_places_stage_by_stage_and_keeps_blocks_aside() -> None:
    plan = {"stages": [{"blocks": [0, 5], "replicas": 3}, {"blocks": [5, 9], "replicas": 1}]}
    assert from_plan(plan) == Topology(((0, 1, 2), (3,)))


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Topology.grid(3, [2, 0, 1]), r"stage 1 has 0 replicas; every stage needs at least one"),
    (lambda: Topology.grid(2, [1, 1, 1]), r"replicas 1,1,1 give 3 counts for 2 stages"),
    (lambda: Topology.grid(0), r"stages \(0\) must be an integer >= 1"),
    (lambda: Topology.pipeline(3, [2, 0, 0]),
     r"placement \[2, 0, 0\] must name every rank of a world of 3 \(0..2\) exactly once, but "
     r"has rank\(s\) 0 more than once; rank\(s\) 1 nowhere"),
    (lambda: Topology.pipeline(3, [0, 1, 5]), r"rank\(s\) 5 outside 0..2; rank\(s\) 2 nowhere"),
    (lambda: Topology.pipeline(2, [0, 1, 2]), r"placement \[0, 1, 2\] names 3 ranks but 2 stage"),
    (lambda: Topology(((0, 1), (1, 3))), r"rank\(s\) 1 more than once; rank\(s\) 2 nowhere"),
    (lambda: Topology(((0,), ())), r"stage 1 has 0 replicas"),
    (lambda: from_plan({"stages": []}), r"plan 'stages' = \[\] must be a non-empty list"),
    (lambda: from_plan({"stages": [{"replicas": "2"}]}), r"stages\[0\].replicas = '2' must be"),
    (lambda: from_plan({"stages": [{"replicas": 2, "ranks": [0]}]}),
     r"stages\[0\].ranks = \[0\] must list 2 integer rank"),
    (lambda: from_plan({"world_size": 3, "stages": [{"replicas": 2}]}),
     r"world_size = 3 but its stages hold 2 rank"),
    (lambda: from_plan({"stages": [{"replicas": 1, "ranks": [1]}, {"replicas": 1}]}),
     r"'ranks' for some stages only"),
    (lambda: parse_replicas("2,x"), r"--replicas '2,x' is not a comma-separated list"),
])
def test_bad_topologies_name_the_values_and_the_fix(build: object, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        build()  # type: ignore[operator]
    assert issubclass(TopologyError, ConfigError)  # the CLI prints it on one line, exit 2


def test_plan_show_prints_the_grid_and_refuses_bad_input(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "show", "--stages", "3", "--replicas", "2,1,1"]) == 0
    assert "replicas 2,1,1 (hybrid)" in capsys.readouterr().out
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(to_plan(Topology.pipeline(2, [1, 0]))))
    assert main(["plan", "show", str(plan)]) == 0
    assert "replica 0  rank 1   rank 0" in capsys.readouterr().out
    for args, message in ((["--stages", "2", "--replicas", "1,0"], "stage 1 has 0 replicas"),
                          ([str(tmp_path / "none.json")], "does not exist"),
                          ([str(plan), "--stages", "2"], "not both")):
        assert main(["plan", "show", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_groups_without_processes_map_members_to_global_ranks() -> None:
    ctx = DistContext(rank=2, world_size=4)
    world = world_group(ctx)
    assert (world.rank, world.size, world.root) == (2, 4, 0)
    g = new_group(ctx, [3, 2, 0], "three")
    assert g is not None and (g.rank, g.size, g.root, g.is_root) == (1, 3, 3, False)
    assert [g.global_rank(i) for i in range(3)] == [3, 2, 0] and g.member(0) == 2
    assert new_group(ctx, [0, 1], "pair") is None  # rank 2 is not a member
    assert g.broadcast_object("mine") == "mine" and g.all_gather_object(5) == [5]
    with pytest.raises(CommError, match="rank 1 is not a member of three"):
        g.member(1)
    with pytest.raises(CommError, match="rank 1 is not a member of x"):
        Group((0, 2), 1, name="x")


@pytest.mark.parametrize(("ranks", "message"), [
    ([], r"has no ranks; name at least one of 0..3"),
    ([0, 4], r"names rank\(s\) 4 outside the world of 4 ranks \(0..3\)"),
    ([1, 1], r"names rank\(s\) 1 more than once \(\[1, 1\]\)"),
])
def test_a_group_naming_ranks_outside_the_world_is_refused(ranks: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_ranks(ranks, 4, "group")
