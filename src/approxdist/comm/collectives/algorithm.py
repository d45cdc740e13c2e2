"""The `Algorithm` base class: a named all-reduce that runs on a `Wire` in place (seed 001)."""

from __future__ import annotations

import torch

from approxdist.comm.collectives.wire import SEGMENT_BYTES, Wire


class Algorithm:
    """Sums a flat, contiguous fp32 tensor over all ranks of `wire`, in place.

    Subclasses set `name` and implement `run`. `select` lets `auto` hand the call to
    another algorithm by message size; every other algorithm returns itself.
    """

    name: str = "?"
    #: reduce steps move messages in pieces of this many fp32 bytes (`Wire.segments`)
    segment_bytes: int = SEGMENT_BYTES
    #: whether lossy codecs and channels apply (native only takes fp32/fp16/bf16 casts)
    any_codec: bool = True

    def select(self, nbytes: int, world_size: int) -> Algorithm:
        return self

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<all-reduce {self.name}>"
