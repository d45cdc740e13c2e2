"""Tensor parallelism (seed 003's split within a layer and by channel; Megatron-LM's scheme):
a layer's weights split over the `tp` ranks, autograd regions whose collectives travel on
the `tp_fwd` / `tp_bwd` wires, plans saying which layer splits how (docs/tensor_parallel.md).
"""

from approxdist.tensor_parallel.comm import TPComm
from approxdist.tensor_parallel.plan import (
    STYLES,
    check_plan,
    default_plan,
    parallelize,
    read_tp_plan,
    tp_plan_from,
)
from approxdist.tensor_parallel.regions import copy_to, reduce_from

__all__ = ["STYLES", "TPComm", "check_plan", "copy_to", "default_plan", "parallelize",
           "tp_plan_from", "read_tp_plan", "reduce_from"]
