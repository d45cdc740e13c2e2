"""The kinds of plan the planner prices, in one table: the mesh axes each uses, and how it is shown.

A plan's kind follows from the mesh axes of size > 1 it uses (`Mesh.used`): none is
`single`, `dp` alone is data parallelism, `pp` is a pipeline (with `dp`, a hybrid), `tp`
without `pp` tensor parallelism. Each kind is named after the parallel mode that runs it
(`train --parallel NAME`; `train --plan` picks the mode through `kind_of`, and each
mode record names the kind it runs), so the planner, its reports and the trainer read
one table instead of comparing mode names; a new kind of plan is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from approxdist.errors import ConfigError

if TYPE_CHECKING:
    from approxdist.planner.cost.pipeline import PipelinePlan


@dataclass(frozen=True)
class PlanKind:
    """A kind of plan: the axes its plans use, and whether they run a pipeline schedule."""

    name: str
    #: the axes of size > 1 every plan of the kind uses
    needs: frozenset[str]
    #: the axes of size > 1 its plans may use (`needs` included)
    axes: frozenset[str]
    #: its plans run a pipeline schedule over micro-batches (their schedule and
    #: micro-batch count tell plans apart and are shown)
    scheduled: bool = False
    #: the axes an unscheduled plan's label names with their sizes (`tp=2,dp=2`)
    shown: tuple[str, ...] = ("dp",)

    def holds(self, used: frozenset[str]) -> bool:
        """Whether a plan using the axes `used` (those of size > 1) is of this kind."""
        return self.needs <= used <= self.axes

    def label(self, plan: PipelinePlan, tp: int = 1) -> str:
        """A plan of this kind in a few words: `tp=2,dp=2`, `dp=4`, `1f1b M=8 [0,3)x1
        [3,7)x2` (`tp`: the shards of every replica)."""
        if not self.scheduled:
            sizes = {"tp": tp, "dp": plan.stages[0].replicas}
            return ",".join(f"{axis}={sizes[axis]}" for axis in self.shown)
        return f"{plan.schedule} M={plan.microbatches} {stage_ranges(plan)}"


def _kind(name: str, needs: set[str], axes: set[str], scheduled: bool = False,
          shown: tuple[str, ...] = ("dp",)) -> PlanKind:
    return PlanKind(name, frozenset(needs), frozenset(needs | axes), scheduled, shown)


#: every kind of plan; their `holds` rules are disjoint
PLAN_KINDS: tuple[PlanKind, ...] = (
    _kind("single", set(), set()),
    _kind("dp", {"dp"}, set()),
    _kind("pipeline", {"pp"}, {"tp"}, scheduled=True),
    _kind("hybrid", {"pp", "dp"}, {"tp"}, scheduled=True),
    _kind("tensor", {"tp"}, {"dp"}, shown=("tp", "dp")),
)


def plan_kind(name: str) -> PlanKind:
    """The kind called `name` (one `ConfigError` line listing the kinds if none is)."""
    for kind in PLAN_KINDS:
        if kind.name == name:
            return kind
    raise ConfigError(f"no kind of plan is called {name!r}; the kinds are "
                      f"{', '.join(k.name for k in PLAN_KINDS)}")


def kind_of(used: frozenset[str]) -> PlanKind | None:
    """The kind of a plan that uses the axes `used` (those of size > 1); None if no kind
    does (a parameter server's roles, say)."""
    return next((k for k in PLAN_KINDS if k.holds(used)), None)


def used_axes(plan: PipelinePlan, tp: int = 1) -> frozenset[str]:
    """The axes of size > 1 of `plan` when every replica is split over `tp` ranks."""
    used = {"pp"} if len(plan.stages) > 1 else set()
    used |= {"dp"} if any(st.replicas > 1 for st in plan.stages) else set()
    return frozenset(used | ({"tp"} if tp > 1 else set()))


def stage_ranges(plan: PipelinePlan) -> str:
    """`[0,3)x1 [3,7)x2`: each stage's blocks [first, end) and replicas."""
    return " ".join(f"[{st.first},{st.end})x{st.replicas}" for st in plan.stages)
