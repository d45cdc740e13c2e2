"""The tensor-parallel group's collectives, each on its wire (codec, channel, error feedback).

`TPComm(link, fwd, bwd)` holds one `AllReduce` per direction on the link of the `tp`
group: forward collectives (a row-parallel layer's partial sums) travel on `fwd` (the
`tp_fwd` wire), backward ones (a column-parallel layer's input gradients) on `bwd`
(`tp_bwd`); every byte goes through the link layer (codec, bit errors, emulated link,
byte counts, trace events; DESIGN principle 2). A wire with error feedback keeps one
residual per site (the layer's path and direction; EF-SGD's memory of what the codec
dropped, `comm.error_feedback`), reset when the site's shape changes (a last, smaller
batch). One rank alone is the identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from approxdist.comm.collectives import AllReduce
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.comm.link import Link
from approxdist.config.wire import EXACT, Wire


class TPComm:
    """The collectives of this rank's tensor-parallel group, on the `fwd` / `bwd` wires."""

    def __init__(self, link: Link, fwd: Wire = EXACT, bwd: Wire = EXACT,
                 algorithm: str = "auto") -> None:
        self.link, self.wires = link, {"fwd": fwd, "bwd": bwd}
        self.size, self.rank = link.group.size, link.group.rank
        self._reduce = {d: AllReduce(link, algorithm, codec=w.codec,
                                     channel=w.channel if w.has_channel else None)
                        for d, w in self.wires.items()} if self.size > 1 else {}
        self._residuals: dict[str, ErrorFeedback] = {}

    def all_reduce(self, x: torch.Tensor, direction: str, site: str) -> torch.Tensor:
        """`x` summed over the group on `direction`'s wire (a new tensor; `x` unchanged)."""
        if self.size == 1:
            return x
        out = x.detach().to(torch.float32).contiguous().clone()
        reduce = self._reduce[direction]
        if self.wires[direction].error_feedback:
            self._feedback(f"{site}.{direction}", out).compensate(out.view(-1), 0, reduce.codec)
        return reduce(out).to(x.dtype)

    def _feedback(self, key: str, x: torch.Tensor) -> ErrorFeedback:
        memory = self._residuals.get(key)
        if memory is None or memory.flat.numel() != x.numel():
            memory = ErrorFeedback([(key, 0, x.numel())], x.numel(), x.device)
            self._residuals[key] = memory
        return memory

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"` (global ranks)."""
        return self.link.stats.as_dict(self.link.me) if self.size > 1 else {}

    def state_dict(self) -> dict[str, Any]:
        """The error-feedback residuals per site (empty without feedback)."""
        return {k: m.state_dict()[k] for k, m in self._residuals.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self._feedback(key, value).load_state_dict({key: value})

    def close(self) -> None:
        self.link.close()
