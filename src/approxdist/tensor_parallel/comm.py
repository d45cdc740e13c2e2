"""The tensor-parallel group's collectives, each on its wire (codec, channel, error feedback).

`TPComm(link, fwd, bwd)` holds one `AllReduce`, `AllGather` and `ReduceScatter` per
direction on the link of the `tp` group: forward collectives (a row-parallel layer's
partial sums; sequence parallelism's gathers and reduce-scatters) travel on `fwd` (the
`tp_fwd` wire), backward ones (a column-parallel layer's input gradients) on `bwd`
(`tp_bwd`); every byte goes through the link layer (codec, bit errors, emulated link,
byte counts, trace events; DESIGN principle 2). A wire with error feedback keeps one
residual per site (the layer's path and direction; EF-SGD's memory of what the codec
dropped, `comm.error_feedback`) over the values this rank encodes (a reduce-scatter's
own chunk never is), reset when the site's shape changes (a last, smaller batch). One
rank alone is the identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from approxdist.comm.collectives import AllGather, AllReduce, ReduceScatter
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.comm.link import Link
from approxdist.config.wire import EXACT, Wire


class TPComm:
    """The collectives of this rank's tensor-parallel group, on the `fwd` / `bwd` wires."""

    def __init__(self, link: Link, fwd: Wire = EXACT, bwd: Wire = EXACT,
                 algorithm: str = "auto") -> None:
        self.link, self.wires = link, {"fwd": fwd, "bwd": bwd}
        self.size, self.rank = link.group.size, link.group.rank
        many = self.size > 1
        channels = {d: w.channel if w.has_channel else None for d, w in self.wires.items()}
        self._reduce = {d: AllReduce(link, algorithm, codec=w.codec, channel=channels[d])
                        for d, w in self.wires.items()} if many else {}
        self._gather = {d: AllGather(link, w.codec, channels[d])
                        for d, w in self.wires.items()} if many else {}
        self._scatter = {d: ReduceScatter(link, w.codec, channels[d])
                         for d, w in self.wires.items()} if many else {}
        self._residuals: dict[str, ErrorFeedback] = {}

    def all_reduce(self, x: torch.Tensor, direction: str, site: str) -> torch.Tensor:
        """`x` summed over the group on `direction`'s wire (a new tensor; `x` unchanged)."""
        if self.size == 1:
            return x
        out = self._outgoing(x, 0, direction, site, range(1))
        return self._reduce[direction](out).to(x.dtype)

    def all_gather(self, x: torch.Tensor, dim: int, direction: str, site: str) -> torch.Tensor:
        """Every rank's `x` concatenated along `dim` in rank order, on `direction`'s wire."""
        if self.size == 1:
            return x
        out = self._outgoing(x, dim, direction, site, range(1))
        return self._gather[direction](out).movedim(0, dim).to(x.dtype)

    def reduce_scatter(self, x: torch.Tensor, dim: int, direction: str,
                       site: str) -> torch.Tensor:
        """This rank's chunk along `dim` of `x` summed over the group, on `direction`'s wire
        (`dim` cut into one equal chunk per rank, in rank order)."""
        if self.size == 1:
            return x
        others = [i for i in range(self.size) if i != self.rank]  # chunks that are encoded
        out = self._outgoing(x, dim, direction, site, others, chunks=self.size)
        return self._scatter[direction](out).movedim(0, dim).to(x.dtype)

    def _outgoing(self, x: torch.Tensor, dim: int, direction: str, site: str,
                  encoded: range | list[int], chunks: int = 1) -> torch.Tensor:
        """A contiguous fp32 copy of `x` with `dim` first; on a wire with error feedback the
        `encoded` ones of its `chunks` equal chunks carry the site's residual."""
        out = x.detach().to(torch.float32).movedim(dim, 0).clone(
            memory_format=torch.contiguous_format)
        if self.wires[direction].error_feedback:
            flat, step = out.view(-1), out.numel() // chunks
            memory = self._feedback(f"{site}.{direction}", out)
            codec = self._reduce[direction].codec
            for i in encoded:
                memory.compensate(flat[i * step:(i + 1) * step], i * step, codec)
        return out

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
