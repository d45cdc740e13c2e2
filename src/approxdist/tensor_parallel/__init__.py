"""Tensor parallelism (seed 003's split within a layer and by channel; Megatron-LM's scheme):
a layer's weights split over the `tp` ranks, autograd regions whose collectives travel on
the `tp_fwd` / `tp_bwd` wires, plans saying which layer splits how (docs/tensor_parallel.md).
"""

from approxdist.tensor_parallel.comm import TPComm
from approxdist.tensor_parallel.plan import STYLES, default_plan, parallelize, read_plan
from approxdist.tensor_parallel.regions import copy_to, reduce_from

__all__ = ["STYLES", "TPComm", "copy_to", "default_plan", "parallelize", "read_plan",
           "reduce_from"]
