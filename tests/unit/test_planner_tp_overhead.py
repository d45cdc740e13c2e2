"""The tensor engine's work per tp collective (`RuntimeOverhead.tp_collective_s`): `tp_time`
and the planner charge it once per collective, its fit on the tiny models' tp runs
recovers a known value (and refuses runs of one depth), its calibration file key round
trips and may be absent, and its runs are held out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.config.loader import build_config
from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost import LinkLevel, Network
from approxdist.planner.cost.calibration_file import CostCalibration, from_json
from approxdist.planner.cost.overhead import OverheadRow, RuntimeOverhead, fit_one
from approxdist.planner.cost.tensor import TPBlock, TPLayout, TPOptions, TPSite, tp_time
from approxdist.planner.objective import SolverSettings
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.tp_layout import layout_of
from approxdist.planner.validation import engine_runs, tp_overhead
from approxdist.planner.validation.configs import HELD_OUT_MODELS, MODELS, TENSOR_MODELS

LOOPBACK = LinkLevel("loopback", 2e-4, 3e-10, 8e-10, cores=2)


def toy(blocks: int = 4) -> tuple[Profile, TPLayout]:
    """`blocks` wholly split blocks of 1 ms forward, 2 ms backward; a column-row pair's
    all-reduce of 256 values per sample each way (none backward in the first block)."""
    profile = Profile("toy", (8,), 4, 1, "test", "test", tuple(
        BlockProfile(f"b{i}", 1e-3, 2e-3, 4096, 4096, 0, 0.0, (4096,)) for i in range(blocks)))
    sites = tuple(TPSite(i, f"{i}.fc", d, 256) for i in range(blocks)
                  for d in ("fwd", "bwd") if i or d == "fwd")
    return profile, TPLayout("toy", (("fc", "colwise"),),
                             tuple(TPBlock(1.0, ((4096, True),)) for _ in range(blocks)), sites)


@pytest.mark.parametrize(("tp", "replicas", "cores"), [(2, 1, 2), (4, 1, 2), (2, 1, 8)])
def test_tp_time_grows_by_the_term_times_the_collectives(tp: int, replicas: int,
                                                         cores: int) -> None:
    profile, lay = toy()
    network = Network(LinkLevel("loopback", 2e-4, 3e-10, 8e-10, cores=cores))
    e = 3e-4
    without = tp_time(profile, lay, replicas, network, TPOptions(tp, algorithm="ring"))
    charged = tp_time(profile, lay, replicas, network, TPOptions(tp, algorithm="ring",
                                                                 engine_s=e))
    load = network.compute_load(tp * replicas)  # CPU work: shared cores slow it as compute
    assert charged.collectives == without.collectives == 7
    assert charged.engine_s == pytest.approx(7 * load * e)
    assert charged.step_s - without.step_s == pytest.approx(7 * load * e)
    assert charged.collective_s == without.collective_s  # the link time is apart
    with pytest.raises(ConfigError, match="engine_s = -1 must be a finite number"):
        TPOptions(2, engine_s=-1)


def test_the_planner_charges_the_calibrated_term() -> None:
    profile, lay = toy()
    plain = SolverSettings(2, Network(LOOPBACK))
    priced = SolverSettings(2, Network(LOOPBACK),
                            overhead=RuntimeOverhead(dp_step_s=1e-3, tp_collective_s=2e-4))
    steps = [tp_overhead.step_s(profile, lay, s) for s in (plain, priced)]
    load = Network(LOOPBACK).compute_load(2)
    assert steps[1] - steps[0] == pytest.approx(load * (1e-3 + 7 * 2e-4))


def profile_of(layout: TPLayout) -> Profile:
    """A profile with the layout's blocks and parameters (0.1 ms forward, 0.2 ms backward
    a block, one sample)."""
    return Profile(layout.model, (16,), 1, 1, "test", "test", tuple(
        BlockProfile(f"b{i}", 1e-4, 2e-4, 64, sum(s for s, _ in b.params), 64, 0.0,
                     tuple(s for s, _ in b.params)) for i, b in enumerate(layout.blocks)))


@pytest.fixture(scope="module")
def tiny() -> tuple[dict[str, Profile], dict[str, TPLayout]]:
    """The tp runs' models as the calibration reads them: their layouts at tp = 2."""
    layouts = {}
    for spec in engine_runs.TP_MODELS.values():
        cfg = build_config(spec.sections)
        layouts[spec.label] = layout_of(cfg.model, cfg.data, 1, "", (engine_runs.WORLD,))
    return {k: profile_of(v) for k, v in layouts.items()}, layouts


def test_the_fit_recovers_a_known_term(
        tiny: tuple[dict[str, Profile], dict[str, TPLayout]]) -> None:
    profiles, layouts = tiny
    network = Network(LOOPBACK)
    known = RuntimeOverhead(dp_step_s=1.2e-3, loss_value_s=5e-9)
    truth = SolverSettings(2, network, optimizer_s_per_byte=1e-9,
                           optimizer_s_per_tensor=1e-5,
                           overhead=RuntimeOverhead(dp_step_s=1.2e-3, loss_value_s=5e-9,
                                                    tp_collective_s=4.5e-4))
    measured = {key: tp_overhead.step_s(profiles[spec.label], layouts[spec.label], truth)
                for key, spec in engine_runs.TP_MODELS.items()}
    measured["dp"] = 1.0  # another engine's run: not this fit's
    value, rms, rows = tp_overhead.fit(profiles, layouts, network, known, measured, 1e-9, 1e-5)
    assert value == pytest.approx(4.5e-4, rel=1e-6) and rms == pytest.approx(0.0, abs=1e-9)
    # one replica on 2 ranks: the step grows by one term per collective (1 and 7 a step)
    assert {r.key: r.slope for r in rows} == {"tp/D2": pytest.approx(1.0),
                                              "tp/D8": pytest.approx(7.0)}


def test_the_fit_refuses_runs_of_one_depth(
        tiny: tuple[dict[str, Profile], dict[str, TPLayout]]) -> None:
    profiles, layouts = tiny
    with pytest.raises(DataError, match=r"1 tp run\(s\) \(tp/D2\) with \[1.0\] collective"):
        tp_overhead.fit(profiles, layouts, Network(LOOPBACK), RuntimeOverhead(),
                        {"tp/D2": 2e-3, "dp": 1.0})
    with pytest.raises(DataError, match="needs runs of two depths"):
        tp_overhead.fit(profiles, layouts, Network(LOOPBACK), RuntimeOverhead(), {"dp": 1.0})


def test_one_unknown_by_least_squares_on_the_relative_error() -> None:
    rows = [OverheadRow("a", 1e-3 + 2 * 3e-4, 1e-3, 2.0), OverheadRow("b", 2e-3 + 6 * 3e-4,
                                                                       2e-3, 6.0)]
    value, rms = fit_one(rows)
    assert value == pytest.approx(3e-4) and rms == pytest.approx(0.0, abs=1e-12)
    # measured below the price without it: no negative overhead
    assert fit_one([OverheadRow("a", 1e-3, 2e-3, 4.0)])[0] == 0.0
    with pytest.raises(DataError, match="no overhead row to fit"):
        fit_one([])


def test_the_calibration_file_keeps_the_term_and_reads_files_without_it(
        tmp_path: Path) -> None:
    over = RuntimeOverhead(action_s=2e-4, dp_step_s=1e-3, tp_collective_s=4.5e-4)
    cal = CostCalibration.of(levels=(LOOPBACK,), overhead=over)
    path = cal.save(tmp_path / "cost.json")
    assert CostCalibration.load(path).overhead == over
    data = json.loads(path.read_text())
    assert data["engine"]["tp_collective_s"] == 4.5e-4
    del data["engine"]["tp_collective_s"]  # a file written before the term: not priced
    old = from_json(data, "old.json").overhead
    assert old.tp_collective_s == 0.0 and old.dp_step_s == 1e-3
    data["engine"]["tp_collective_s"] = -1e-4
    with pytest.raises(DataError, match=r"old.json engine: engine overhead tp_collective_s = "
                                        r"-0.0001 must be a finite number"):
        from_json(data, "old.json")


def test_the_tp_runs_are_held_out_models_on_two_ranks() -> None:
    sections = dict(engine_runs.plans())
    for key, depth in (("tp/D2", 2), ("tp/D8", 8)):
        run = sections[key]
        assert run["train"]["parallel"] == "tensor" and run["train"]["world_size"] == 2
        assert run["tp"] == {"size": 2} and run["data"]["batch_size"] == 1
        assert run["model"] == {"name": "mlp", "hidden": 16, "depth": depth}
    validated = [*MODELS.values(), *TENSOR_MODELS.values(), *HELD_OUT_MODELS.values()]
    assert all(spec.sections["model"] != engine_runs.DEEP.sections["model"]
               for spec in validated)
