"""A bucket reduced through an all-reduce compatible compressor (docs/compressors.md).

The compressor's messages (PowerSGD's P then Q, random-k's values) are summed by the
thread's exact all-reduce, so the link counts their real bytes; what the compressor
returns (the replicas' average) replaces the bucket. A compressed bucket holds one
parameter (`buckets.plan_buckets`): PowerSGD needs its matrix shape.
"""

from __future__ import annotations

import torch
from torch import nn

from approxdist.comm.collectives import AllReduce
from approxdist.comm.compressors import Summed, Where, check_compressor, get_compressor, is_compressor
from approxdist.comm.compressors.spec import summed_names
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.errors import ConfigError


def reduce_compressed(comp: Summed, x: torch.Tensor, allreduce: AllReduce, op: str) -> None:
    """`x` <- the average over the group of every member's `x` as `comp` sends it (the sum
    for `op="sum"`); each message is summed in place by `allreduce`."""
    world = allreduce.world_size
    exchange = comp.exchange(x, world)
    message = next(exchange)
    while True:
        try:
            message = exchange.send(allreduce(message, op="sum"))
        except StopIteration as stop:
            out: torch.Tensor = stop.value
            break
    x.copy_(out.view(x.shape))
    if op == "sum":
        x.mul_(world)


def check_summed(spec: str) -> None:
    """A compressor spec the gradient buckets can carry: valid and all-reduce compatible."""
    if is_compressor(spec) and check_compressor(spec) != "all-reduce":
        raise ConfigError(f"{spec} needs all-gather (its workers' messages do not sum), and "
                          f"the data-parallel gradient wire carries only all-reduce compatible "
                          f"compressors so far: {', '.join(summed_names())}; e.g. --codec "
                          f"powersgd:2 --codec-rule '*.bias=fp32'")


def check_shapes(module: nn.Module, rules: CodecRules) -> None:
    """Build each compressed parameter's compressor once, so that one a compressor cannot
    take (PowerSGD on a vector) is named, with the rule that would exclude it, before any
    worker starts."""
    owners = param_owners(module)
    for name, param in module.named_parameters():
        spec = rules.codec_for(name, owners[name])
        if param.requires_grad and is_compressor(spec):
            get_compressor(spec, Where(tuple(param.shape), name))
