"""The `[adaprec]` config section: AdaPrec's phases and its guard (seed 004; docs/adaprec.md).

AdaPrec runs when a gradient wire's codec is `adaprec:<candidates>` (`wire.grad.codec`, `--codec`);
these keys say how it decides. The candidates themselves are checked against the codec
registry where the engine is built (`approxdist.train.check`).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError

SIGNALS = ("soft", "accuracy")
HORIZONS = ("phase", "run")
#: how the safe candidates are compared: step time alone, or the learning curve's gain per second
RULES = ("error", "curve")
#: one codec for every parameter, or each parameter its own
CHOICES = ("all", "layer")
#: the gradient-wire codec prefix that turns AdaPrec on
PREFIX = "adaprec:"


@dataclass(frozen=True)
class AdaPrecConfig:
    """How AdaPrec speculates and decides; every phase boundary costs `speculate_steps`
    steps per candidate."""

    phase_steps: int = 40        # K: steps between decisions
    speculate_steps: int = 8     # S < K: steps each candidate trains from the snapshot
    points: int = 4              # signal measurements during each speculation (<= S)
    signal: str = "soft"         # soft: mean probability of the true class; or accuracy
    val_fraction: float = 0.1    # share of the *training* set the signal uses (held out of
    #                              training under the curve rule only: `holds_out`)
    lcb_z: float = 1.0           # eligible only if mean - z * std >= current signal - margin
    margin: float = 0.01         # the signal's noise a candidate's bound may fall below it by
    overhead_budget: float = 0.5  # most share of the run's time speculation may take
    collapse: float = 0.5        # a speculation losing this share of the signal above chance
    first: str = "fp32"          # the first phase's codec
    first_steps: int | None = None  # steps before the first boundary; None: the rule's own
    #                              (`first_boundary`: K under the curve rule, 0 under error)
    horizon: str = "phase"       # predict at the next boundary (phase) or the run's end (run)
    gain_share: float = 0.0      # eligible only if gaining >= this share of the best gain
    reuse: bool = True           # go on from the winner's speculation (one state copy per
    #                              candidate held until the decision); False: retrain it
    error_budget: float = 0.25   # most relative error r a candidate may add to the update:
    #                              EF-SGD's rate with a (1 - r^2)-contraction slows by about
    #                              1 / (1 - r^2), 1.07x at 0.25 (1.33x at 0.5)
    decide: str = "error"        # among safe candidates: fastest (error) or curve's gain/s
    choose: str = "all"          # one codec for all parameters, or per parameter (layer)

    @property
    def holds_out(self) -> bool:
        """Whether the signal's samples leave the training set: the curve rule predicts
        accuracy on unseen data from it; the error rule's signal only guards against a
        codec that damages training, which training samples show as well."""
        return self.decide == "curve"

    @property
    def first_boundary(self) -> int:
        """The step of the first boundary (then every `phase_steps`). The curve rule fits
        the run's own curve, so it first trains a phase in `first`; the error rule judges a
        codec by its error on the update, measurable from the first step, so by default it
        decides at step 0 instead of spending a whole phase in the reference."""
        if self.first_steps is not None:
            return self.first_steps
        return self.phase_steps if self.decide == "curve" else 0

    def is_boundary(self, step: int) -> bool:
        """Whether a phase boundary falls before step `step` (0-based)."""
        first = self.first_boundary
        return step >= first and (step - first) % self.phase_steps == 0

    def __post_init__(self) -> None:
        if self.phase_steps < 2:
            raise ConfigError(f"adaprec.phase_steps = {self.phase_steps} must be >= 2; e.g. 40")
        if not 1 <= self.speculate_steps < self.phase_steps:
            raise ConfigError(
                f"adaprec.speculate_steps = {self.speculate_steps} must be >= 1 and shorter than "
                f"the phase (adaprec.phase_steps = {self.phase_steps}); e.g. "
                f"--speculate-steps {max(1, self.phase_steps // 5)}")
        if self.first_steps is not None and self.first_steps < 0:
            raise ConfigError(f"adaprec.first_steps = {self.first_steps} must be >= 0 (0: "
                              f"decide before the first step); or leave it unset")
        if not 1 <= self.points <= self.speculate_steps:
            raise ConfigError(f"adaprec.points = {self.points} must be between 1 and "
                              f"adaprec.speculate_steps ({self.speculate_steps})")
        for key, value, valid in (("signal", self.signal, SIGNALS),
                                  ("horizon", self.horizon, HORIZONS),
                                  ("decide", self.decide, RULES),
                                  ("choose", self.choose, CHOICES)):
            if value not in valid:
                raise ConfigError(f"adaprec.{key} = {value!r} is not one of: "
                                  f"{', '.join(valid)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"adaprec.val_fraction = {self.val_fraction} must be in (0, 1); "
                              f"e.g. 0.1")
        if self.lcb_z < 0:
            raise ConfigError(f"adaprec.lcb_z = {self.lcb_z} must be >= 0; e.g. 1.0")
        if self.margin < 0:
            raise ConfigError(f"adaprec.margin = {self.margin} must be >= 0; e.g. 0.01")
        if not 0.0 < self.overhead_budget <= 1.0:
            raise ConfigError(f"adaprec.overhead_budget = {self.overhead_budget} must be in "
                              f"(0, 1]; e.g. 0.5")
        if not 0.0 < self.collapse <= 1.0:
            raise ConfigError(f"adaprec.collapse = {self.collapse} must be in (0, 1]; e.g. 0.5")
        if not 0.0 <= self.gain_share <= 1.0:
            raise ConfigError(f"adaprec.gain_share = {self.gain_share} must be in [0, 1]; "
                              f"e.g. 0.9 (at most 10 % less predicted gain than the best), "
                              f"0 for none")
        if not self.error_budget > 0:
            raise ConfigError(f"adaprec.error_budget = {self.error_budget} must be > 0: the "
                              f"relative error a codec may add to the update, e.g. 0.5 "
                              f"(inf: no limit)")
        if self.first.startswith(PREFIX):
            raise ConfigError(f"adaprec.first = {self.first!r} must be one codec, e.g. fp32")


def candidates_of(codec: str) -> tuple[str, ...] | None:
    """The candidates of `adaprec:a,b,c` (None for any other codec spec)."""
    if not codec.startswith(PREFIX):
        return None
    names = tuple(c.strip() for c in codec[len(PREFIX):].split(","))
    if not names or any(not c for c in names):
        raise ConfigError(f"codec {codec!r}: list the candidates after 'adaprec:', "
                          f"separated by commas, e.g. adaprec:fp32,fp8-e5m2,table4,table1")
    if len(set(names)) != len(names):
        raise ConfigError(f"codec {codec!r} names a candidate twice; list each once")
    return names
