"""A bucket reduced through a compressor (docs/compressors.md), on the thread's collectives.

An all-reduce compatible compressor's messages (PowerSGD's P then Q, random-k's values)
are summed by the thread's exact fp32 all-reduce; an all-gather one's payload (top-k's
values and indices, QSGD's norm and codes, ...) is gathered byte for byte by the thread's
all-gather, the counterpart of the run's all-reduce algorithm (`GATHERS`). Either way the
link counts the real bytes, and what the compressor returns (the replicas' average, or
signSGD's vote) replaces the bucket. A compressor's bucket holds its tensors and exact
fp32 values (`buckets.plan_buckets`), exchanged together: an all-reduce compatible one's
in one all-reduce a round for the whole bucket (`comm.compressors.together`, as torch's
`powerSGD_hook` sends a DDP bucket's P and Q), an all-gather one's in one all-gather
(`comm.compressors.gathered_together`).
While AdaPrec watches the bucket (`probe`), this rank's contribution is measured against
its exact gradient (`comm.update_error`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from approxdist.comm.codecs import Payload
from approxdist.comm.collectives import AllGather, AllReduce
from approxdist.comm.compressors import Compressor, Where, check_compressor, get_compressor, is_compressor
from approxdist.comm.compressors.spec import summed_names
from approxdist.comm.update_error import UpdateError
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.errors import ConfigError

#: all-reduce algorithm -> the all-gather algorithm that carries payloads beside it; the
#: others (native, brb, brd, vhd) only sum
GATHERS = {"ring": "ring", "auto": "auto"}


def reduce_compressed(comp: Compressor, x: torch.Tensor, allreduce: AllReduce,
                      gather: AllGather | None, op: str,
                      probe: UpdateError | None = None) -> None:
    """`x` <- the average over the group of every member's `x` as `comp` sends it (the sum
    for `op="sum"`): each message summed in place by `allreduce`, or each payload
    gathered by `gather` (an all-gather of bytes); `probe` observes what this member
    contributed against its exact `x`."""
    world = allreduce.world_size
    in_place = x.is_contiguous() and x.dtype == torch.float32 and x.device == comp.device
    exact = x.detach().reshape(-1).clone() if probe is not None else None
    sent = torch.empty(comp.numel, device=comp.device) if probe is not None else None
    exchange = comp.exchange(x, world, x if in_place else None, sent)  # the result into x
    message = next(exchange)
    while True:
        try:
            message = exchange.send(_combine(message, allreduce, gather))
        except StopIteration as stop:
            out: torch.Tensor = stop.value
            break
    if probe is not None and exact is not None:  # `sent` is written once the last message went
        probe.observe(0, exact, sent)
    if not in_place:
        x.copy_(out.view(x.shape))
    if op == "sum":
        x.mul_(world)


def _combine(message: Any, allreduce: AllReduce, gather: AllGather | None) -> Any:
    if not isinstance(message, Payload):
        return allreduce(message, op="sum")
    assert gather is not None, "an all-gather compressor needs the thread's all-gather"
    return gather_payloads(message, gather)


def gather_payloads(payload: Payload, gather: AllGather) -> list[Payload]:
    """Every member's payload of the same size, in member order, through `gather`'s bytes."""
    data = payload.data.reshape(-1)
    size = data.numel()
    everyone = gather(data)
    return [Payload(everyone[i * size:(i + 1) * size], payload.shape)
            for i in range(gather.world_size)]


def check_carried(spec: str, algorithm: str = "auto") -> None:
    """A compressor spec the gradient buckets can carry with the all-reduce `algorithm`:
    valid, and all-reduce compatible unless `algorithm` has an all-gather (`GATHERS`)."""
    if not is_compressor(spec) or check_compressor(spec) != "all-gather" \
            or algorithm in GATHERS:
        return
    raise ConfigError(f"{spec} needs all-gather (its workers' messages do not sum), and the "
                      f"all-reduce algorithm {algorithm!r} only sums; use --algorithm "
                      f"{' or '.join(GATHERS)} (dp.algorithm), whose all-gather carries it, "
                      f"or a compressor that sums: {', '.join(summed_names())}")


def check_shapes(module: nn.Module, rules: CodecRules) -> None:
    """Build each compressed parameter's compressor once, so that one a compressor cannot
    take (PowerSGD on a vector) is named, with the rule that would exclude it, before any
    worker starts."""
    owners = param_owners(module)
    for name, param in module.named_parameters():
        spec = rules.codec_for(name, owners[name])
        if param.requires_grad and is_compressor(spec):
            get_compressor(spec, Where(tuple(param.shape), name))
