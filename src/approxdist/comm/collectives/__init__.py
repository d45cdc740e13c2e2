"""Collectives on the link layer: seed 001's all-reduce algorithms, all-gather, reduce-scatter
and broadcast, each with a codec on its wire.

Entry points: `AllReduce` (native, ring, brb, brd, vhd, auto), `AllGather` and
`ReduceScatter` (ring, direct, auto) and `Broadcast` (tree, direct, auto), each kept per rank and called
per tensor; `get_algorithm`, the registry `ALGORITHMS` and the calibration file used by
the all-reduce's `auto`. See docs/collectives.md.
"""

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.allgather import GATHER_ALGORITHMS, AllGather
from approxdist.comm.collectives.allreduce import OPS, AllReduce, all_reduce
from approxdist.comm.collectives.broadcast import BROADCAST_ALGORITHMS, Broadcast
from approxdist.comm.collectives.calibration import DEFAULT_PATH, Calibration, Measurement, fit
from approxdist.comm.collectives.reducescatter import SCATTER_ALGORITHMS, ReduceScatter
from approxdist.comm.collectives.registry import ALGORITHMS, algorithm_names, get_algorithm

__all__ = [
    "ALGORITHMS", "BROADCAST_ALGORITHMS", "DEFAULT_PATH", "GATHER_ALGORITHMS", "OPS",
    "SCATTER_ALGORITHMS", "Algorithm", "AllGather", "AllReduce", "Broadcast", "Calibration",
    "Measurement", "ReduceScatter",
    "algorithm_names", "all_reduce", "fit", "get_algorithm",
]
