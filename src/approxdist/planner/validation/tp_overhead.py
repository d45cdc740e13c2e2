"""The tensor engine's work per tp collective (`tp_collective_s`), fitted on the tiny models' tp runs.

The runs are `engine_runs.TP_MODELS` (an MLP of width 16 at depths 2 and 8, split over 2
ranks by its own column-row plan, one sample a step: 1 and 7 tp all-reduces a step,
models no validation setting uses). Each is priced as the planner prices a tensor plan
(`search.tensor_plan`: the shard's compute, its all-reduces, the data-parallel engine's
`dp_step_s`, the loss, the optimizer) with the rest of the engine overhead known (fitted
before, on the pipeline and data-parallel runs), at zero `tp_collective_s` (`base_s`) and
at a probe of it (the slope: the collectives on the step's path, from the cost model, as
a secant refined as the other fits' are). `fit` solves measured = base + slope x
`tp_collective_s` for that one unknown >= 0 by least squares on the relative error; its
two depths differ in collectives, not in the fixed work a step does, so `check` refuses
runs of one depth: the term would take up what the step's fixed work misses.
Pure: the timing and the layouts (`planner.tp_layout`, one forward of the real model) are
the caller's (`cli/plan_validate_calibrate.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from approxdist.errors import DataError
from approxdist.planner.cost.links import Network
from approxdist.planner.cost.overhead import OverheadRow, RuntimeOverhead, refine
from approxdist.planner.cost.tensor import TPLayout
from approxdist.planner.objective import SolverSettings
from approxdist.planner.profile import Profile
from approxdist.planner.search import TensorSpace, tensor_plan
from approxdist.planner.validation.engine_runs import PROBE_S, REFINE, TP_MODELS, WORLD


def step_s(profile: Profile, layout: TPLayout, settings: SolverSettings) -> float:
    """The planner's price of one step of `profile` split over `WORLD` ranks (one replica)."""
    plan = tensor_plan(profile, TensorSpace(layout, (WORLD,)), settings, WORLD)
    assert plan is not None  # no memory limit: a shard always fits
    return plan.step_s


def rows(profiles: Mapping[str, Profile], layouts: Mapping[str, TPLayout],
         settings: SolverSettings, measured: Mapping[str, float], probe: float = PROBE_S
         ) -> list[OverheadRow]:
    """Every measured tp run (`tp/D<depth>`) as an `OverheadRow`: the planner's price with
    `settings` (its overhead: the fitted rest) at zero `tp_collective_s` and its growth per
    second of it (secant to `probe`). `profiles`, `layouts`: by the model's label."""
    zero = replace(settings, overhead=replace(settings.overhead, tp_collective_s=0.0))
    at = replace(settings, overhead=replace(settings.overhead, tp_collective_s=probe))
    out = []
    for key, seconds in measured.items():
        if key not in TP_MODELS:
            continue
        label = TP_MODELS[key].label
        base = step_s(profiles[label], layouts[label], zero)
        grown = step_s(profiles[label], layouts[label], at)
        out.append(OverheadRow(key, seconds, base, (grown - base) / probe))
    return out


def check(found: list[OverheadRow]) -> None:
    """`DataError` (one line) unless the rows cover two counts of collectives a step."""
    slopes = sorted({round(r.slope, 9) for r in found})
    if len(slopes) < 2:
        raise DataError(f"{len(found)} tp run(s) ({', '.join(r.key for r in found) or 'none'}) "
                        f"with {slopes or 'no'} collective(s) a step: the tp fit needs runs of "
                        f"two depths ({', '.join(TP_MODELS)}); time engine_runs.plans() whole")


def fit(profiles: Mapping[str, Profile], layouts: Mapping[str, TPLayout],
        network: Network, overhead: RuntimeOverhead, measured: Mapping[str, float],
        optimizer_s_per_byte: float = 0.0, optimizer_s_per_tensor: float = 0.0
        ) -> tuple[float, float, list[OverheadRow]]:
    """(`tp_collective_s`, rms relative error, the rows of the last round), with
    `overhead` (the fitted rest) and the optimizer's prices known."""
    settings = SolverSettings(WORLD, network, optimizer_s_per_byte=optimizer_s_per_byte,
                              optimizer_s_per_tensor=optimizer_s_per_tensor,
                              overhead=overhead)

    def rows_at(probe: float) -> list[OverheadRow]:
        found = rows(profiles, layouts, settings, measured, probe)
        check(found)
        return found

    return refine(rows_at, PROBE_S, REFINE)
