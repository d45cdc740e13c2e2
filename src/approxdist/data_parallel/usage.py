"""Which parameters no rank used this step (`find_unused_parameters=True`).

Single-process training leaves `.grad` None for a parameter the combined batch never
reached, and `optimizer.step()` then skips it (no weight decay, no momentum). To match,
each rank flags the parameters that had a gradient, the flags are summed exactly over
the control lane at the end of backward (one small fp32 all-reduce, on the main
thread, in the same place on every rank), and a parameter whose sum is 0 keeps
`.grad = None`. Reduced buckets wait for the flags before their gradients are used.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from approxdist.data_parallel.reducer import BucketState
from approxdist.data_parallel.threads import CommPool


class UsageFlags:
    """Global usage per bucket slot, computed once per backward pass."""

    def __init__(self, buckets: Sequence[BucketState], pool: CommPool) -> None:
        self.pool = pool
        self._sizes = [len(b.params) for b in buckets]
        self._index = {id(b): i for i, b in enumerate(buckets)}
        self._used: list[list[bool]] = [[True] * n for n in self._sizes]
        self._ready = threading.Event()
        self._ready.set()

    def reset(self) -> None:
        self._ready.clear()

    def reduce(self, had_grad: Sequence[Sequence[bool]], has_grad: Sequence[Sequence[bool]]
               ) -> None:
        """Sum this rank's flags with the others'; a slot counts if it has any gradient."""
        flags = torch.tensor([float(a or b) for ha, hb in zip(had_grad, has_grad)
                              for a, b in zip(ha, hb)], dtype=torch.float32,
                             device=self.pool.ctx.device)
        try:
            if flags.numel() and self.pool.group.size > 1:
                self.pool.control_reducer(flags, op="sum")
            values = (flags > 0).tolist()
            at = 0
            for i, n in enumerate(self._sizes):
                self._used[i] = values[at:at + n]
                at += n
        finally:
            self._ready.set()

    def wait(self, bucket: BucketState) -> list[bool]:
        self._ready.wait()
        return self._used[self._index[id(bucket)]]
