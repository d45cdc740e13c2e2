"""`plan validate`'s pure parts: its figures (APE, Kendall's tau, regret), the held-out set,
the candidates and who chooses them, the optimizer's and shared cores' terms of the cost
model it checks, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.cli.plan_load import load_line, ranked_at_load
from approxdist.cli.plan_validate import sections
from approxdist.cli.plan_validate_report import print_report
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError, DataError
from approxdist.pipeline.partition import balance_costs
from approxdist.pipeline.schedule import simulate
from approxdist.planner.cost import CodecCost, LinkLevel, Network, PipelinePlan, Stage, dp_time
from approxdist.planner.cost.calibration_file import CostCalibration, from_json
from approxdist.planner.cost.pipeline import pipeline_time, stage_durations
from approxdist.planner.objective import SolverSettings
from approxdist.planner.pipedream_optimizer import Level
from approxdist.planner.profile import BlockProfile, Profile, scale_times
from approxdist.planner.search import optimizer_s, search
from approxdist.planner.validation.candidates import (
    Candidate,
    at_load,
    between,
    busy_ranks,
    candidates,
    repriced,
    torchgpipe,
)
from approxdist.planner.validation.configs import FULL, QUICK, select
from approxdist.planner.validation.metrics import ape, kendall_tau, regret
from approxdist.planner.validation.report import summarize, verdicts
from approxdist.train.mode import modes

MB = 1 << 20


def toy(times: list[tuple[float, float]], params: list[int]) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", f, b, 64 * 1024, p, MB)
                   for i, ((f, b), p) in enumerate(zip(times, params)))
    return Profile("toy", (4,), 8, 1, "test", "test", blocks)


def test_ape_tau_and_regret_by_hand() -> None:
    assert ape(1.2, 1.0) == pytest.approx(0.2) and ape(0.5, 1.0) == pytest.approx(0.5)
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # one discordant pair of 6: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie on one side: 2 concordant, 0 discordant, 1 tie -> 2 / sqrt(2 * 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau([1], [2])) and math.isnan(kendall_tau([1, 1], [1, 2]))
    assert regret(1.1, [1.1, 1.0, 2.0]) == pytest.approx(0.1) and regret(1.0, [1.0, 3.0]) == 0
    with pytest.raises(ConfigError, match="must be > 0"):
        ape(1.0, 0.0)


def test_the_held_out_set_is_fixed_and_quick_is_a_subset() -> None:
    keys = [s.key for s in FULL]
    assert len(keys) == len(set(keys)) == 18
    assert {s.world_size for s in FULL} == {2, 3, 4}
    assert {s.model.label for s in QUICK} == {"mlp-wide", "resnet20"}
    assert len(QUICK) == 5 and set(QUICK) <= set(FULL)
    assert [s.key for s in select(FULL, "resnet20,N3")] == [
        "resnet20/N3/loopback/fp32", "resnet20/N3/bw=1gbit/fp32", "resnet20/N3/bw=1gbit/bf16"]
    with pytest.raises(ConfigError, match="matches no configuration; keys look like"):
        select(FULL, "vgg")


def test_candidates_name_every_chooser_once_and_torchgpipe_balances_time() -> None:
    profile = toy([(1e-3, 2e-3), (4e-3, 8e-3), (1e-3, 2e-3), (2e-3, 4e-3), (1e-3, 1e-3)],
                  [MB, 4 * MB, 0, MB, 64 * 1024])
    net = Network(LinkLevel.from_link("inter", "bw=1gbit,lat=50us"))
    base = SolverSettings(3, net)
    found = candidates(profile, base, (3, 6), (Level(3, 1.25e8),), keep=3)
    choosers = [who for c in found for who in c.choosers]
    assert sorted(choosers) == sorted(["ours", "ours-2", "ours-3", "dp", "torchgpipe",
                                       "pipedream"])
    assert "ours" in found[0].choosers  # the planner's best comes first
    assert len({c.key for c in found}) == len(found)  # a plan chosen twice is measured once
    gp = torchgpipe(profile, base, (3, 6))
    assert gp is not None and gp.plan.schedule == "gpipe"
    split = balance_costs([b.fwd_s + b.bwd_s for b in profile.blocks], 3)
    assert [(st.first, st.end) for st in gp.plan.stages] == split.ranges
    assert torchgpipe(profile, SolverSettings(6, net), (6,)) is None  # more ranks than blocks
    with pytest.raises(ConfigError, match="keep = 0 must be >= 1"):
        candidates(profile, base, (3,), (Level(3, 1.25e8),), keep=0)


def test_a_candidate_repriced_on_another_profile_keeps_its_plan() -> None:
    """The plans are chosen on one profile and priced again on the one taken while they
    ran: the same plan, choosers and samples; its price that of the other profile."""
    times = [(1e-3, 2e-3), (4e-3, 8e-3), (1e-3, 2e-3), (2e-3, 4e-3), (1e-3, 1e-3)]
    params = [MB, 4 * MB, 0, MB, 64 * 1024]
    profile = toy(times, params)
    slower = toy([(1.2 * f, 1.2 * b) for f, b in times], params)
    base = SolverSettings(3, Network(LinkLevel.from_link("inter", "bw=1gbit,lat=50us")))
    found = candidates(profile, base, (3, 6), (Level(3, 1.25e8),), keep=3)
    assert {c.ranked.mode for c in found} >= {"dp", "pipeline"}
    for c in found:
        same, again = repriced(c, profile, base), repriced(c, slower, base)
        assert same.ranked.step_s == pytest.approx(c.ranked.step_s)
        assert (again.key, again.choosers) == (c.key, c.choosers)
        assert again.ranked.samples_per_step == c.ranked.samples_per_step
        assert again.ranked.step_s > c.ranked.step_s  # more compute, same transfers


def test_busy_ranks_is_how_many_ranks_share_the_compute() -> None:
    """Equal compute per rank gives N; two heavy stages and two replicas of a light one
    about 2, by hand: (sum c)^2 / sum c^2."""
    profile = toy([(1e-3, 2e-3), (1e-3, 2e-3), (0.05e-3, 0.05e-3), (0.05e-3, 0.05e-3)],
                  [MB, MB, MB, 0])
    dp = PipelinePlan((Stage(0, 4, 4),), microbatches=4)
    assert busy_ranks(dp, profile) == pytest.approx(4)
    even = PipelinePlan((Stage(0, 2), Stage(2, 4)), microbatches=8)
    assert busy_ranks(even, toy([(1e-3, 2e-3)] * 4, [MB] * 4)) == pytest.approx(2)
    light = PipelinePlan((Stage(0, 1), Stage(1, 2), Stage(2, 4, 2)), microbatches=7)
    shares = [7 * 3e-3, 7 * 3e-3, 4 * 0.2e-3, 4 * 0.2e-3]  # ceil(7 / 2) a replica
    assert busy_ranks(light, profile) == pytest.approx(sum(shares) ** 2
                                                      / sum(c * c for c in shares))
    assert 2.0 < busy_ranks(light, profile) < 2.2


@pytest.mark.parametrize("busy, count, want", [
    (1.0, 4, ((1, 1.0), (2, 0.0))),
    (2.25, 4, ((2, 0.75), (3, 0.25))),
    (4.0, 4, ((3, 0.0), (4, 1.0))),
    (5.0, 4, ((3, 0.0), (4, 1.0))),  # no more than the ranks measured
    (0.5, 3, ((1, 1.0), (2, 0.0))),
    (1.7, 1, ((1, 1.0), (1, 0.0))),
])
def test_a_plan_is_priced_between_the_two_nearest_measured_loads(
        busy: float, count: int, want: tuple[tuple[int, float], tuple[int, float]]) -> None:
    (lo, w_lo), (hi, w_hi) = between(busy, count)
    assert (lo, hi) == (want[0][0], want[1][0])
    assert (w_lo, w_hi) == pytest.approx((want[0][1], want[1][1]))


def test_a_plan_at_load_is_its_price_on_the_profiles_around_its_busy_ranks() -> None:
    """Data parallelism keeps both ranks busy: priced on the second profile alone (at its
    factor); the same plan on a profile twice as slow costs more, never less."""
    profile = toy([(1e-3, 2e-3)] * 4, [MB, MB, MB, 0])
    base = SolverSettings(2, Network(LinkLevel.from_link("inter", "bw=1gbit")))
    dp = next(c for c in candidates(profile, base, (2,), (Level(2, 1.25e8),), keep=1)
              if "dp" in c.choosers)
    slow = scale_times(profile, 2.0)
    step, busy, factor = at_load(dp, (profile, slow), (1.0, 2.0), base)
    assert busy == pytest.approx(2.0) and factor == pytest.approx(2.0)
    assert step == pytest.approx(repriced(dp, slow, base).ranked.step_s)
    assert step > at_load(dp, (profile, profile), (1.0, 1.0), base)[0]


def test_plan_ranks_its_plans_again_at_their_load() -> None:
    """`plan --load-probe`: each plan priced at its own load, fastest per sample first."""
    profile = toy([(1e-3, 2e-3)] * 4, [MB, MB, MB, 0])
    base = SolverSettings(2, Network(LinkLevel.from_link("inter", "bw=1gbit")))
    ranked = search(profile, base, ("1f1b",), (2, 4))
    loads = ((profile, scale_times(profile, 3.0)), (1.0, 3.0))
    again = ranked_at_load(ranked, loads, base)
    assert {r.key for r in again} == {r.key for r in ranked} and len(again) == len(ranked)
    assert [r.per_sample_s for r in again] == sorted(r.per_sample_s for r in again)
    for r in again:
        was = next(p for p in ranked if p.key == r.key)
        assert r.step_s == pytest.approx(at_load(Candidate(was, ()), *loads, base)[0])
        assert r.step_s > was.step_s  # every plan computes on >= 1 busy rank at x1 .. x3
    assert "1 x1.000, 2 x3.000" in load_line(loads)


def _row(setting: str, predicted: float, measured: float, *who: str,
         samples: int = 10) -> dict[str, object]:
    return {"setting": setting, "predicted_s": predicted, "measured_s": measured,
            "choosers": list(who), "samples_per_step": samples}


def test_summary_figures_by_hand() -> None:
    rows = [_row("a", 1.0, 1.0, "ours"), _row("a", 2.2, 2.0, "dp"),
            _row("a", 3.0, 2.5, "torchgpipe", "pipedream"),
            _row("b", 1.5, 2.0, "ours", "pipedream"), _row("b", 1.8, 1.6, "torchgpipe")]
    s = summarize(rows)
    assert s["median_ape"] == pytest.approx(0.125) and s["max_ape"] == pytest.approx(0.25)
    # in b the chosen plan measured 2.0 against 1.6: regret 0.25; in a none
    assert s["regret"] == pytest.approx(0.125) and s["max_regret"] == pytest.approx(0.25)
    assert s["kendall_tau_within"] == pytest.approx((1.0 - 1.0) / 2)
    assert s["vs_torchgpipe"]["differ"] == 2 and s["vs_torchgpipe"]["ours_faster"] == 1
    assert s["vs_pipedream"]["differ"] == 1  # in b it chose ours
    met = {key: ok for key, _, ok in verdicts(s)}
    assert met == {"median_ape": True, "max_ape": True, "kendall_tau": False, "regret": False}
    assert "ex_ante" not in s  # rows without planned_s
    ante = summarize([{**r, "planned_s": 2 * float(r["measured_s"])} for r in rows])["ex_ante"]
    assert ante["median_ape"] == ante["max_ape"] == pytest.approx(1.0)
    assert ante["kendall_tau"] == pytest.approx(1.0)  # twice the measured: the same order
    assert ante["kendall_tau_within"] == pytest.approx(1.0)
    assert ante["regret"] == s["regret"]  # chosen on that profile either way
    assert {key: ok for key, _, ok in verdicts(ante)} == {
        "median_ape": False, "max_ape": False, "kendall_tau": True, "regret": False}
    # the bias: signed errors +0, +10, +20, -25, +12.5 % -> median +10 %, one under
    assert s["median_signed"] == pytest.approx(0.10) and s["under"] == 1
    assert ante["median_signed"] == pytest.approx(1.0) and ante["under"] == 0
    # the machine's drift, one per setting; the profile alone beside the ex-ante figures
    moved = summarize([{**r, "drift": 1.1 if r["setting"] == "a" else 0.9,
                        "planned_alone_s": 0.5 * float(r["measured_s"])} for r in rows])
    assert moved["drift"] == {"median": pytest.approx(1.0), "min": 0.9, "max": 1.1}
    assert moved["ex_ante_alone"]["median_signed"] == pytest.approx(-0.5)
    # per mode: the rows without a mode are one group, its signed median +10 %
    assert s["bias_by_mode"] == {"-": {"count": 5, "in_round": pytest.approx(0.10)}}
    modes = summarize([{**r, "mode": "dp" if r["setting"] == "a" else "pipeline",
                        "planned_s": float(r["measured_s"])} for r in rows])["bias_by_mode"]
    assert modes["dp"] == {"count": 3, "in_round": pytest.approx(0.10), "ex_ante": 0.0}
    assert modes["pipeline"]["in_round"] == pytest.approx((-0.25 + 0.125) / 2)


def test_the_report_gives_the_ex_ante_figures_first(capsys) -> None:
    rows = [{**_row("a", 1.0, 1.0, "ours"), "planned_s": 1.5},
            {**_row("a", 2.2, 2.0, "dp"), "planned_s": 1.0}]
    summary = print_report(rows, "held-out")
    out = capsys.readouterr().out
    ante = out.index("ex ante: each plan priced on the profile it was chosen on, taken before "
                     "the timed rounds, at its load factor (a probe before any step); "
                     "held-out settings:")
    assert ante < out.index("in the rounds: priced on the profile taken in each timed round")
    assert "kendall_tau  -1.00 (target >= 0.80): NOT met" in out[ante:]
    # +50 % and -50 %: the median of the two, one of two predicted faster
    assert "bias         signed median +0.0 %, 1 of 2 predicted faster" in out[ante:]
    assert "bias by mode (signed median, ex ante / in the rounds): - (2) +0.0 % / +5.0 %" \
        in out
    assert summary["settings_set"] == "held-out" and summary["ex_ante"]["regret"] == 0.0
    assert "2 configurations in 1 held-out settings; Kendall's tau within settings -1.00 " \
           "(ex ante)" in out


def test_the_optimizer_and_shared_cores_are_priced() -> None:
    profile = toy([(1e-3, 2e-3)] * 4, [MB, 2 * MB, MB, 0])
    settings = SolverSettings(2, Network(LinkLevel.from_link("inter", "bw=1gbit")),
                              optimizer_s_per_byte=1e-9)
    # the largest stage's parameters: blocks 0-1 hold 3 MB
    assert optimizer_s(profile, settings, (Stage(0, 2), Stage(2, 4))) == pytest.approx(3 * MB * 1e-9)
    free = LinkLevel("loopback", 0.0, 0.0, 0.0, cores=2)
    alone, shared = dp_time(profile, 2, Network(free)), dp_time(profile, 4, Network(free))
    assert shared.forward_s == pytest.approx(2 * alone.forward_s)  # 4 ranks on 2 cores
    plan2, plan4 = (PipelinePlan(tuple(Stage(i, i + 1) for i in range(0, 4, 4 // n)) if n == 4
                                 else (Stage(0, 2), Stage(2, 4)), "1f1b", 8) for n in (2, 4))
    t2 = pipeline_time(profile, plan2, Network(free))
    t4 = pipeline_time(profile, plan4, Network(free))
    alone4 = pipeline_time(profile, plan4, Network(LinkLevel("loopback", 0, 0, 0, cores=4)))
    # 4 ranks on 2 cores: the schedule is played on 2 shared cores (the computing ranks
    # share them, a waiting one holds none): slower than a core each, faster than every
    # rank at half speed for the whole step (the fill and the drain leave cores free)
    order, _ = plan4.order()
    on_two = simulate(order, 4, stage_durations(profile, plan4, Network(free)), cores=2)
    assert t4.step_s == pytest.approx(on_two.makespan)
    assert alone4.step_s < t4.step_s < 2 * alone4.step_s
    assert t2.step_s == pytest.approx(pipeline_time(profile, plan2, Network(
        LinkLevel("loopback", 0, 0, 0, cores=4))).step_s)


def test_calibration_file_keeps_optimizer_costs(tmp_path: Path) -> None:
    cal = CostCalibration.of(levels=(LinkLevel("loopback", 1e-4, 1e-9, 0.0, cores=2),),
                             codecs={"bf16": CodecCost.of("bf16")},
                             optimizers={"momentum": 2e-12})
    back = CostCalibration.load(cal.save(tmp_path / "cost.json"))
    assert back.optimizer_s_per_byte("momentum") == 2e-12 and back.optimizer_s_per_byte("adam") == 0
    data = json.loads((tmp_path / "cost.json").read_text())
    data["optimizers"] = {"lion": 1e-9}
    with pytest.raises(DataError, match="names optimizer 'lion'; valid: sgd, momentum, adam"):
        from_json(data, "cost.json")
    data["optimizers"] = {"adam": -1}
    with pytest.raises(DataError, match=r"optimizers\['adam'\] = -1 must be a finite number"):
        from_json(data, "cost.json")


def test_a_candidate_runs_as_train_plan_would() -> None:
    setting = select(FULL, "mlp-wide/N3/bw=1gbit/bf16")[0]
    profile = toy([(1e-3, 2e-3)] * 7, [MB] * 7)
    cal = CostCalibration.of(levels=(LinkLevel("loopback", 1e-4, 1e-9, 0.0, cores=2),))
    net = Network(cal.level("loopback").with_link("bw=1gbit"))
    bf16 = CodecCost.of("bf16")
    found = candidates(profile, SolverSettings(3, net, fwd_codec=bf16, bwd_codec=bf16,
                                               grad_codec=bf16), (3, 6), (Level(3, 1.25e8),))
    for c in found:
        cfg = build_config(sections(setting, c, profile, threads=1))
        assert cfg.train.world_size == 3 and cfg.comm.link == "bw=1gbit"
        assert cfg.train.parallel == c.ranked.mode and cfg.model.hidden == 1024
        mode = modes().get(cfg.train.parallel)
        wires = [n for n in ("grad", "fwd", "bwd") if mode.reads(f"wire.{n}.codec")]
        assert wires and all(cfg.wire.wire(n).codec == "bf16" for n in wires)
        assert cfg.train.threads == 1
        per_step = 3 if c.ranked.mode == "dp" else c.ranked.plan.microbatches
        assert cfg.data.batch_size == per_step * profile.micro_batch_size


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "vgg"], "--only 'vgg' matches no configuration"),
    (["--keep", "0"], "--keep 0 must be >= 1"),
    (["--rounds", "0"], "rounds = 0 must be an integer >= 1"),
    (["--calibrate-only"], "--calibrate-only fits a calibration to save: give "
                           "--save-calibration FILE too"),
    (["--save-calibration", "a.json", "--calibration", "b.json"],
     "nothing is fitted when a calibration is given; drop one"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["plan", "validate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_calibration_without_this_machine_is_refused(tmp_path: Path, capsys) -> None:
    cal = CostCalibration.of(levels=(LinkLevel.from_link("inter", "bw=1gbit"),))
    path = cal.save(tmp_path / "cost.json")
    assert main(["plan", "validate", "--calibration", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no 'loopback' level (it has inter)" in err and len(err.splitlines()) == 1
