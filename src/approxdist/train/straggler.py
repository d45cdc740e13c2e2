"""Slow ranks on purpose (seed 003's stragglers), the same for every parallel mode.

`--straggler RANK:DELAY` makes global rank RANK sleep DELAY before each of its steps (a
persistent straggler); `--straggler random:P:DELAY` makes each eligible rank sleep DELAY
before a step with probability P, drawn from the run's seed, the step and the rank (the
same on every run); `--straggler RANK:DELAY@CODEC` only before the steps that send a wire
in CODEC (a codec slow on some hardware; how AdaPrec's tests make the safe codecs slow).
Eligible ranks are every rank, or the workers of a parameter-server
run (`--parallel ps`). Delays are like `100ms`, `0.1s`, `500us` (a bare number is
seconds). The trainer calls `Stragglers.pause` before each step, so data parallelism,
pipelines and the parameter server all show what a straggler costs them.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.train.mode import mesh_of

FORMS = ("RANK:DELAY (e.g. 2:100ms), RANK:DELAY@CODEC (e.g. 0:50ms@fp32) or random:P:DELAY "
         "(e.g. random:0.1:50ms)")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}
_DELAY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|ms|s|)\s*$")


def parse_delay(text: str, spec: str) -> float:
    m = _DELAY.match(text)
    if not m:
        raise ConfigError(f"--straggler {spec!r}: delay {text!r} is not a time like 100ms, "
                          f"0.1s or 500us")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Stragglers:
    """Persistent delays per rank and one random rule over `eligible` ranks."""

    fixed: tuple[tuple[int, float], ...] = ()
    probability: float = 0.0
    random_delay: float = 0.0
    eligible: tuple[int, ...] = ()
    seed: int = 0
    #: (rank, delay, codec): the delay only before steps that send a wire in that codec
    by_codec: tuple[tuple[int, float, str], ...] = ()

    @classmethod
    def parse(cls, specs: Sequence[str], world_size: int, eligible: Sequence[int] | None = None,
              seed: int = 0) -> Stragglers:
        """`specs` for a world of `world_size` ranks; `ConfigError` naming a bad one."""
        fixed: dict[int, float] = {}
        by_codec: list[tuple[int, float, str]] = []
        prob, rdelay = 0.0, 0.0
        for spec in specs:
            head, at, codec = spec.partition("@")
            parts = head.split(":")
            if at and not (codec.strip() and len(parts) == 2 and parts[0].strip().isdigit()):
                raise ConfigError(f"--straggler {spec!r} is not one of: {FORMS}")
            if parts[0] == "random" and len(parts) == 3:
                try:
                    prob = float(parts[1])
                except ValueError:
                    prob = -1.0
                if not 0.0 <= prob <= 1.0:
                    raise ConfigError(f"--straggler {spec!r}: probability {parts[1]!r} must be "
                                      f"a number in [0, 1], e.g. random:0.1:50ms")
                rdelay = parse_delay(parts[2], spec)
            elif len(parts) == 2 and parts[0].strip().isdigit():
                rank = int(parts[0])
                if rank >= world_size:
                    raise ConfigError(f"--straggler {spec!r}: rank {rank} is not in this run of "
                                      f"{world_size} rank(s); use a rank in 0..{world_size - 1}")
                if at:
                    by_codec.append((rank, parse_delay(parts[1], spec), codec.strip()))
                else:
                    fixed[rank] = parse_delay(parts[1], spec)
            else:
                raise ConfigError(f"--straggler {spec!r} is not one of: {FORMS}")
        ranks = tuple(eligible) if eligible is not None else tuple(range(world_size))
        return cls(tuple(sorted(fixed.items())), prob, rdelay, ranks, seed, tuple(by_codec))

    def delay(self, rank: int, step: int, codecs: Collection[str] = ()) -> float:
        """Seconds `rank` sleeps before global step `step`, whose wires send `codecs` (pure)."""
        out = dict(self.fixed).get(rank, 0.0)
        out += sum(d for r, d, c in self.by_codec if r == rank and c in codecs)
        if self.probability > 0 and rank in self.eligible:
            draw = random.Random(f"{self.seed}:{step}:{rank}").random()
            if draw < self.probability:
                out += self.random_delay
        return out

    def pause(self, rank: int, step: int, codecs: Collection[str] = ()) -> float:
        """Sleep `delay(rank, step, codecs)`; the seconds slept."""
        d = self.delay(rank, step, codecs)
        if d > 0:
            time.sleep(d)
        return d

    def __bool__(self) -> bool:
        return bool(self.fixed) or bool(self.by_codec) or \
            (self.probability > 0 and self.random_delay > 0)


def stragglers_of(cfg: Config) -> Stragglers:
    """The run's `--straggler` rules; random ones pick among the ranks that compute (not a
    parameter server's servers)."""
    world = cfg.train.world_size
    if not cfg.train.stragglers:
        return Stragglers.parse((), world)
    mesh = mesh_of(cfg)
    eligible = [r for r in range(mesh.world_size) if mesh.place(r).role != "server"]
    return Stragglers.parse(cfg.train.stragglers, world, eligible, cfg.train.seed)
