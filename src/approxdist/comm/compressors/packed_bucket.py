"""A bucket of one bit-packed compressor (sign+ef, signsgd, qsgd, terngrad): one kernel call a phase.

`GatheredTogether` sends a bucket's members in one payload, but each member still encoded
and combined on its own: a ctypes call and 20-30 small torch ops a tensor (its scale, the
payload's views, the table of its code values). On ResNet-56's 56 matrices (849 K values)
`sign+ef`'s encode and 2-worker combine cost ~6x what one tensor of the same size costs
(docs/compressors.md, "Many small tensors"). `PackedBucket` does each phase for every
member at once:

* encode: the members' scales from one kernel call (`kernels/bucket.c`: each member's
  fixed-order sum, norm or max in turn) and torch ops on all of them as one vector (the
  same elementwise fp32 operations a member's own encode makes on its 0-d scale), then
  every member's codes in one more call, written where the member's part of the bucket's
  payload lies; a member whose scale the kernels refuse (QSGD's zero or non-finite norm,
  TernGrad's) is encoded by its own torch path, with the random key it already drew;
* combine: every worker's scales read at once, every code table made by one call of the
  compressor's `tables`, and each member's decode and worker-order sum in one call; the
  mean (or the vote) over the whole bucket in one op.

Each member keeps its own scale, residual and random stream, so payloads, results and
saved states are bit for bit those of one exchange per member. Where the kernels cannot
run (no compiler, a member's `use_kernels` off, values not on the CPU, not fp32 or not
contiguous; QSGD's codes above 8 bits for the combine) `outgoing` and `combine` answer
None / False and the caller takes the per-member path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.packed import Packed
from approxdist.kernels.bucket import BucketKernel, pointers
from approxdist.kernels.slot import KernelSlot


class Layout:
    """Where each member's values lie in the flat bucket and its payload in the bucket's."""

    def __init__(self, starts: Sequence[int], comps: Sequence[Packed], head: int) -> None:
        sizes = [c.wire_bytes() for c in comps]
        at = torch.tensor([head] + sizes, dtype=torch.int64).cumsum(0)[:-1]
        self.lengths = torch.tensor([c.numel for c in comps], dtype=torch.int64)
        #: the values the flat bucket must hold at least (past the last member's)
        self.end = max((s + c.numel for s, c in zip(starts, comps, strict=True)), default=0)
        #: `mean_of`'s divisor of each member (its count of values, at least 1)
        self.counts = self.lengths.clamp(min=1).to(torch.float32)
        self.values_at = torch.tensor(starts, dtype=torch.int64) * 4
        self.payload_at, self.sizes = at.tolist(), sizes
        self.nbytes = head + sum(sizes)
        scaled = comps[0].codes.head
        self.codes_at = at + scaled
        #: the bytes of every member's fp32 scale, member after member (None: unscaled)
        self.scale_bytes = (at[:, None] + torch.arange(4)).reshape(-1) if scaled else None


@dataclass
class Members:
    """One step's encode of a bucket's members (what each compressor's `encode_members` gets)."""

    comps: list[Packed]
    kernel: BucketKernel
    layout: Layout
    flat: torch.Tensor  # the bucket's fp32 values
    data: torch.Tensor  # the bucket's payload, head already written
    #: int64 addresses of each member's values and of its codes in `data`
    inputs: torch.Tensor
    codes: torch.Tensor

    @property
    def count(self) -> int:
        return len(self.comps)

    def addresses(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The addresses of one flat fp32 CPU tensor a member (its state), each checked."""
        for t, n in zip(tensors, (c.numel for c in self.comps), strict=True):
            if t.dtype != torch.float32 or t.numel() != n or not t.is_contiguous() \
                    or t.device.type != "cpu":
                raise ValueError(f"bucket kernel needs a contiguous CPU fp32 tensor of {n} "
                                 f"values a member; got {t.dtype} {tuple(t.shape)} on {t.device}")
        return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)

    def put_scales(self, scales: torch.Tensor) -> None:
        """Write each member's fp32 scale at the head of its payload."""
        assert self.layout.scale_bytes is not None
        self.data[self.layout.scale_bytes] = scales.to(torch.float32).contiguous() \
            .view(torch.uint8)

    def codes_where(self, keep: torch.Tensor) -> torch.Tensor:
        """The codes' addresses of the members `keep` marks, 0 (skipped) for the others."""
        return torch.where(keep, self.codes, 0)

    def by_torch(self, redo: torch.Tensor, encode: Callable[[int, torch.Tensor], Payload]) -> None:
        """Encode the members `redo` marks one by one (`encode(i, values)`: member i's payload)."""
        lay = self.layout
        for i in redo.nonzero().flatten().tolist():
            start = int(lay.values_at[i]) // 4
            payload = encode(i, self.flat[start:start + self.comps[i].numel])
            at = lay.payload_at[i]
            self.data[at:at + lay.sizes[i]].copy_(payload.data.reshape(-1))


class PackedBucket:
    """A `GatheredTogether` bucket's `Packed` members (one compressor class), encoded and
    combined together."""

    def __init__(self, starts: Sequence[int], comps: Sequence[Packed], head: int) -> None:
        self.comps = list(comps)
        self.first = self.comps[0]
        self.layout = Layout(starts, self.comps, head)
        self.on_cpu = all(c.device.type == "cpu" for c in self.comps)
        self._kernel: KernelSlot[BucketKernel] = KernelSlot()

    @staticmethod
    def of(starts: Sequence[int], comps: Sequence[object], head: int) -> PackedBucket | None:
        """The bucket of these compressors (offsets `starts` in the flat bucket, their payloads
        after `head` bytes) where all are `Packed` of one class; else None."""
        kinds = {type(c) for c in comps}
        if not comps or len(kinds) != 1 or not all(isinstance(c, Packed) for c in comps):
            return None
        return PackedBucket(starts, [c for c in comps if isinstance(c, Packed)], head)

    def kernel(self, *tensors: torch.Tensor) -> BucketKernel | None:
        """The bucket kernels if every member uses its kernels and these tensors are CPU and
        contiguous; else None."""
        if not self.on_cpu or not all(c.codes.use_kernels for c in self.comps) \
                or not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
            return None
        return self._kernel.get(BucketKernel.create)

    def outgoing(self, flat: torch.Tensor, head: torch.Tensor | None) -> torch.Tensor | None:
        """The bucket's payload: `head` (bytes), then each member's payload of its values in the
        flat fp32 `flat` (residuals and streams updated as by its `outgoing`); None where the
        kernels cannot take it."""
        lay = self.layout
        kernel = self.kernel(flat) if flat.dtype == torch.float32 else None
        if kernel is None or flat.numel() < lay.end:
            return None
        data = torch.empty(lay.nbytes, dtype=torch.uint8)
        if head is not None:
            data[:head.numel()].copy_(head)
        self.first.encode_members(Members(
            self.comps, kernel, lay, flat, data, pointers(flat.data_ptr(), lay.values_at),
            pointers(data.data_ptr(), lay.codes_at)))
        return data

    def combine(self, payloads: Sequence[torch.Tensor], result: torch.Tensor) -> bool:
        """Every member's `combine` of the workers' bucket payloads (uint8, in worker order)
        into its part of the flat fp32 `result`, which every position of the bucket may be
        written in; False (nothing written) where the kernels cannot take them."""
        lay, world = self.layout, len(payloads)
        width = self.first.codes.width
        kernel = self.kernel(result, *payloads) if width <= 8 and result.dtype == torch.float32 \
            and all(p.dtype == torch.uint8 and p.numel() == lay.nbytes for p in payloads) \
            else None
        if kernel is None or world == 0 or result.numel() < lay.end:
            return False
        bases = torch.tensor([p.data_ptr() for p in payloads], dtype=torch.int64)
        codes = (lay.codes_at[:, None] + bases).reshape(-1)  # member-major
        scales = None
        if lay.scale_bytes is not None:  # (member, worker) -> that payload's scale
            scales = torch.stack([typed(p[lay.scale_bytes], torch.float32) for p in payloads],
                                 dim=1).reshape(-1, 1)
        values = self.first.tables(scales, len(self.comps) * world)
        kernel.decode(codes, lay.lengths, world, values.contiguous(), width,
                      pointers(result.data_ptr(), lay.values_at))
        self.first.finish(result, world)
        return True
