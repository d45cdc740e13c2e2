"""`native`: the backend's own `dist.all_reduce` (gloo's segmented ring), the baseline.

It bypasses the link layer's per-message shaping (see `peers.LinkComm.native_sum`) and
takes only cast codecs: `fp32`, or `fp16` / `bf16`, where the sum itself runs in 16 bits
like DDP's compression hooks. Other codecs raise `SpecError`.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.wire import Wire
from approxdist.errors import SpecError

CASTS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Native(Algorithm):
    name = "native"
    any_codec = False

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        if wire.world_size == 1:
            return
        dtype = cast_dtype(wire.codec.spec, wire.channel is not None)
        if dtype == torch.float32:
            wire.comm.native_sum(x)
            return
        low = x.to(dtype)
        wire.comm.native_sum(low)
        x.copy_(low)


def cast_dtype(spec: str, has_channel: bool) -> torch.dtype:
    """The dtype `native` sums in for codec `spec`; `SpecError` if it cannot."""
    if spec not in CASTS or has_channel:
        raise SpecError(f"all-reduce 'native' takes codecs {', '.join(CASTS)} without a "
                        f"channel, got codec {spec!r}{' with a channel' if has_channel else ''}; "
                        f"use ring, brb, brd, vhd or auto for other codecs")
    return CASTS[spec]
