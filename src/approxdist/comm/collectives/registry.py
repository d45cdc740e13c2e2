"""All-reduce algorithms by name: native, ring, brb, brd, vhd, auto (seed 001)."""

from __future__ import annotations

from pathlib import Path

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.auto import Auto
from approxdist.comm.collectives.brb import Brb
from approxdist.comm.collectives.brd import Brd
from approxdist.comm.collectives.calibration import Calibration
from approxdist.comm.collectives.native import Native
from approxdist.comm.collectives.ring import Ring
from approxdist.comm.collectives.vhd import Vhd
from approxdist.comm.netem import LinkSpec
from approxdist.errors import SpecError
from approxdist.registry import Registry

#: the fixed algorithms; `auto` is built by `get_algorithm` around them
ALGORITHMS: Registry[type[Algorithm]] = Registry("all-reduce algorithm", SpecError)
for _cls in (Native, Ring, Brb, Brd, Vhd, Auto):
    ALGORITHMS.add(_cls.name, _cls)


def algorithm_names() -> list[str]:
    """Every registered name, the baseline `native` first."""
    return ["native"] + [n for n in ALGORITHMS.names() if n != "native"]


def get_algorithm(name: str, *, calibration: Calibration | str | Path | None = None,
                  link: LinkSpec | None = None, wire_fraction: float = 1.0,
                  native_ok: bool = False, encodes: bool = False) -> Algorithm:
    """The algorithm called `name`. Only `auto` uses the other arguments.

    `calibration` is a `Calibration` or the path of a file written by
    `approxdist bench allreduce --calibrate`; without it auto uses the alpha-beta
    model with `link`'s latency and bandwidth and `wire_fraction` (codec bits / 32).
    `native_ok`: the call is exact fp32, so auto may pick `native`; `encodes`: the codec
    does CPU work per value (auto then counts it, `model.codec_work`).
    """
    cls = ALGORITHMS.get(name)
    if cls is not Auto:
        return cls()
    if calibration is not None and not isinstance(calibration, Calibration):
        calibration = Calibration.load(calibration)
    return Auto(get_algorithm, calibration, link, wire_fraction, native_ok=native_ok,
                  encodes=encodes)
