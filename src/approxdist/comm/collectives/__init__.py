"""All-reduce algorithms of seed 001 on the link layer: native, ring, brb, brd, vhd, auto.

Entry points: `AllReduce` (kept per rank, called per tensor), `get_algorithm`, the
registry `ALGORITHMS`, the simulated world `simulate` for tests, and the calibration file
used by `auto`. See docs/collectives.md.
"""

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.allreduce import OPS, AllReduce, all_reduce
from approxdist.comm.collectives.calibration import DEFAULT_PATH, Calibration, Measurement, fit
from approxdist.comm.collectives.registry import ALGORITHMS, algorithm_names, get_algorithm

__all__ = [
    "ALGORITHMS", "DEFAULT_PATH", "OPS", "Algorithm", "AllReduce", "Calibration", "Measurement",
    "algorithm_names", "all_reduce", "fit", "get_algorithm",
]
