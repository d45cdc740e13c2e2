"""AdaPrec safe by default: the error on the update keeps a damaging codec out whatever its
speed; the default rule (fastest within the budget); one codec per parameter under the
budget (L-GreCo); and the bad input of these options (one line, exit 2)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from approxdist.adaptive.candidates import candidate_rules, check_candidates
from approxdist.adaptive.controller import AdaPrecController
from approxdist.adaptive.decide import Trial, assess
from approxdist.adaptive.learning_curve import LearningCurveModel
from approxdist.adaptive.per_layer import assign, mix_rules, mix_spec
from approxdist.cli.main import main
from approxdist.config.adaprec import AdaPrecConfig
from approxdist.errors import ConfigError
from approxdist.train.straggler import Stragglers
from tests.unit.test_adaprec_controller import Sim, _drive

#: the default rule; its first boundary is at step 0 (`first_boundary`), then every 10 steps
DEFAULTS = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=2, overhead_budget=1.0)


def test_a_damaging_codec_is_never_chosen_however_fast_and_however_it_seems_to_gain() -> None:
    # the poison gains 5x fp32's signal per step in a tenth of the time: speed and the
    # curve would both pick it; its error on the update (1.4) does not let them
    sim = Sim({"fp32": 0.002, "poison": 0.01, "fp8": 0.002},
              {"fp32": 1.0, "poison": 0.1, "fp8": 0.5}, error={"poison": 1.4, "fp8": 0.05})
    ctl, records = _drive(sim, DEFAULTS, ("fp32", "poison", "fp8"))
    assert [r["step"] for r in records] == [0, 10, 20, 30]  # decided from step 0 on
    assert [c for _, c in ctl.chosen] == ["fp8"] * 4
    tested = [r for r in records if "poison" in r["candidates"]]
    assert len(tested) == 2 and records[0]["resting"] == {"poison": 20}  # rests a boundary
    for r in tested:
        assert r["candidates"]["poison"]["verdict"] == "damaging"
        assert r["candidates"]["poison"]["error"] == pytest.approx(1.4)
        assert r["decided_by"] == "error" and r["reason"] == "fastest within the error budget"
        assert len(r["candidates"]["poison"]["points"]) == 1  # stopped after its first chunk
    # the curve rule is gated alike
    curve = AdaPrecConfig(**{**DEFAULTS.__dict__, "decide": "curve"})
    ctl, _ = _drive(Sim({"fp32": 0.002, "poison": 0.01}, {"fp32": 1.0, "poison": 0.1},
                        error={"poison": 1.4}), curve, ("fp32", "poison"))
    assert {c for _, c in ctl.chosen} == {"fp32"}


def test_the_fastest_safe_codec_wins_and_the_budget_is_the_users() -> None:
    rates = {"fp32": 0.002, "fp8": 0.002, "table4": 0.002}
    secs = {"fp32": 1.0, "fp8": 0.5, "table4": 0.3}
    errors = {"fp8": 0.05, "table4": 0.2}
    ctl, records = _drive(Sim(rates, secs, error=errors), DEFAULTS, ("fp32", "fp8", "table4"))
    assert [c for _, c in ctl.chosen] == ["table4"] * 4
    assert records[0]["decided_by"] == "time"
    # Table-4's error late in the preset's run (0.35) is over the default budget: fp8 kept
    late = {"fp8": 0.05, "table4": 0.35}
    ctl, records = _drive(Sim(rates, secs, error=late), DEFAULTS, ("fp32", "fp8", "table4"))
    assert [c for _, c in ctl.chosen] == ["fp8"] * 4
    assert records[0]["candidates"]["table4"]["verdict"] == "damaging"
    tight = AdaPrecConfig(**{**DEFAULTS.__dict__, "error_budget": 0.1})
    ctl, records = _drive(Sim(rates, secs, error=errors), tight, ("fp32", "fp8", "table4"))
    assert [c for _, c in ctl.chosen] == ["fp8"] * 4 and records[0]["decided_by"] == "error"
    # a phase where every candidate's signal dips a little (noise, within the margin): the
    # fastest safe one still wins, not the one whose few steps happened to dip least
    dipping = {"fp32": -0.0001, "fp8": -0.0002, "table4": -0.0003}
    ctl, records = _drive(Sim(dipping, secs, error=errors), DEFAULTS, ("fp32", "fp8", "table4"))
    first = records[0]["candidates"]  # every candidate speculated: no step time known yet
    assert first["fp32"]["gain"] > first["fp8"]["gain"] > first["table4"]["gain"]
    assert [c for _, c in ctl.chosen] == ["table4"] * 4


def test_a_fall_every_candidate_shares_is_the_runs_and_one_its_own_is_the_codecs() -> None:
    secs = {"fp32": 1.0, "fp8": 0.5, "table4": 0.3}
    errors = {"fp8": 0.05, "table4": 0.2}
    cands = ("fp32", "fp8", "table4")
    # every candidate's signal falls 0.016 in its 4 steps (the margin is 0.01), the exact
    # one too: the learning rate or the batches, not a codec; the fastest safe one wins
    falls = {"fp32": -0.004, "fp8": -0.004, "table4": -0.004}
    ctl, records = _drive(Sim(falls, secs, error=errors, value=0.9), DEFAULTS, cands)
    assert [c for _, c in ctl.chosen] == ["table4"] * 4
    assert {v["verdict"] for v in records[0]["candidates"].values()} == {"eligible"}
    # Table-4 alone falls while fp32 and fp8 hold: its own fall, not the run's
    own = {"fp32": 0.002, "fp8": 0.002, "table4": -0.004}
    ctl, records = _drive(Sim(own, secs, error=errors, value=0.9), DEFAULTS, cands)
    assert [c for _, c in ctl.chosen] == ["fp8"] * 4
    assert all(r["candidates"]["table4"]["verdict"] == "falling" for r in records)


def test_a_dip_of_the_codec_the_run_rose_with_is_the_runs_noise() -> None:
    # fp8 held the run over its last phase (0.30 -> 0.50); its 4 speculative steps dip 0.02,
    # twice the margin: not `falling` (K steps of the run outweigh S), so the slower fp32
    # need not be speculated to show the fall is the run's; any other codec's dip is its own
    cfg = DEFAULTS
    curve = [(0, 0.30), (10, 0.50)]
    dip = Trial("fp8", ((12, 0.49), (14, 0.48)), 0.5, True, {"w": (0.0025, 1.0, 10)})
    other = replace(dip, candidate="table4")
    model = LearningCurveModel()
    assert assess(dip, curve, 20, 0.50, 0.1, cfg, model, held="fp8").verdict == "eligible"
    assert assess(dip, curve, 20, 0.50, 0.1, cfg, model).verdict == "falling"
    assert assess(other, curve, 20, 0.50, 0.1, cfg, model, held="fp8").verdict == "falling"
    # the controller names the held codec only when the signal rose over the phase
    sim = Sim({"fp32": 0.0}, {"fp32": 1.0})
    ctl = AdaPrecController(("fp32", "fp8"), cfg, sim, None, sim.clock)  # type: ignore[arg-type]
    ctl.current, ctl.curve = "fp8", list(curve)
    assert ctl._held() == "fp8"
    ctl.curve = [(0, 0.50), (10, 0.49)]
    assert ctl._held() is None


def test_once_step_times_are_known_only_candidates_that_could_win_are_speculated() -> None:
    # the fastest safe codec wins; a candidate measured slower than a safe one cannot
    rates = {"fp32": 0.002, "fp8": 0.002, "table4": 0.002, "poison": 0.01}
    secs = {"fp32": 1.0, "fp8": 0.5, "table4": 0.3, "poison": 0.1}
    errors = {"fp8": 0.05, "table4": 0.2, "poison": 1.4}
    cands = ("fp32", "fp8", "table4", "poison")
    sim = Sim(rates, secs, error=errors)
    ctl, records = _drive(sim, DEFAULTS, cands)
    assert set(records[0]["candidates"]) == set(cands) and records[0]["skipped"] == []
    # the poison (fastest, damaging; resting at boundaries 2, 4-6), then table4: safe, the
    # rest slower
    for r, tried in zip(records[1:], (["table4"], ["poison", "table4"], ["table4"]),
                        strict=True):
        assert list(r["candidates"]) == tried, r["candidates"].keys()
        assert r["skipped"] == ["fp32", "fp8"] and r["chosen"] == "table4"
    # the same choices as speculating every candidate (per parameter: all but the resting
    # poison, over the budget on its one parameter, and the exact fp32, whose error is 0
    # on every parameter without measuring it)
    full = AdaPrecConfig(**{**DEFAULTS.__dict__, "choose": "layer"})
    assert [c for _, c in ctl.chosen] == ["table4"] * 4
    per_layer, whole = _drive(Sim(rates, secs, error=errors), full, cands)
    assert [c for _, c in per_layer.chosen] == ["table4"] * 4
    assert [set(r["candidates"]) | set(r["resting"]) for r in whole] \
        == [set(cands) - {"fp32"}] * 4
    assert all(r["skipped"] == ["fp32"] for r in whole)
    # a safe candidate that turned out slower than measured before does not stop the
    # search: the next one, measured faster, is tried
    # (the times set here stand for those measured at earlier boundaries)
    drift = Sim(rates, dict(secs), error=errors)
    ctl = AdaPrecController(cands, DEFAULTS, drift, None, drift.clock)  # type: ignore[arg-type]
    ctl.step_s = {"table4": 0.3, "fp8": 0.5, "fp32": 1.0, "poison": 0.1}
    drift.secs["table4"] = 0.7
    rec = ctl.before_step(0)  # the default rule's first boundary
    assert rec is not None and list(rec["candidates"]) == ["poison", "table4", "fp8"]
    assert rec["chosen"] == "fp8" and rec["skipped"] == ["fp32"]


def _sums(rel: dict[str, float], norm: dict[str, float], size: dict[str, int]
          ) -> dict[str, tuple[float, float, int]]:
    return {n: (rel[n] ** 2 * norm[n], norm[n], size[n]) for n in rel}


def test_per_layer_choice_is_the_fewest_bits_within_the_budget() -> None:
    size = {"fc.weight": 1000, "fc.bias": 10, "out.weight": 100}
    norm = {"fc.weight": 1.0, "fc.bias": 1.0, "out.weight": 2.0}
    errors = {"fp8-e5m2": _sums({"fc.weight": 0.05, "fc.bias": 0.05, "out.weight": 0.05},
                                norm, size),
              "table4": _sums({"fc.weight": 0.3, "fc.bias": 0.2, "out.weight": 0.45}, norm, size),
              "table1": _sums({"fc.weight": 3.0, "fc.bias": 0.01, "out.weight": 3.0}, norm, size)}
    bits = {"fp8-e5m2": 8.0, "table4": 4.0, "table1": 1.0}
    loose = assign(errors, bits, 0.5)
    # table1 is cheapest on the bias and within the budget there alone
    assert loose == {"fc.weight": "table4", "fc.bias": "table1", "out.weight": "table4"}
    tight = assign(errors, bits, 0.2)
    total = sum(errors[c][n][0] / errors[c][n][1] * norm[n] for n, c in tight.items())
    assert total <= 0.2 ** 2 * sum(norm.values())  # never over the budget
    assert tight["fc.weight"] in ("fp8-e5m2", "table4") and tight["out.weight"] == "fp8-e5m2"
    assert set(assign(errors, bits, 1e-6).values()) == {"fp32"}  # exact is always possible
    spec = mix_spec(loose)
    assert spec.startswith("mix:") and mix_rules(spec) == (
        "fc.weight=table4", "fc.bias=table1", "out.weight=table4")
    assert candidate_rules(spec, ("*.bias=fp32",)) == (("*.bias=fp32", *mix_rules(spec)), "fp32")
    assert mix_spec({"a": "fp8-e5m2", "b": "fp8-e5m2"}) == "fp8-e5m2"


def test_the_controller_chooses_per_layer_from_the_measured_errors() -> None:
    cfg = AdaPrecConfig(**{**DEFAULTS.__dict__, "choose": "layer"})
    sim = Sim({"fp32": 0.002, "fp8-e5m2": 0.002, "table4": 0.002, "bits:s0e8m7": 0.01},
              {"fp32": 1.0, "fp8-e5m2": 0.5, "table4": 0.3, "bits:s0e8m7": 0.1},
              error={"fp8-e5m2": 0.05, "table4": 0.2, "bits:s0e8m7": 1.4})
    ctl, records = _drive(sim, cfg, ("fp32", "fp8-e5m2", "table4", "bits:s0e8m7"))
    # the simulated run has one parameter: the cheapest safe codec for it, never the poison
    assert [c for _, c in ctl.chosen] == ["table4"] * 4
    assert all(r["decided_by"] == "layer" for r in records)


def test_a_codec_bound_straggler_slows_only_the_steps_that_send_it() -> None:
    s = Stragglers.parse(["0:60ms@fp32", "1:10ms"], 2)
    assert s.delay(0, 3, ["fp32"]) == pytest.approx(0.06) and s.delay(0, 3, ["table4"]) == 0
    assert s.delay(1, 3, ["fp32"]) == pytest.approx(0.01) and bool(s)
    for bad in ("0:60ms@", "random:0.1:5ms@fp32"):
        with pytest.raises(ConfigError, match="RANK:DELAY@CODEC"):
            Stragglers.parse([bad], 2)


def test_bad_options_are_one_clear_error() -> None:
    for key, value, says in (("error_budget", 0.0, "adaprec.error_budget = 0.0 must be > 0"),
                             ("error_budget", -math.inf, "must be > 0"),
                             ("decide", "loss", "adaprec.decide = 'loss' is not one of"),
                             ("choose", "bucket", "adaprec.choose = 'bucket' is not one of")):
        with pytest.raises(ConfigError, match=says):
            AdaPrecConfig(**{key: value})
    with pytest.raises(ConfigError, match="'powersgd:2', whose bits per value depend"):
        check_candidates(("fp32", "powersgd:2"), (), None, per_layer=True)
    with pytest.raises(ConfigError, match="'policy:seed004' is a policy"):
        check_candidates(("fp32", "policy:seed004"), (), None, per_layer=True)


@pytest.mark.parametrize("args, says", [
    (["--codec", "adaprec:fp32,powersgd:2"],
     "AdaPrec candidate 'powersgd:2': powersgd:2 cannot compress '0.1.bias'"),
    (["--codec", "adaprec:fp32,topk:0.01", "--algorithm", "native"],
     "AdaPrec candidate 'topk:0.01': topk:0.01 needs all-gather"),
    (["--codec", "adaprec:fp32,policy:seed004", "--set", "adaprec.choose=layer"],
     "is a policy"),
    (["--codec", "adaprec:fp32,bf16", "--codec-rule", "conv*.weight=fp32"],
     "wire.grad.rules = 'conv*.weight=fp32' names no parameter of the model (mlp: 0.1.weight"),
    (["--codec", "adaprec:fp32,bf16", "--phase-steps", "8", "--speculate-steps", "9"],
     "speculate_steps = 9 must be >= 1 and shorter than the phase"),
    (["--codec", "adaprec:fp32,bf16", "--set", "adaprec.decide=fastest"], "adaprec.decide"),
])
def test_the_cli_says_one_line_and_exits_2(args: list[str], says: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--world-size", "2", "--model", "mlp", "--dataset", "digits",
                 "--epochs", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_damaging_candidate_rests_for_one_three_seven_boundaries() -> None:
    from approxdist.adaptive.resting import Resting, damaging

    # Table-1 over the budget at every boundary: speculated at boundaries 1, 3, 7 and 15
    # of 16 (not at all 16), and the choice is the same fp8 at every one
    rates = {"fp32": 0.002, "fp8": 0.002, "table1": 0.002}
    secs = {"fp32": 1.0, "fp8": 0.5, "table1": 0.2}
    sim = Sim(rates, secs, total_steps=160, error={"fp8": 0.05, "table1": 4.0})
    ctl, bounds = _drive(sim, DEFAULTS, ("fp32", "fp8", "table1"))
    assert len(bounds) == 16 and [c for _, c in ctl.chosen] == ["fp8"] * 16
    assert [b for b, r in enumerate(bounds, 1) if "table1" in r["candidates"]] == [1, 3, 7, 15]
    assert bounds[0]["resting"] == {"table1": 20}  # boundary 3 is step 20
    assert bounds[2]["resting"] == {"table1": 60} and "table1" not in bounds[3]["skipped"]
    # a verdict other than damaging ends the streak: tested again at the next boundary
    rest = Resting()
    rest.note(1, ["t"], {"t"})
    rest.note(3, ["t", "u"], {"t"})
    assert rest.resting(4) == {"t": 7} and rest.resting(7) == {}
    rest.note(7, ["t"], set())
    assert rest.resting(8) == {} and rest.streak == {}
    # per parameter, a codec over the budget on the whole update may suit one layer: only
    # one over it on every parameter alone rests (per_layer.assign can use it nowhere)
    layer = AdaPrecConfig(**{**DEFAULTS.__dict__, "choose": "layer"})
    errors = {"table4": {"a": (0.3 ** 2, 1.0, 5), "b": (0.1 ** 2, 1.0, 5)},
              "table1": {"a": (16.0, 1.0, 5), "b": (16.0, 1.0, 5)}}
    verdicts = {"table4": {"verdict": "damaging"}, "table1": {"verdict": "damaging"}}
    assert damaging(layer, verdicts, errors) == {"table1"}
    assert damaging(DEFAULTS, verdicts, errors) == {"table1", "table4"}
    sim = Sim(rates, secs, total_steps=50, error={"fp8": 0.05, "table1": 4.0})
    _, records = _drive(sim, layer, ("fp32", "fp8", "table1"))
    assert [b for b, r in enumerate(records, 1) if "table1" in r["candidates"]] == [1, 3]
