"""`Broadcast`: the root member's tensor into every member's tensor, in place.

    bcast = Broadcast(link, codec="bf16")             # keep it: buffers are reused
    bcast(x, root=0)                                  # x now holds member 0's values

The counterpart of `dist.broadcast` on our link layer. Algorithms: `tree`
(`broadcast_tree.py`, a binomial tree pipelined in segments), `direct`
(`broadcast_direct.py`, the root sends to every member in one step) and `auto`, which
takes `direct` up to `direct_max_bytes` and `tree` above. `root` is a member index of the
link's group (0..n-1; member i is global rank `link.group.ranks[i]`), as every peer of
the link layer is. Every member must pass the same shape, dtype and root; a member whose
root differs is caught when its messages reach a member that expects other ones (the
signature carries the root), otherwise the members wait until the process group's
timeout.

**Where the codec acts**: the root encodes x once (as fp32 values), the channel corrupts
that encoding once, and every member, the root included, ends with the decoded value
of those same bytes: `decode(encode(x_root))`, bitwise identical on all members; one
application of the codec, whatever the algorithm. With one member x is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.collectives.broadcast_direct import direct
from approxdist.comm.collectives.broadcast_tree import tree
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import SizedCollective, flat_fp32
from approxdist.comm.collectives.wire import Wire
from approxdist.errors import SpecError
from approxdist.registry import Registry

BroadcastAlgorithm = Callable[[Wire, torch.Tensor, int], None]
BROADCAST_ALGORITHMS: Registry[BroadcastAlgorithm] = Registry("broadcast algorithm", SpecError)
BROADCAST_ALGORITHMS.add("tree", tree)
BROADCAST_ALGORITHMS.add("direct", direct)


class Broadcast(SizedCollective):
    """Broadcast on this rank; construct once per (link, codec) and call repeatedly.

    `Broadcast(link, codec="fp32", channel=None, *, algorithm="auto", check=True,
    segment_bytes=None, device=None)`; `auto` sends tensors up to `direct_max_bytes` of
    fp32 directly, larger ones down the tree.
    """

    kind = "broadcast"
    algorithms = BROADCAST_ALGORITHMS
    large = "tree"
    direct_max_bytes = 64 << 10

    def __call__(self, x: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Member `root`'s values into `x` on every member (in place); returns `x`."""
        self.floating(x)
        n = self.world_size
        if not isinstance(root, int) or not 0 <= root < n:
            raise SpecError(f"broadcast root {root!r} is not a member index of the "
                            f"{self.members()}: pass 0..{n - 1} (member i is the i-th of "
                            f"the group's ranks)")
        work, in_place = flat_fp32(x)
        name, segment = self.pick(work.numel() * 4), self.segment()
        sig = Signature(work.numel(), x.dtype, "sum", name, self.codec.spec, n, segment,
                        self.kind, tuple(x.shape), root)
        with self.call(sig, segment) as wire:
            if n > 1 and work.numel() > 0:  # else every member holds the root's values
                BROADCAST_ALGORITHMS.get(name)(wire, work, root)
        if not in_place:
            x.detach().copy_(work.view(x.shape))
        return x
