"""`auto`'s calibration file: measured size thresholds plus fitted alpha-beta terms (seed 001).

`approxdist bench allreduce --calibrate` measures every algorithm over sizes on the
current world and link, then `fit` keeps, for each measured size, the fastest algorithm
(by the median over rounds of its time over `native`'s time in the same round, which
drifting machine load does not bias; by median time when that is missing);
consecutive sizes with different winners get a threshold where the two algorithms'
fitted models cross (or the geometric mean of the sizes when they do not cross between
them). The file is JSON:

    {"version": 1, "world_size": 4, "link": "none", "codec": "fp32",
     "thresholds": [{"max_bytes": 262144, "algorithm": "brd"},
                    {"max_bytes": null, "algorithm": "vhd"}],
     "models": {"brd": {"alpha_s": 0.0004, "beta_s_per_byte": 1e-09}, ...},
     "measured": [{"algorithm": "brd", "size_bytes": 4096, "median_s": 0.0008}, ...]}

`auto` reads it only when given explicitly (`get_algorithm("auto", calibration=path)`,
`--calibration PATH` on the command line); sizes are fp32 message bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from approxdist.comm.collectives.model import AlphaBeta, cost_terms
from approxdist.errors import ConfigError
from approxdist.text import write_json

VERSION = 1
DEFAULT_PATH = Path("allreduce-calibration.json")


@dataclass(frozen=True)
class Measurement:
    algorithm: str
    size_bytes: int
    median_s: float
    #: median over rounds of time / the baseline's time in the same round, kept for the
    #: reader (the winner is chosen by `median_s`: see `_winner`)
    paired_ratio: float | None = None


@dataclass(frozen=True)
class Calibration:
    """Thresholds `(max_bytes or None, algorithm)` in increasing order, and fitted models."""

    world_size: int
    thresholds: tuple[tuple[int | None, str], ...]
    models: dict[str, AlphaBeta] = field(default_factory=dict)
    link: str = "none"
    codec: str = "fp32"
    measured: tuple[Measurement, ...] = ()

    def choose(self, nbytes: int, allowed: Sequence[str] | None = None) -> str:
        """The algorithm for a message of `nbytes` fp32 bytes, one of `allowed` if given.

        When the threshold's algorithm is not allowed (native for a lossy codec), the
        fastest allowed algorithm measured at the nearest size (log scale) wins; without
        measurements, the fastest by the fitted models.
        """
        name = self.thresholds[-1][1]
        for limit, alg in self.thresholds:
            if limit is None or nbytes <= limit:
                name = alg
                break
        if allowed is None or name in allowed:
            return name
        rows = [m for m in self.measured if m.algorithm in allowed]
        if rows:
            near = min({m.size_bytes for m in rows},
                       key=lambda s: abs(math.log(s) - math.log(max(nbytes, 1))))
            return _winner([m for m in rows if m.size_bytes == near])
        fitted = [a for a in allowed if a in self.models]
        if not fitted:
            raise ConfigError(f"the all-reduce calibration has no measurement of "
                              f"{', '.join(allowed)}; re-run approxdist bench allreduce "
                              f"--calibrate --algorithms all")
        return min(fitted, key=lambda a: self.models[a].time(
            *cost_terms(a, self.world_size, float(nbytes))))

    def to_json(self) -> dict[str, object]:
        return {
            "version": VERSION, "world_size": self.world_size, "link": self.link,
            "codec": self.codec,
            "thresholds": [{"max_bytes": m, "algorithm": a} for m, a in self.thresholds],
            "models": {a: {"alpha_s": m.alpha_s, "beta_s_per_byte": m.beta_s_per_byte}
                       for a, m in self.models.items()},
            "measured": [vars(m) for m in self.measured],
        }

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> Calibration:
        try:
            raw = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read calibration file {path}: {exc}") from None
        except ValueError as exc:
            raise ConfigError(f"calibration file {path} is malformed ({exc!r}); re-run "
                              f"approxdist bench allreduce --calibrate") from None
        return Calibration.from_json(raw, f"calibration file {path}")

    @staticmethod
    def from_json(raw: object, where: str = "the calibration") -> Calibration:
        """The calibration `to_json` wrote; `ConfigError` naming `where` if it is not one."""
        try:
            assert isinstance(raw, dict), f"a JSON {type(raw).__name__}, not an object"
            if raw.get("version") != VERSION:
                raise ConfigError(f"{where} has version {raw.get('version')!r}, expected "
                                  f"{VERSION}; re-run approxdist bench allreduce --calibrate")
            cal = Calibration(
                int(raw["world_size"]),
                tuple((t["max_bytes"], str(t["algorithm"])) for t in raw["thresholds"]),
                {a: AlphaBeta(float(m["alpha_s"]), float(m["beta_s_per_byte"]))
                 for a, m in raw.get("models", {}).items()},
                str(raw.get("link", "none")), str(raw.get("codec", "fp32")),
                tuple(Measurement(**m) for m in raw.get("measured", [])))
            if not cal.thresholds:
                raise ValueError("no thresholds")
            return cal
        except (AssertionError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{where} is malformed ({exc!r}); re-run approxdist bench "
                              f"allreduce --calibrate") from None


def fit_model(algorithm: str, world: int, points: Sequence[Measurement]) -> AlphaBeta:
    """Fit t = alpha*steps + beta*bytes by least squares on relative error (alpha, beta >= 0)."""
    steps, per_byte = cost_terms(algorithm, world, 1.0)
    xs = [p.size_bytes * per_byte for p in points]
    ts = [p.median_s for p in points]
    ws = [1.0 / t ** 2 for t in ts]
    sw = sum(ws)
    sx, st = sum(w * x for w, x in zip(ws, xs)), sum(w * t for w, t in zip(ws, ts))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxt = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det if det > 0 else 0.0
    slope = max(slope, 0.0)
    intercept = max((st - slope * sx) / sw, 0.0)
    return AlphaBeta(intercept / max(steps, 1.0), slope)


def fit(measurements: Iterable[Measurement], world: int, link: str = "none",
        codec: str = "fp32") -> Calibration:
    """Thresholds from the fastest algorithm at each size; models fitted per algorithm."""
    rows = [m for m in measurements if m.algorithm != "auto"]
    if not rows:
        raise ConfigError("no measurements to calibrate from; benchmark some algorithms")
    names = sorted({m.algorithm for m in rows})
    models = {a: fit_model(a, world, [m for m in rows if m.algorithm == a]) for a in names}
    sizes = sorted({m.size_bytes for m in rows})
    winners = [_winner([m for m in rows if m.size_bytes == s]) for s in sizes]
    thresholds: list[tuple[int | None, str]] = []
    for i in range(len(sizes) - 1):
        if winners[i] != winners[i + 1]:
            cut = _crossover(models, world, winners[i], winners[i + 1], sizes[i], sizes[i + 1])
            thresholds.append((cut, winners[i]))
    thresholds.append((None, winners[-1]))
    return Calibration(world, tuple(thresholds), models, link, codec, tuple(rows))


def _winner(rows: list[Measurement]) -> str:
    """Fastest by median time. The rows were measured in interleaved rounds, so drift in
    the machine's load touches every algorithm alike; a ratio to native's time in the same
    round would add native's own spread (on 4 ranks sharing 2 cores native's 4 KiB time
    swings between 1.7 and 5 ms, which once made ring, at 2.1x brb's median, win)."""
    return min(rows, key=lambda m: m.median_s).algorithm


def _crossover(models: dict[str, AlphaBeta], world: int, a: str, b: str, lo: int, hi: int) -> int:
    """Bytes in [lo, hi) where the models of a and b predict equal times, else sqrt(lo*hi)."""
    (sa, pa), (sb, pb) = cost_terms(a, world, 1.0), cost_terms(b, world, 1.0)
    ia, ib = models[a].alpha_s * sa, models[b].alpha_s * sb
    ka, kb = models[a].beta_s_per_byte * pa, models[b].beta_s_per_byte * pb
    if ka != kb:
        cut = (ib - ia) / (ka - kb)
        if lo <= cut < hi:
            return int(cut)
    return int(math.sqrt(lo * hi))
