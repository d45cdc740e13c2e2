"""Several tensors' all-reduce compatible compressors as one exchange: one all-reduce a round.

torch's `powerSGD_hook` sends the P factors of all of a DDP bucket's matrices in one
all-reduce and their Q factors in a second (torch 2.x, powerSGD_hook.py l.585, l.607),
and the bucket's uncompressed tensors in one more, whatever the number of matrices. One
collective per matrix and round pays each collective's fixed cost (posting, the ring's
steps, the link's latency, the communication thread's Python) once per matrix: ResNet-20
has 20 matrices. `Together` runs the exchanges of a bucket's members side by side:

* a member is a `Summed` compressor (PowerSGD, random-k) of one tensor, or *exact*: fp32
  values that ride along (a rule's `*.bias=fp32` beside PowerSGD), sent as they are and
  averaged;
* round k's message is the concatenation of round k's message of every member still
  running; its sum over the workers is split back and handed to each member; a member
  with fewer rounds (exact: one) drops out after its last.

Each member's maths is its own, unchanged; only the sums are made in one collective. With
2 workers a sum is a + b = b + a whichever collective adds it, so the result is bit for bit
that of one exchange per member; with more, a ring may add the workers in another order
for a value that moved to another chunk (float rounding). Pure: no torch.distributed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from approxdist.comm.compressors.base import Compressor, SumExchange, Summed
from approxdist.errors import ConfigError


@dataclass(frozen=True)
class Member:
    """One tensor of a bucket: where its values lie and what sends them (None: exact fp32)."""

    name: str
    offset: int
    shape: torch.Size
    compressor: Compressor | None

    @property
    def numel(self) -> int:
        return self.shape.numel()


def member_spec(members: Sequence[Member], collective: str, owner: str, instead: str) -> str:
    """The one compressor spec of a bucket's members, all of whose compressors use
    `collective`; `ConfigError` otherwise (`owner`: the class asking, `instead`: where a
    member of the other collective belongs)."""
    specs = {m.compressor.spec for m in members if m.compressor is not None}
    other = [m.name for m in members
             if m.compressor is not None and m.compressor.collective != collective]
    if other:
        raise ConfigError(f"{owner} combines its members' messages by {collective}, but "
                          f"{', '.join(sorted(specs))} does not ({other[0]!r}); put such a "
                          f"parameter in {instead}")
    if len(specs) != 1:
        raise ConfigError(f"{owner} needs one compressor spec among its members, got "
                          f"{sorted(specs) or 'none'}; plan one bucket per compressor")
    return specs.pop()


def exact_positions(members: Sequence[Member], device: torch.device) -> torch.Tensor | None:
    """The positions of the exact (uncompressed) members' values, in member order, or None."""
    spans = [torch.arange(m.offset, m.offset + m.numel) for m in members if m.compressor is None]
    return torch.cat(spans).to(device) if spans else None


class Together(Summed):
    """The members' exchanges as one, over a flat tensor holding every member's values."""

    def __init__(self, members: Sequence[Member], device: torch.device | None = None) -> None:
        super().__init__(member_spec(members, "all-reduce", "Together", "a GatheredTogether"),
                         (sum(m.numel for m in members),), device)
        self.members = list(members)
        #: the exact members' positions, gathered into one block of the first message (a
        #: bucket's biases and norms: one copy in and one out, not a step per vector)
        self.exact = exact_positions(members, self.device)

    def wire_bytes(self) -> int:
        return sum(m.compressor.wire_bytes() if m.compressor is not None else 4 * m.numel
                   for m in self.members)

    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> SumExchange:
        flat = grad.detach().reshape(-1)
        where = self.exact
        exact = flat.index_select(0, where) if where is not None else None
        result = out.view(-1) if out is not None else flat.clone()  # read before written
        if sent is not None and where is not None and exact is not None:
            sent.index_copy_(0, where, exact)
        running = [m.compressor.exchange(
            flat[m.offset:m.offset + m.numel].view(m.shape), world,
            result[m.offset:m.offset + m.numel], None if sent is None
            else sent[m.offset:m.offset + m.numel]) for m in self.members if m.compressor]
        messages = [next(ex) for ex in running]
        active = list(range(len(running)))
        while active:
            shapes = [messages[i].shape for i in active]
            head = [exact] if exact is not None else []
            total = yield torch.cat(head + [messages[i].reshape(-1) for i in active])
            if where is not None and exact is not None:  # their sum, then the mean (as fp32's)
                mean = total[:exact.numel()]
                result.index_copy_(0, where, mean.div_(world) if world > 1 else mean)
                total, exact = total[exact.numel():], None
            still = []
            for i, shape, part in zip(active, shapes, total.split([s.numel() for s in shapes]),
                                      strict=True):
                try:
                    messages[i] = running[i].send(part.view(shape))
                    still.append(i)
                except StopIteration:
                    pass
            active = still
        return result
