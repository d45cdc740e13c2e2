"""Several tensors' all-gather compressors as one exchange: one all-gather a step for a bucket.

`together.py` sends an all-reduce compatible bucket's messages in one all-reduce a round.
The all-gather compressors (top-k, QSGD, TernGrad, the sign methods) had a bucket per
parameter instead, and the exact fp32 vectors between them (a rule's `*.bias=fp32`) a
bucket per run: gpt-tiny (11 matrices, 18 vectors) paid 21 collectives a step where fp32
pays 2, each with its fixed cost (the communication thread's Python, posting, the link's
shaper), which on a model of small tensors is of the order of the whole step
(docs/compressors.md, "Many small tensors"). `GatheredTogether` runs a bucket's members
side by side:

* a member is a `Gathered` compressor of one tensor (all of one spec), or *exact*: fp32
  values that ride along, sent as their own bytes;
* the one payload is the exact values' bytes, then each compressed member's payload in
  member order (each exactly its `wire_bytes()`, the same sizes on every worker);
* every worker's payload is split back: each compressed member combines its parts of
  all workers' payloads (decode, add in worker order, mean or vote) as its own exchange
  does, and the exact values are summed in worker order and divided by the world size.

Each member's maths is its own, unchanged, and so are its bytes: the payloads and the
results are bit for bit those of one exchange per member. Members of one bit-packed
compressor (QSGD, TernGrad, the sign methods) are encoded and combined all at once where
the kernels run (`packed_bucket.py`), not one tensor at a time. The exact values' mean is
the worker-order sum that a 2-member all-reduce makes (a + b = b + a); with more members
an all-reduce may add them in another order (float rounding), as in `together.py`.
Pure: no torch.distributed here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.base import Compressor, Gathered, GatherExchange, in_order
from approxdist.comm.compressors.packed_bucket import PackedBucket
from approxdist.comm.compressors.together import Member, exact_positions, member_spec
from approxdist.errors import ConfigError


class GatheredTogether(Compressor):
    """The members' gathered exchanges as one, over a flat tensor holding every member's values."""

    collective = "all-gather"

    def __init__(self, members: Sequence[Member], device: torch.device | None = None) -> None:
        super().__init__(member_spec(members, "all-gather", "GatheredTogether", "a Together"),
                         (sum(m.numel for m in members),), device)
        self.members = list(members)
        self.gathered = [m for m in members if m.compressor is not None]
        #: the exact members' positions, one block at the head of the payload
        self.exact = exact_positions(members, self.device)
        self.exact_bytes = 4 * self.exact.numel() if self.exact is not None else 0
        #: every compressed member at once (bit-packed compressors on CPU), or None
        self.packed = PackedBucket.of([m.offset for m in self.gathered],
                                      [m.compressor for m in self.gathered], self.exact_bytes)

    def wire_bytes(self) -> int:
        return self.exact_bytes + sum(m.compressor.wire_bytes() for m in self.gathered
                                      if m.compressor is not None)

    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> GatherExchange:
        flat = grad.detach().reshape(-1)
        where = self.exact
        head = [] if where is None else [flat.index_select(0, where).view(torch.uint8)]
        if sent is not None and where is not None:
            sent.index_copy_(0, where, flat.index_select(0, where))
        # every value is read before `out` (maybe grad) is written
        data = self.packed.outgoing(flat, head[0] if head else None) \
            if self.packed is not None and sent is None else None
        if data is None:
            data = torch.cat(head + [p.data.reshape(-1) for p in self._outgoing(flat, sent)])
        gathered = yield Payload(data, self.shape)
        if len(gathered) != world:
            raise ConfigError(f"{self.spec}: gathered {len(gathered)} payloads for a world of "
                              f"{world}")
        received = [g.data.reshape(-1) for g in gathered]
        result = out.view(-1) if out is not None else torch.empty_like(flat, dtype=torch.float32)
        if self.packed is None or not self.packed.combine(received, result):
            self._combine(received, result)
        if where is not None:  # their sum in worker order, then the mean (as fp32's)
            mean = in_order([typed(r[:self.exact_bytes], torch.float32) for r in received])
            result.index_copy_(0, where, mean.div_(world) if world > 1 else mean)
        return result

    def _outgoing(self, flat: torch.Tensor, sent: torch.Tensor | None) -> list[Payload]:
        """Each compressed member's own payload, one member at a time."""
        return [self._compressor(m).outgoing(
            flat[m.offset:m.offset + m.numel].view(m.shape),
            None if sent is None else sent[m.offset:m.offset + m.numel])
            for m in self.gathered]

    def _combine(self, received: list[torch.Tensor], result: torch.Tensor) -> None:
        """Each compressed member's own `combine` of its parts of the workers' payloads."""
        sizes = [self.exact_bytes] + [self._compressor(m).wire_bytes() for m in self.gathered]
        split = [r.split(sizes) for r in received]
        for i, m in enumerate(self.gathered, start=1):
            self._compressor(m).combine([Payload(s[i], m.shape) for s in split],
                                        result[m.offset:m.offset + m.numel])

    @staticmethod
    def _compressor(member: Member) -> Gathered:
        comp = member.compressor
        assert isinstance(comp, Gathered), f"{member.name} has no gathered compressor"
        return comp
