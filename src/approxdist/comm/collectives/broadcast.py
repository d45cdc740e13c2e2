"""`Broadcast`: the root member's tensor into every member's tensor, in place.

    bcast = Broadcast(link, codec="bf16")             # keep it: buffers are reused
    bcast(x, root=0)                                  # x now holds member 0's values

The counterpart of `dist.broadcast` on our link layer, down a pipelined binomial tree
(`broadcast_tree.py`). `root` is a member index of the link's group (0..n-1; member i
is global rank `link.group.ranks[i]`), as every peer of the link layer is. Every member
must pass the same shape, dtype and root; a member whose root differs is caught when its
messages reach a member that expects other ones (the signature carries the root),
otherwise the members wait until the process group's timeout.

**Where the codec acts**: the root encodes x once (as fp32 values), the channel corrupts
that encoding once, and every member, the root included, ends with the decoded value
of those same bytes: `decode(encode(x_root))`, bitwise identical on all members; one
application of the codec, whatever the tree's depth. With one member x is unchanged.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.broadcast_tree import broadcast
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import Collective, flat_fp32
from approxdist.comm.collectives.wire import SEGMENT_BYTES, link_segment
from approxdist.errors import SpecError


class Broadcast(Collective):
    """Broadcast on this rank; construct once per (link, codec) and call repeatedly."""

    kind = "broadcast"
    algorithm = "tree"

    def __call__(self, x: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Member `root`'s values into `x` on every member (in place); returns `x`."""
        self.floating(x)
        n = self.world_size
        if not isinstance(root, int) or not 0 <= root < n:
            raise SpecError(f"broadcast root {root!r} is not a member index of the "
                            f"{self.members()}: pass 0..{n - 1} (member i is the i-th of "
                            f"the group's ranks)")
        work, in_place = flat_fp32(x)
        segment = self.segment_bytes or (link_segment(self.codec.bits_per_value)
                                         if self.emulated else SEGMENT_BYTES)
        sig = Signature(work.numel(), x.dtype, "sum", self.algorithm, self.codec.spec, n,
                        segment, self.kind, tuple(x.shape), root)
        with self.call(sig, segment) as wire:
            broadcast(wire, work, root)
        if not in_place:
            x.detach().copy_(work.view(x.shape))
        return x
