"""The mesh alone (no processes): places, spans, text, plan files and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.errors import CommError, ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, check_ranks, new_group, world_group
from approxdist.topology import (
    Mesh,
    Place,
    TopologyError,
    check_world,
    from_plan,
    parse_mesh,
    parse_replicas,
    render,
    to_plan,
)
from approxdist.topology.groups import PIPELINE, default_spans


def test_every_mode_is_a_mesh_of_named_axes() -> None:
    assert Mesh.single().kind == "single" and Mesh.single().world_size == 1
    dp = Mesh.data_parallel(4)
    assert dp.names == ("dp",) and dp.stage_ranks == ((0, 1, 2, 3),) and dp.kind == "data-parallel"
    pp = Mesh.pipeline(3)
    assert pp.stage_ranks == ((0,), (1,), (2,)) and pp.kind == "pipeline"
    hybrid = Mesh.stages(2, 2)
    assert hybrid.stage_ranks == ((0, 1), (2, 3)) and hybrid.kind == "hybrid" and hybrid.equal
    uneven = Mesh.stages(2, [3, 1])
    assert uneven.stage_ranks == ((0, 1, 2), (3,)) and not uneven.equal
    assert uneven.replicas == (3, 1) and uneven.spec == "pp=2,dp=3/1"
    ps = Mesh.roles(1, 3)
    assert ps.kind == "parameter server" and ps.spec == "role=2,dp=1/3"
    assert [str(ps.place(r)) for r in range(4)] == ["server 0", "worker 0", "worker 1", "worker 2"]
    assert ps.describe_rank(2) == "worker 1 (rank 2)" and ps.along(2, "dp") == (1, 2, 3)


def test_a_third_axis_is_a_name_not_a_new_class() -> None:
    """tp shards sit on neighbouring ranks (innermost), whatever order the spec names them."""
    m = parse_mesh("tp=2,pp=2,dp=2")
    assert m.names == ("pp", "dp", "tp") and m.spec == "pp=2,dp=2,tp=2" and m.world_size == 8
    assert m.place(5) == Place((("pp", 1), ("dp", 0), ("tp", 1)))
    assert (m.place(5).stage, m.place(5).replica, m.place(5).shard) == (1, 0, 1)
    assert m.along(5, "tp") == (4, 5) and m.along(5, "dp") == (5, 7)
    assert m.along(5, *PIPELINE) == (1, 3, 5, 7)  # the pipeline of shard 1
    assert m.spans("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.describe_rank(5) == "rank 5 (stage 1, replica 0, shard 1)"
    assert m.rank_at(pp=1, dp=1, tp=0) == 6
    assert default_spans(m) == [("dp",), ("tp",), PIPELINE]
    assert default_spans(parse_mesh("tp=2,dp=2")) == [("dp",), ("tp",)]
    assert default_spans(Mesh.roles(2, 2)) == [("dp",)]


def test_placement_puts_stages_on_any_ranks() -> None:
    m = Mesh.pipeline(3, [2, 0, 1])
    assert m.stage_ranks == ((2,), (0,), (1,)) and m.along(0, "pp") == (2, 0, 1)
    assert [m.place(r).stage for r in range(3)] == [1, 2, 0]


def test_places_slots_and_descriptions() -> None:
    m = Mesh.stages(3, [2, 1, 1], placement=[3, 1, 0, 2])
    assert m.stage_ranks == ((3, 1), (0,), (2,))
    assert [(m.place(r).stage, m.place(r).replica) for r in range(4)] == [
        (1, 0), (0, 1), (2, 0), (0, 0)]
    assert [m.slot(r) for r in range(4)] == [2, 1, 3, 0]  # row-major, whatever the ranks
    assert m.describe_rank(0) == "rank 0 (stage 1, replica 0)"
    with pytest.raises(TopologyError, match="rank 7 is not in this mesh of 4 ranks"):
        m.place(7)


def test_ranks_along_each_axis() -> None:
    m = Mesh.stages(2, 2)
    assert (m.along(3, "dp"), m.along(3, "pp"), m.along(3, *PIPELINE)) == (
        (2, 3), (1, 3), (0, 1, 2, 3))
    u = Mesh.stages(2, [3, 1])
    assert u.along(3, "dp") == (3,) and u.along(0, *PIPELINE) == (0, 1, 2, 3)
    assert u.spans("dp") == [(0, 1, 2), (3,)]


def test_default_spans_are_one_fixed_order() -> None:
    assert default_spans(Mesh.stages(2, 2, [3, 0, 2, 1])) == [("dp",), PIPELINE]
    assert Mesh.stages(2, 2, [3, 0, 2, 1]).spans("dp") == [(3, 0), (2, 1)]
    assert Mesh.stages(2, 2, [3, 0, 2, 1]).spans(*PIPELINE) == [(3, 0, 2, 1)]  # index = slot
    assert default_spans(Mesh.pipeline(3, [2, 0, 1])) == [PIPELINE]
    assert default_spans(Mesh.single()) == []
    assert default_spans(Mesh.data_parallel(3)) == [("dp",)]


def test_render_is_a_grid_and_a_table_of_groups() -> None:
    text = render(Mesh.stages(3, [2, 1, 1]))
    lines = text.splitlines()
    assert lines[0] == "mesh pp=3,dp=2/1/1: 4 rank(s) (hybrid)"
    assert lines[1].split() == ["stage", "0", "stage", "1", "stage", "2"]
    assert lines[2].split() == ["replica", "0", "rank", "0", "rank", "2", "rank", "3"]
    assert lines[3].split() == ["replica", "1", "rank", "1", "-", "-"]
    assert lines[5].split() == ["rank", "stage", "replica", "along", "dp", "upstream",
                                "downstream", "pipeline", "row"]
    row = next(line for line in lines if line.startswith("2 "))
    assert row.split()[:6] == ["2", "1", "0", "2", "0,1", "3"]
    assert all(line == line.rstrip() for line in lines)
    tp = render(parse_mesh("pp=2,tp=2")).splitlines()
    assert tp[2].split() == ["shard", "0", "rank", "0", "rank", "2"]
    ps = render(Mesh.roles(1, 2)).splitlines()
    assert ps[0] == "mesh role=2,dp=1/2: 3 rank(s) (parameter server)"
    assert ps[1].split() == ["servers", "workers"] and ps[3].split() == ["index", "1", "-", "rank", "2"]
    assert next(line for line in ps if line.startswith("2 ")).split() == ["2", "worker", "1", "1,2"]


@pytest.mark.parametrize("mesh", [Mesh.single(), Mesh.data_parallel(3), Mesh.pipeline(3, [2, 0, 1]),
                                  Mesh.stages(2, [3, 1]), Mesh.stages(2, 2, [3, 0, 2, 1]),
                                  parse_mesh("pp=2,dp=2,tp=2", (7, 6, 5, 4, 3, 2, 1, 0))])
def test_plan_round_trip(mesh: Mesh) -> None:
    plan = json.loads(json.dumps(to_plan(mesh)))
    back = from_plan(plan)
    assert (back.ranks, back.replicas, back.extent("tp")) == (mesh.ranks, mesh.replicas,
                                                               mesh.extent("tp"))
    assert plan["world_size"] == mesh.world_size


def test_plan_without_ranks_places_stage_by_stage_and_keeps_blocks_aside() -> None:
    plan = {"stages": [{"blocks": [0, 5], "replicas": 3}, {"blocks": [5, 9], "replicas": 1}]}
    assert from_plan(plan) == Mesh.stages(2, [3, 1])


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Mesh.stages(3, [2, 0, 1]), r"stage 1 has 0 replicas; every stage needs at least one"),
    (lambda: Mesh.stages(2, [1, 1, 1]), r"replicas 1,1,1 give 3 counts for 2 stages"),
    (lambda: Mesh.stages(0), r"stages \(0\) must be an integer >= 1"),
    (lambda: Mesh.pipeline(3, [2, 0, 0]),
     r"placement \[2, 0, 0\] must name every rank of a world of 3 \(0..2\) exactly once, but "
     r"has rank\(s\) 0 more than once; rank\(s\) 1 nowhere"),
    (lambda: Mesh.pipeline(3, [0, 1, 5]), r"rank\(s\) 5 outside 0..2; rank\(s\) 2 nowhere"),
    (lambda: Mesh.pipeline(2, [0, 1, 2]), r"placement \[0, 1, 2\] names 3 rank\(s\) but the mesh "
                                          r"pp=2,dp=1 has 2 point"),
    (lambda: Mesh.roles(0, 2), r"--servers 0 must be >= 1"),
    (lambda: parse_mesh("pp=2,dp=0"), r"mesh 'pp=2,dp=0': axis dp has size 0; every axis needs"),
    (lambda: parse_mesh("pp=2,xp=2"), r"mesh 'pp=2,xp=2': axis 'xp' is not one of: role, pp, dp, tp"),
    (lambda: parse_mesh("dp=2,dp=2"), r"names axis 'dp' twice"),
    (lambda: parse_mesh("pp"), r"'pp' is not NAME=SIZE"),
    (lambda: parse_mesh("pp=two"), r"pp='two' is not a size"),
    (lambda: parse_mesh("pp=2,dp=3/1/1"), r"dp=3/1/1 gives 3 sizes but pp=2 has 2 indices"),
    (lambda: parse_mesh("pp=2/1"), r"the outermost axis has one size"),
    (lambda: check_world(parse_mesh("pp=2,dp=2"), 3),
     r"the mesh pp=2,dp=2 \(pp 2 x dp 2\) places 4 rank\(s\) but the job has 3"),
    (lambda: Mesh.of({"ep": 2}), r"mesh axis 'ep' is not one of"),
    (lambda: from_plan({"stages": []}), r"plan 'stages' = \[\] must be a non-empty list"),
    (lambda: from_plan({"stages": [{"replicas": "2"}]}), r"stages\[0\].replicas = '2' must be"),
    (lambda: from_plan({"stages": [{"replicas": 2, "ranks": [0]}]}),
     r"stages\[0\].ranks = \[0\] must list 2 integer rank"),
    (lambda: from_plan({"stages": [{"replicas": 1, "tp": 2}, {"replicas": 1}]}),
     r"every stage needs the same number of tensor-parallel shards"),
    (lambda: from_plan({"world_size": 3, "stages": [{"replicas": 2}]}),
     r"world_size = 3 but its stages hold 2 rank"),
    (lambda: from_plan({"stages": [{"replicas": 1, "ranks": [1]}, {"replicas": 1}]}),
     r"'ranks' for some stages only"),
    (lambda: parse_replicas("2,x"), r"--replicas '2,x' is not a comma-separated list"),
])
def test_bad_meshes_name_the_values_and_the_fix(build: object, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        build()  # type: ignore[operator]
    assert issubclass(TopologyError, ConfigError)  # the CLI prints it on one line, exit 2


def test_plan_show_prints_the_grid_and_refuses_bad_input(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "show", "--stages", "3", "--replicas", "2,1,1"]) == 0
    assert "mesh pp=3,dp=2/1/1: 4 rank(s) (hybrid)" in capsys.readouterr().out
    assert main(["plan", "show", "--mesh", "tp=2,dp=2", "--placement", "3,2,1,0"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == [
        "shard", "0", "rank", "3", "rank", "1"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(to_plan(Mesh.pipeline(2, [1, 0]))))
    assert main(["plan", "show", str(plan)]) == 0
    assert "replica 0  rank 1   rank 0" in capsys.readouterr().out
    for args, message in ((["--stages", "2", "--replicas", "1,0"], "stage 1 has 0 replicas"),
                          ([str(tmp_path / "none.json")], "does not exist"),
                          ([str(plan), "--stages", "2"], "not both"),
                          (["--mesh", "pp=2,dp=0"], "axis dp has size 0"),
                          (["--mesh", "pp=2", "--stages", "2"], "drop --stages/--replicas"),
                          (["--mesh", "pp=2,pp=2"], "names axis 'pp' twice")):
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
