"""The AdaPrec controller on a simulated run, its decision rule, and its bad input.

The simulated run (`Sim`) is a signal that each codec moves by a known amount per step
at a known time per step; `snapshot`/`restore` copy that state, so the controller's
phases, guards and bookkeeping are checked exactly, in one process, in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from approxdist.adaptive.candidates import candidate_rules, check_candidates
from approxdist.adaptive.controller import AdaPrecController
from approxdist.adaptive.decide import Trial, assess, assess_all, choose, outgained
from approxdist.adaptive.learning_curve import LearningCurveModel
from approxdist.cli.main import main
from approxdist.config.adaprec import AdaPrecConfig, candidates_of
from approxdist.config.loader import build_config, section_dict
from approxdist.data.base import TensorDataset
from approxdist.data.holdout import hold_out
from approxdist.errors import ConfigError, DataError
from approxdist.train.check import check_parts


@dataclass
class Sim:
    """A run whose signal moves by `rate[codec]` per step, `secs[codec]` seconds a step;
    the codec `nan` produces non-finite losses. Its clock moves by `sleep` per speculative
    training call (the controller's time, simulated: no test depends on the machine's)."""

    rate: dict[str, float]
    secs: dict[str, float]
    total_steps: int = 40
    chance: float = 0.1
    value: float = 0.1
    codec: str = ""
    sleep: float = 0.0
    now: float = 0.0
    #: codec -> steps after which it turns: from then on it loses 0.1 a step
    turns: dict[str, int] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)
    _since: int = 0
    saved: list[float] = field(default_factory=list)
    decides: bool = True
    #: steps trained since the last restore; steps the run adopted and must skip
    spec_steps: int = 0
    ahead: int = 0
    #: (codec, value) at the end of every speculation kept, and of every one adopted
    ends: list[tuple[str, float]] = field(default_factory=list)
    adopted: list[tuple[str, float]] = field(default_factory=list)
    reusable: bool = True
    main_steps: int = 0  # steps the driver's loop trained (not adopted)
    #: codec -> the relative error it adds to the update (0 when not named)
    error: dict[str, float] = field(default_factory=dict)
    _watched: int = 0

    def watch(self, on: bool) -> None:
        self._watched = 0 if on else -1

    def update_error(self) -> dict[str, tuple[float, float, int]]:
        e = self.error.get(self.codec, 0.0)
        return {"w": (e * e * self._watched, float(self._watched), 10)}

    def snapshot(self) -> None:
        self.saved = [*self.saved[-1:], self.value]

    def restore(self) -> None:
        self.value = self.saved[-1]
        self.spec_steps = 0

    def keep(self) -> tuple[str, float, int, int] | None:
        self.ends.append((self.codec, self.value))
        return (self.codec, self.value, self._since, self.spec_steps) if self.reusable else None

    def adopt(self, kept: tuple[str, float, int, int]) -> None:
        codec, self.value, self._since, self.ahead = kept
        assert codec == self.codec  # `use(winner)` came first
        self.adopted.append((codec, self.value))

    def drop(self) -> None:
        self.saved.pop()

    def rollback(self) -> None:
        self.restore()

    def use(self, candidate: str) -> None:
        self.codec, self._since = candidate, 0

    def advance(self, steps: int) -> None:
        for _ in range(steps):
            turned = self._since >= self.turns.get(self.codec, steps + self._since + 1)
            rate = -0.1 if turned else self.rate[self.codec]
            self.value = min(1.0, max(0.0, self.value + rate))
            self._since += 1

    def train(self, steps: int) -> tuple[list[float], bool]:
        self.trained.append(self.codec)
        self.now += self.sleep
        self.advance(steps)
        self.spec_steps += steps
        self._watched += steps
        return [self.secs[self.codec]] * steps, self.codec != "nan"

    def clock(self) -> float:
        return self.now

    def signal(self) -> float:
        return self.value

    #: what `agree` returned (rank 0); a replay of rank 0's, for a rank that does not decide
    agreed: list[object] = field(default_factory=list)
    replay: list[object] | None = None

    def agree(self, value: object) -> object:
        if self.replay is not None:
            assert value is None  # a rank that does not decide has nothing to offer
            value = self.replay.pop(0)
        self.agreed.append(value)
        return value


#: seed 004's own rule (the learning curve's gain per second among the safe candidates),
#: which most of these tests exercise; the default rule has its own tests below
CFG = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=4, overhead_budget=1.0,
                    decide="curve")


def _drive(sim: Sim, cfg: AdaPrecConfig = CFG, candidates: tuple[str, ...] = ("fp32", "fast"),
           model: LearningCurveModel | None = None) -> tuple[AdaPrecController, list[dict]]:
    """Every step of the simulated run: the controller's hook, then one step of the codec
    (or none for the steps the run adopted from the winner's speculation)."""
    ctl = AdaPrecController(candidates, cfg, sim, model, sim.clock)  # type: ignore[arg-type]
    sim.main_steps = 0
    records = []
    step = 0
    while step < sim.total_steps:
        rec = ctl.before_step(step)
        if rec is not None:
            records.append(rec)
        if sim.ahead:  # the run goes on after the winner's speculative steps
            step, sim.ahead = step + sim.ahead, 0
            continue
        sim.advance(1)
        sim.main_steps += 1
        step += 1
    return ctl, records


def test_first_phase_runs_the_first_codec_and_boundaries_come_every_k_steps() -> None:
    sim = Sim({"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}, total_steps=40)
    ctl, records = _drive(sim)
    assert records[0] == {"kind": "adaprec", "step": 0, "chosen": "fp32", "reason": "first phase"}
    assert [r["step"] for r in records] == [0, 10, 20, 30]
    # the same gain in half the time: the faster codec wins every decision
    assert [c for _, c in ctl.chosen] == ["fp32", "fast", "fast", "fast"]
    assert records[1]["predict_at"] == 20 and set(records[1]["candidates"]) == {"fp32", "fast"}
    assert records[1]["candidates"]["fast"]["points"] == [
        [11 + i, pytest.approx(0.144 + 0.004 * i)] for i in range(4)]


def test_the_first_boundary_is_the_rules_own_or_the_users() -> None:
    rates, secs = {"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}
    # the error rule needs no curve: it decides at step 0, no phase spent in the reference
    error = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=2, overhead_budget=1.0)
    assert (CFG.first_boundary, error.first_boundary) == (10, 0)
    ctl, records = _drive(Sim(rates, secs), error)
    assert [r["step"] for r in records] == [0, 10, 20, 30] and "candidates" in records[0]
    assert ctl.chosen == [(0, "fast"), (10, "fast"), (20, "fast"), (30, "fast")]
    # a first phase of the user's length, then every K steps, under either rule
    for rule in ("error", "curve"):
        cfg = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=2, overhead_budget=1.0,
                            decide=rule, first_steps=5)
        ctl, records = _drive(Sim(rates, secs), cfg)
        assert [r["step"] for r in records] == [0, 5, 15, 25, 35]
        assert records[0]["reason"] == "first phase" and ctl.chosen[0] == (0, "fp32")
    # unset, it stays out of the saved config (TOML has no null) and reads back unset
    saved = section_dict(error)
    assert "first_steps" not in saved
    assert build_config({"adaprec": saved}).adaprec == error
    assert build_config({"adaprec": {"first_steps": 3}}).adaprec.first_boundary == 3
    with pytest.raises(ConfigError, match="adaprec.first_steps = -1 must be >= 0"):
        AdaPrecConfig(first_steps=-1)
    with pytest.raises(ConfigError, match="adaprec.first_steps = 'x' must be an integer"):
        build_config({"adaprec": {"first_steps": "x"}})


def test_decisions_are_deterministic_and_speculation_leaves_no_trace() -> None:
    rates, secs = {"fp32": 0.006, "fast": 0.002}, {"fp32": 1.0, "fast": 0.9}
    a, _ = _drive(Sim(rates, secs))
    b, _ = _drive(Sim(rates, secs))
    assert a.chosen == b.chosen
    # fp32 gains 3x as much for 10 % more time: it wins; a restore undid every speculation
    assert {c for _, c in a.chosen} == {"fp32"}
    sim = Sim(rates, secs)
    _drive(sim)
    assert sim.value == pytest.approx(0.1 + 40 * 0.006)


def test_the_run_goes_on_from_the_winners_speculation_without_retraining_it() -> None:
    rates, secs = {"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}
    sim = Sim(rates, secs, total_steps=40)
    ctl, records = _drive(sim)
    bounds = records[1:]
    assert [r["chosen"] for r in bounds] == ["fast"] * 3
    # the state adopted is the winner's speculative end, at each boundary
    assert sim.adopted == [e for e in sim.ends if e[0] == "fast"]
    assert all(r["reused_steps"] == 4 for r in bounds) and ctl.summary()["reused_steps"] == 12
    # steps counted once: the loop trained 40 - 3 x 4, every candidate 4 per boundary
    assert sim.main_steps == 40 - 12
    assert sim.value == pytest.approx(0.1 + 40 * 0.004)
    # the same run retraining the winner's steps ends in the same state
    again = Sim(rates, secs, total_steps=40, reusable=False)
    ctl2, records2 = _drive(again)
    assert ctl2.chosen == ctl.chosen and again.value == pytest.approx(sim.value)
    assert again.adopted == [] and again.main_steps == 40
    assert all(r["reused_steps"] == 0 for r in records2[1:])
    off = Sim(rates, secs, total_steps=40)
    _drive(off, AdaPrecConfig(phase_steps=10, speculate_steps=4, points=4, overhead_budget=1.0,
                              reuse=False))
    assert off.adopted == [] and off.main_steps == 40


def test_speculation_seconds_leave_out_the_winners_steps() -> None:
    sim = Sim({"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}, total_steps=20,
              sleep=0.05)
    cfg = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=4, overhead_budget=1.0)
    ctl, records = _drive(sim, cfg)
    rec = records[0]  # the error rule decides at step 0: both candidates new, both trained
    assert rec["step"] == 0 and rec["chosen"] == "fast"
    assert rec["reused_s"] == pytest.approx(4 * 0.05)
    # the loser's 4 x 0.05 s, not the winner's 4 x 0.05 s
    assert rec["speculation_s"] == pytest.approx(4 * 0.05)
    assert ctl.summary()["speculation_s"] == rec["speculation_s"]


class _NoFits(LearningCurveModel):
    def predict_many(self, *args: object, **kwargs: object) -> list:  # type: ignore[override]
        raise AssertionError("only rank 0 fits the curves")


def test_only_rank_0_fits_and_every_rank_takes_its_decision() -> None:
    rates, secs = {"fp32": 0.006, "fast": 0.004, "nan": 0.05}, \
        {"fp32": 1.0, "fast": 0.5, "nan": 0.01}
    cands = ("fp32", "fast", "nan")
    root = Sim(rates, secs)
    ctl0, rec0 = _drive(root, candidates=cands)
    other = Sim(rates, secs, decides=False, replay=list(root.agreed))
    ctl1, rec1 = _drive(other, candidates=cands, model=_NoFits())
    assert ctl1.chosen == ctl0.chosen and ctl1.blacklist == ctl0.blacklist == ["nan"]
    assert [r["candidates"] for r in rec1[1:]] == [r["candidates"] for r in rec0[1:]]
    assert other.value == pytest.approx(root.value) and other.adopted == root.adopted
    # the decision is the one every rank computed before: judge all, choose
    model, curve = LearningCurveModel(), list(ctl0.curve)
    decisions = [a for a in root.agreed if not isinstance(a, bool)]  # not budget verdicts
    for rec, decision in zip(rec0[1:], decisions, strict=True):
        trials = [Trial(c, tuple((int(s), v) for s, v in r["points"]), r["s_per_step"],
                        r["finite"]) for c, r in rec["candidates"].items()]
        judged = assess_all(trials, [p for p in curve if p[0] <= rec["step"]],
                            rec["predict_at"], rec["signal"], 0.1, CFG, model)
        assert decision.winner == choose(judged, decision.winner or "fp32") == rec["chosen"]


def test_a_diverging_candidate_is_blacklisted_at_once_and_never_chosen() -> None:
    sim = Sim({"fp32": 0.004, "nan": 0.05}, {"fp32": 1.0, "nan": 0.01})
    ctl, records = _drive(sim, candidates=("fp32", "nan"))
    assert records[1]["candidates"]["nan"]["verdict"] == "diverged"
    assert ctl.blacklist == ["nan"] and "nan" not in {c for _, c in ctl.chosen}
    assert all("nan" not in r["candidates"] for r in records[2:])
    assert sim.trained.count("nan") == 1  # one speculation chunk, then never again
    assert sim.value == pytest.approx(0.1 + 40 * 0.004)  # training never saw it


def test_a_collapsing_candidate_is_blacklisted_and_a_falling_one_is_not_eligible() -> None:
    # 'crash' loses the signal in one speculation; 'slide' loses a little, but is fast
    sim = Sim({"fp32": 0.01, "crash": -0.2, "slide": -0.004},
              {"fp32": 1.0, "crash": 0.01, "slide": 0.01})
    ctl, records = _drive(sim, candidates=("fp32", "crash", "slide"))
    verdicts = records[1]["candidates"]
    assert verdicts["crash"]["verdict"] == "collapsed" and "crash" in ctl.blacklist
    assert verdicts["slide"]["verdict"] == "falling" and "slide" not in ctl.blacklist
    assert {c for _, c in ctl.chosen} == {"fp32"}


def test_a_phase_that_collapses_the_run_is_undone_and_its_codec_blacklisted() -> None:
    # 'trap' is fast and gains for 5 steps (the speculation sees only 4), then loses
    sim = Sim({"fp32": 0.004, "trap": 0.004}, {"fp32": 1.0, "trap": 0.5}, turns={"trap": 5})
    ctl, records = _drive(sim, candidates=("fp32", "trap"))
    assert records[1]["chosen"] == "trap"
    assert records[2]["rolled_back"] == "trap" and ctl.blacklist == ["trap"]
    assert records[2]["signal"] == pytest.approx(0.1 + 10 * 0.004)  # back to boundary 10
    assert [c for _, c in ctl.chosen][2:] == ["fp32", "fp32"]
    assert all("trap" not in r["candidates"] for r in records[2:])


def test_an_exhausted_overhead_budget_skips_speculation() -> None:
    sim = Sim({"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}, total_steps=40,
              sleep=0.01)
    cfg = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=2, overhead_budget=0.05)
    ctl, records = _drive(sim, cfg)
    assert "candidates" in records[0]
    assert records[1]["reason"] == "overhead budget spent" and "candidates" not in records[1]
    assert ctl.summary()["speculation_s"] > 0


def test_choose_prefers_gain_per_second_then_signal_then_keeps_the_current_codec() -> None:
    model = LearningCurveModel()
    curve = [(10, 0.5)]

    def judged(name: str, values: list[float], secs: float):  # noqa: ANN202
        pts = tuple((10 + i + 1, v) for i, v in enumerate(values))
        return assess(Trial(name, pts, secs, True), curve, 20, 0.5, 0.1, CFG, model)

    rising = [0.51, 0.52, 0.53, 0.54]
    up, fast_up = judged("a", rising, 1.0), judged("b", rising, 0.5)
    assert choose([up, fast_up], keep="a") == "b"
    flat_a, flat_b = judged("a", [0.5] * 4, 1.0), judged("b", [0.4995] * 4, 0.1)
    assert choose([flat_a, flat_b], keep="b") == "a"  # no gain: the best signal
    down = judged("a", [0.45, 0.4, 0.35, 0.3], 1.0)
    assert down.verdict == "collapsed" or not down.eligible
    assert choose([down], keep="fp32") == "fp32"
    nan = assess(Trial("n", ((11, math.nan),), 1.0, True), curve, 20, 0.5, 0.1, CFG, model)
    assert nan.blacklisted and nan.record()["gain"] is None


def test_the_gain_share_guard_keeps_a_cheap_candidate_from_buying_speed_with_progress() -> None:
    model, curve = LearningCurveModel(), [(10, 0.5)]
    trials = [Trial("slow", tuple((11 + i, 0.5 + 0.01 * (i + 1)) for i in range(4)), 1.0, True),
              Trial("cheap", tuple((11 + i, 0.5 + 0.002 * (i + 1)) for i in range(4)), 0.1, True)]
    plain = assess_all(trials, curve, 20, 0.5, 0.1, CFG, model)
    assert [a.verdict for a in plain] == ["eligible", "eligible"]
    assert plain[1].gain < 0.5 * plain[0].gain and choose(plain, keep="slow") == "cheap"
    guarded = assess_all(trials, curve, 20, 0.5, 0.1, replace(CFG, gain_share=0.5), model)
    assert [a.verdict for a in guarded] == ["eligible", "outgained"]
    assert choose(guarded, keep="cheap") == "slow"
    assert guarded[1].record()["verdict"] == "outgained"
    # a share the cheap one reaches changes nothing
    share = plain[1].gain / plain[0].gain * 0.9
    assert outgained(plain, share) == plain


def test_the_run_horizon_predicts_at_the_last_step() -> None:
    sim = Sim({"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}, total_steps=40)
    cfg = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=4, overhead_budget=1.0,
                        horizon="run")
    _, records = _drive(sim, cfg)
    assert [r["predict_at"] for r in records[1:]] == [40, 40, 40]
    assert [r["chosen"] for r in records[1:]] == ["fast"] * 3


def test_candidates_parse_and_unknown_ones_are_one_clear_error() -> None:
    assert candidates_of("fp8-e5m2") is None
    assert candidates_of("adaprec:fp32, table4,policy:seed004") == ("fp32", "table4",
                                                                    "policy:seed004")
    for bad in ("adaprec:", "adaprec:fp32,,table1", "adaprec:fp32,fp32"):
        with pytest.raises(ConfigError, match="adaprec"):
            candidates_of(bad)
    assert candidate_rules("table1", ("*.bias=fp32",)) == (("*.bias=fp32",), "table1")
    assert candidate_rules("policy:seed004", ()) == (("policy:seed004",), "fp32")
    with pytest.raises(ConfigError, match="candidate 'fp7'") as err:
        check_candidates(("fp32", "fp7"), (), None)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="policy:nope"):
        check_candidates(("policy:nope",), (), None)


def test_config_rejects_a_phase_shorter_than_its_speculation() -> None:
    with pytest.raises(ConfigError, match=r"speculate_steps = 10 .*phase_steps = 10"):
        AdaPrecConfig(phase_steps=10, speculate_steps=10)
    with pytest.raises(ConfigError, match="adaprec.signal"):
        AdaPrecConfig(signal="loss")
    with pytest.raises(ConfigError, match="adaprec.horizon = 'epoch' is not one of: phase, run"):
        AdaPrecConfig(horizon="epoch")
    with pytest.raises(ConfigError, match=r"adaprec.gain_share = 1.5 must be in \[0, 1\]"):
        AdaPrecConfig(gain_share=1.5)
    with pytest.raises(ConfigError, match="AdaPrec switches"):
        check_parts(build_config({"train": {"parallel": "dp", "world_size": 1},
                                  "wire": {"grad": {"codec": "adaprec:fp32,bf16"}}}))
    with pytest.raises(ConfigError, match="wire.grad.codec = 'adaprec:fp32,bf16' is not used "
                                          "by --parallel single; drop it, or use --parallel dp"):
        check_parts(build_config({"train": {"parallel": "single", "world_size": 1},
                                  "wire": {"grad": {"codec": "adaprec:fp32,bf16"}}}))


def test_the_validation_split_comes_out_of_the_training_set() -> None:
    x, y = torch.arange(100.0)[:, None], torch.arange(100) % 10
    data = TensorDataset("t", x, y, x[:5], y[:5], 10)
    rest, vx, vy = hold_out(data, 0.1, seed=0, world=4, global_batch=32)
    assert rest.train_x.shape[0] == 90 and vx.shape[0] == vy.shape[0] == 10
    assert not set(vx[:, 0].tolist()) & set(rest.train_x[:, 0].tolist())
    assert torch.equal(hold_out(data, 0.1, 0, 4, 32)[1], vx)  # fixed by the seed
    with pytest.raises(DataError, match="fewer than one per rank"):
        hold_out(data, 0.02, 0, 4, 32)
    with pytest.raises(DataError, match="fewer than one batch"):
        hold_out(data, 0.5, 0, 4, 64)
    # the error rule's signal set stays in training: the same samples, nothing removed
    whole, wx, _ = hold_out(data, 0.5, 0, 4, 64, remove=False)
    assert whole is data and torch.equal(wx, hold_out(data, 0.5, 0, 4, 32)[1])
    assert not AdaPrecConfig().holds_out and AdaPrecConfig(decide="curve").holds_out


@pytest.mark.parametrize("args, says", [
    (["--codec", "adaprec:fp32,fp7"], "candidate 'fp7'"),
    (["--codec", "adaprec:fp32,bf16", "--phase-steps", "5", "--speculate-steps", "5"],
     "speculate_steps = 5"),
    (["--codec", "adaprec:fp32,bf16", "--set", "adaprec.val_fraction=0.0005"],
     "fewer than one per rank"),
])
def test_the_cli_says_one_line_and_exits_2(args: list[str], says: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--world-size", "2", "--model", "mlp", "--dataset", "digits",
                 "--epochs", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_every_rank_follows_rank_0_on_the_overhead_budget() -> None:
    # rank 0 speculates cheaply; the other rank's speculation is slow on its own clock, so
    # by its own measure the budget is spent at the second boundary. Deciding that alone,
    # it would train on while rank 0 speculates (a hang across processes): it must not.
    rates, secs = {"fp32": 0.004, "fast": 0.004}, {"fp32": 1.0, "fast": 0.5}
    cfg = AdaPrecConfig(phase_steps=10, speculate_steps=4, points=2, overhead_budget=0.5)
    root = Sim(rates, secs)
    _, rec0 = _drive(root, cfg)
    assert all("candidates" in r for r in rec0[1:])  # rank 0: never over budget
    other = Sim(rates, secs, decides=False, replay=list(root.agreed), sleep=0.02)
    ctl1, rec1 = _drive(other, cfg, model=_NoFits())
    assert ctl1.speculation_s > 0.5 * 0.02  # its own clock did see the time spent
    assert [("candidates" in r, r["chosen"]) for r in rec1[1:]] == \
        [("candidates" in r, r["chosen"]) for r in rec0[1:]]
    assert other.trained == root.trained  # the same speculations, in the same order
