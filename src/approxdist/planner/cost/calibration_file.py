"""The cost model's calibration file: fitted link levels and measured codec costs, as JSON.

    {
     "format": "approxdist-cost-calibration",
     "version": 1,
     "levels": {
      "loopback": {"alpha_s": 0.00021, "beta_s_per_byte": 6.1e-10, "gamma_s_per_byte": 1.9e-10,
                   "cores": 2,
                   "fit": {"rows": 8, "rms_rel_error": 0.12, "max_rel_error": 0.2,
                           "world_sizes": [2], "link": "none", "source": "ar2.json"}}
     },
     "codecs": {"bf16": {"encode_s_per_byte": 2.1e-10, "decode_s_per_byte": 1.4e-10}},
     "optimizers": {"momentum": 1.2e-9},
     "optimizer_tensors": {"momentum": 1.1e-5},
     "engine": {"action_s": 0.00025, "pipeline_step_s": 0.0004, "dp_step_s": 0.0009}
    }

`levels` maps a level name (`intra`, `inter`, `loopback`) to its coefficients (`cores`
for loopback only) and, when fitted, how (`fit`, for the reader; a hand-written level
needs none); `codecs` maps a codec spec to its seconds per fp32 byte; `optimizers`
(optional) maps an optimizer (`sgd`, `momentum`, `adam`) to the seconds its step takes
per byte of parameters and `optimizer_tensors` (optional) per parameter tensor
(`cost.optimizer_step`; `planner.profiler` measures both); `engine` (optional) the
engines' own CPU work per pipeline action, per step and per tp collective
(`overhead.RuntimeOverhead`, fitted on a tiny model's runs by `approxdist plan validate`)
and the loss's per output value (measured); a key of it a file lacks (one written before
`shared_action_s`, `loss_value_s` or `tp_collective_s` existed) is 0: not priced. A file
that is
missing, not JSON, someone else's JSON or holds a bad value gives one `DataError` line
naming the file, the key and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from approxdist.errors import ApproxDistError, ConfigError, DataError
from approxdist.planner.cost.calibration import Fit
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.cost.memory import OPTIMIZER_STATES
from approxdist.planner.cost.overhead import FIELDS as OVERHEAD_FIELDS
from approxdist.planner.cost.overhead import NONE, RuntimeOverhead
from approxdist.text import read_json, write_json

FORMAT = "approxdist-cost-calibration"
VERSION = 1
_LEVEL_KEYS = ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "cores", "fit", "link_alpha_s",
               "link_beta_s_per_byte")
_CODEC_KEYS = ("encode_s_per_byte", "decode_s_per_byte")
_HOW = ("fit one with approxdist.planner.cost.fit_level and save it with "
        "CostCalibration.save")


@dataclass(frozen=True)
class CostCalibration:
    """Link levels by name (with their fits, where fitted) and codec costs by spec."""

    levels: Mapping[str, LinkLevel] = field(default_factory=dict)
    codecs: Mapping[str, CodecCost] = field(default_factory=dict)
    fits: Mapping[str, Fit] = field(default_factory=dict)
    #: seconds of one optimizer step per parameter byte, by optimizer name
    optimizers: Mapping[str, float] = field(default_factory=dict)
    #: the engines' CPU work per action and per step (zeros: not measured, not priced)
    overhead: RuntimeOverhead = NONE
    #: seconds of one optimizer step per parameter tensor, by optimizer name
    optimizer_tensors: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, fits: tuple[Fit, ...] = (), levels: tuple[LinkLevel, ...] = (),
           codecs: Mapping[str, CodecCost] | None = None,
           optimizers: Mapping[str, float] | None = None,
           overhead: RuntimeOverhead = NONE,
           optimizer_tensors: Mapping[str, float] | None = None) -> CostCalibration:
        """From fitted and hand-given levels (a name given twice: the last wins)."""
        all_levels = {f.level.name: f.level for f in fits} | {lv.name: lv for lv in levels}
        return cls(all_levels, dict(codecs or {}),
                   {f.level.name: f for f in fits if all_levels[f.level.name] is f.level},
                   _optimizers("optimizers", dict(optimizers or {})), overhead,
                   _optimizers("optimizer_tensors", dict(optimizer_tensors or {}), "tensor"))

    def optimizer_s_per_byte(self, name: str) -> float:
        """Seconds of `name`'s step per parameter byte (0 where not measured: the step is
        then not priced)."""
        return float(self.optimizers.get(name, 0.0))

    def optimizer_s_per_tensor(self, name: str) -> float:
        """Seconds of `name`'s step per parameter tensor (0 where not measured)."""
        return float(self.optimizer_tensors.get(name, 0.0))

    def level(self, name: str) -> LinkLevel:
        if name not in self.levels:
            raise ConfigError(f"the calibration has no link level {name!r}; it has "
                              f"{', '.join(sorted(self.levels)) or 'none'}; {_HOW}")
        return self.levels[name]

    def codec(self, spec: str) -> CodecCost:
        """The measured costs of `spec`, else `CodecCost.of(spec)` (the defaults)."""
        default = CodecCost.of(spec)
        return self.codecs.get(default.spec, default)

    def to_json(self) -> dict[str, Any]:
        levels: dict[str, Any] = {}
        for name, lv in self.levels.items():
            entry: dict[str, Any] = {"alpha_s": lv.alpha_s, "beta_s_per_byte": lv.beta_s_per_byte,
                                     "gamma_s_per_byte": lv.gamma_s_per_byte}
            if lv.cores is not None:
                entry["cores"] = lv.cores
            for key in ("link_alpha_s", "link_beta_s_per_byte"):
                if getattr(lv, key):
                    entry[key] = getattr(lv, key)
            fit = self.fits.get(name)
            if fit is not None:
                entry["fit"] = {"rows": fit.rows, "rms_rel_error": fit.rms_rel_error,
                                "max_rel_error": fit.max_rel_error,
                                "world_sizes": list(fit.world_sizes), "link": fit.link,
                                "source": fit.source}
            levels[name] = entry
        codecs = {s: {"encode_s_per_byte": c.encode_s_per_byte,
                      "decode_s_per_byte": c.decode_s_per_byte} for s, c in self.codecs.items()}
        out = {"format": FORMAT, "version": VERSION, "levels": levels, "codecs": codecs}
        if self.optimizers:
            out["optimizers"] = dict(self.optimizers)
        if self.optimizer_tensors:
            out["optimizer_tensors"] = dict(self.optimizer_tensors)
        if self.overhead != NONE:
            out["engine"] = self.overhead.to_json()
        return out

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> CostCalibration:
        """The calibration in `path`; one `DataError` line naming the file and what is wrong."""
        return from_json(read_json(path, "cost calibration file", _HOW),
                         f"cost calibration file {str(path)!r}")


def from_json(data: Any, where: str = "cost calibration") -> CostCalibration:
    """The calibration a parsed JSON object describes; `DataError` naming key and value."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise DataError(f"{where} is not an approxdist cost calibration (format = {got!r}, "
                        f"expected {FORMAT!r}); {_HOW}")
    if data.get("version") != VERSION:
        raise DataError(f"{where} has version {data.get('version')!r}; this approxdist reads "
                        f"version {VERSION}; fit it again")
    _keys(where, data, ("format", "version", "levels", "codecs", "optimizers",
                        "optimizer_tensors", "engine"))
    levels, codecs = data.get("levels", {}), data.get("codecs", {})
    if not isinstance(levels, dict) or not isinstance(codecs, dict):
        raise DataError(f"{where}: 'levels' and 'codecs' must be objects, got "
                        f"{type(levels).__name__} and {type(codecs).__name__}")
    parsed = {name: _level(where, name, entry) for name, entry in levels.items()}
    costs = {}
    for spec, entry in codecs.items():
        here = f"{where} codecs[{spec!r}]"
        _keys(here, entry, _CODEC_KEYS, required=_CODEC_KEYS)
        try:
            cost = CodecCost(spec, entry["encode_s_per_byte"], entry["decode_s_per_byte"])
        except ApproxDistError as exc:
            raise DataError(f"{here}: {exc}") from None
        costs[cost.spec] = cost
    return CostCalibration({n: lv for n, (lv, _) in parsed.items()}, costs,
                           {n: f for n, (_, f) in parsed.items() if f is not None},
                           _optimizers(f"{where} optimizers", data.get("optimizers", {})),
                           _engine(f"{where} engine", data.get("engine")),
                           _optimizers(f"{where} optimizer_tensors",
                                       data.get("optimizer_tensors", {}), "tensor"))


def _engine(where: str, entry: Any) -> RuntimeOverhead:
    """The engines' overheads (absent: none)."""
    if entry is None:
        return NONE
    _keys(where, entry, OVERHEAD_FIELDS)
    try:
        return RuntimeOverhead(**entry)
    except ConfigError as exc:
        raise DataError(f"{where}: {exc}") from None


def _optimizers(where: str, entry: Any, per: str = "byte") -> dict[str, float]:
    """Optimizer name -> seconds per parameter byte (or tensor), each a finite number >= 0."""
    if not isinstance(entry, dict):
        raise DataError(f"{where} = {entry!r} must be an object like {{\"momentum\": 1e-9}}")
    for name, value in entry.items():
        if name not in OPTIMIZER_STATES:
            raise DataError(f"{where} names optimizer {name!r}; valid: "
                            f"{', '.join(OPTIMIZER_STATES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < float("inf"):
            raise DataError(f"{where}[{name!r}] = {value!r} must be a finite number of seconds "
                            f"per {per} >= 0")
    return {k: float(v) for k, v in entry.items()}


def _level(where: str, name: str, entry: Any) -> tuple[LinkLevel, Fit | None]:
    here = f"{where} levels[{name!r}]"
    _keys(here, entry, _LEVEL_KEYS, required=_LEVEL_KEYS[:3])
    try:
        level = LinkLevel(name, entry["alpha_s"], entry["beta_s_per_byte"],
                          entry["gamma_s_per_byte"], entry.get("cores"),
                          entry.get("link_alpha_s", 0.0), entry.get("link_beta_s_per_byte", 0.0))
    except ConfigError as exc:
        raise DataError(f"{here}: {exc}") from None
    raw = entry.get("fit")
    if raw is None:
        return level, None
    try:
        fit = Fit(level, int(raw["rows"]), float(raw["rms_rel_error"]),
                  float(raw["max_rel_error"]), tuple(int(w) for w in raw["world_sizes"]),
                  str(raw["link"]), str(raw.get("source", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{here} fit = {raw!r} is malformed ({exc!r}); drop it or fit the "
                        f"level again") from None
    return level, fit


def _keys(where: str, entry: Any, valid: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    if not isinstance(entry, dict):
        raise DataError(f"{where} = {entry!r} must be an object with keys {', '.join(valid)}")
    unknown = sorted(set(entry) - set(valid))
    if unknown:
        raise DataError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; valid: "
                        f"{', '.join(valid)}")
    missing = [k for k in required if k not in entry]
    if missing:
        raise DataError(f"{where} lacks {', '.join(map(repr, missing))}")
