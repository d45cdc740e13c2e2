"""The planner's table of plan kinds: disjoint rules, the kind of every plan shape, labels."""

from __future__ import annotations

from itertools import combinations

import pytest

from approxdist.errors import ConfigError
from approxdist.planner.cost.pipeline import PipelinePlan, Stage
from approxdist.planner.kinds import PLAN_KINDS, kind_of, plan_kind, stage_ranges, used_axes
from approxdist.train.mode import modes

AXES = ("role", "pp", "dp", "tp")


def test_no_two_kinds_take_the_same_axes() -> None:
    """Every set of axes of size > 1 is of at most one kind, so a plan names one mode."""
    for n in range(len(AXES) + 1):
        for used in map(frozenset, combinations(AXES, n)):
            holders = [k.name for k in PLAN_KINDS if k.holds(used)]
            assert len(holders) <= 1, (used, holders)


@pytest.mark.parametrize(("stages", "tp", "used", "kind", "label"), [
    ((Stage(0, 4, 1),), 1, set(), "single", "dp=1"),
    ((Stage(0, 4, 3),), 1, {"dp"}, "dp", "dp=3"),
    ((Stage(0, 2), Stage(2, 4)), 1, {"pp"}, "pipeline", "gpipe M=4 [0,2)x1 [2,4)x1"),
    ((Stage(0, 2, 2), Stage(2, 4)), 1, {"pp", "dp"}, "hybrid", "gpipe M=4 [0,2)x2 [2,4)x1"),
    ((Stage(0, 4, 1),), 2, {"tp"}, "tensor", "tp=2,dp=1"),
    ((Stage(0, 4, 2),), 2, {"tp", "dp"}, "tensor", "tp=2,dp=2")])
def test_a_plan_is_of_the_kind_its_axes_say(stages: tuple[Stage, ...], tp: int,
                                             used: set[str], kind: str, label: str) -> None:
    plan = PipelinePlan(stages, "gpipe", 4)
    assert used_axes(plan, tp) == used
    found = kind_of(used_axes(plan, tp))
    assert found is not None and found.name == kind and found.label(plan, tp) == label
    assert found.scheduled == (len(stages) > 1)


def test_every_kind_is_run_by_the_mode_of_its_name() -> None:
    """The trainer's records reuse the table: the mode called like a kind runs its plans."""
    for kind in PLAN_KINDS:
        assert modes().get(kind.name).plan == kind
    assert [m for m in modes().names() if modes().get(m).plan is None] == ["ps"]


def test_a_parameter_server_mesh_is_of_no_kind_and_a_bad_name_lists_the_kinds() -> None:
    assert kind_of(frozenset({"role", "dp"})) is None
    with pytest.raises(ConfigError, match=r"no kind of plan is called 'zero'; the kinds are "
                                          r"single, dp, pipeline, hybrid, tensor"):
        plan_kind("zero")


def test_stage_ranges_name_blocks_and_replicas() -> None:
    assert stage_ranges(PipelinePlan((Stage(0, 3), Stage(3, 7, 2)))) == "[0,3)x1 [3,7)x2"
