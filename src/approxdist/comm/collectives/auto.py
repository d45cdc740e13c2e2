"""`auto`: pick the all-reduce by message size, seed 001's proposed hybrid (as MPICH/NCCL do).

With a `Calibration` (measured thresholds, `calibration.py`) it follows the thresholds;
without one it predicts each candidate with the alpha-beta model (`model.DEFAULT`, plus
the emulated link's latency and bandwidth) on the wire bytes after the codec, plus the
codec's CPU work per algorithm (`model.codec_work`; none on the raw fp32 path), and
takes the fastest. Candidates: ring, brb, brd, vhd, and `native` when the call is exact fp32
(codec fp32, no channel): native sums in the codec's own dtype, so with any other codec
it would change the arithmetic, not just the speed. A calibration that names native
for a size where native is not allowed falls back to its fastest measured candidate.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.calibration import Calibration
from approxdist.comm.collectives.model import DEFAULT, AlphaBeta, predict
from approxdist.comm.collectives.wire import Wire
from approxdist.comm.netem import LinkSpec
from approxdist.errors import ConfigError

MODEL_CANDIDATES = ("brd", "brb", "ring", "vhd")  # ties go to the first: ring pipelines its steps


class Auto(Algorithm):
    name = "auto"

    def __init__(self, lookup: Callable[[str], Algorithm], calibration: Calibration | None = None,
                 link: LinkSpec | None = None, wire_fraction: float = 1.0,
                 model: AlphaBeta = DEFAULT, native_ok: bool = False,
                 encodes: bool = False) -> None:
        self._lookup, self.calibration = lookup, calibration
        self.model, self.link = model, link
        self.wire_fraction = wire_fraction
        self.encodes = encodes  # the codec does CPU work per value (not the raw fp32 path)
        self.candidates = (*MODEL_CANDIDATES, "native") if native_ok else MODEL_CANDIDATES
        self._chosen: dict[tuple[int, int], str] = {}  # a training step repeats its sizes

    def choose(self, nbytes: int, world_size: int) -> str:
        """The algorithm name for `nbytes` fp32 bytes on `world_size` ranks."""
        key = (nbytes, world_size)
        name = self._chosen.get(key)
        if name is None:
            if len(self._chosen) > 1024:
                self._chosen.clear()
            name = self._chosen[key] = self._choose(nbytes, world_size)
        return name

    def _choose(self, nbytes: int, world_size: int) -> str:
        cal = self.calibration
        if cal is not None:
            if cal.world_size != world_size:
                raise ConfigError(f"the all-reduce calibration was measured on {cal.world_size} "
                                  f"ranks but this run has {world_size}; re-run approxdist bench "
                                  f"allreduce --calibrate --world-size {world_size}")
            return cal.choose(nbytes, self.candidates)
        wire = nbytes * self.wire_fraction
        values = nbytes / 4 if self.encodes else 0.0
        return min(self.candidates,
                   key=lambda a: predict(a, world_size, wire, self.model, self.link, values))

    def select(self, nbytes: int, world_size: int) -> Algorithm:
        return self._lookup(self.choose(nbytes, world_size))

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        self.select(x.numel() * 4, wire.world_size).run(wire, x)
