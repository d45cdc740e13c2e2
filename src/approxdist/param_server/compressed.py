"""Compressors on parameter-server pushes (docs/compressors.md): a worker's compressors per
parameter of a shard, and a server's copies that unpack each worker's push and aggregate.

A worker sends, for each parameter of a shard in order, its compressor's one message
(`Compressor.message`: top-k's values and indices, QSGD's norm and codes, random-k's
values, ...), all of them in one sized transfer of bytes after the version word. The server
unpacks each push into the shard's flat gradient as it arrives and combines the gradients an
update applies with the compressor's own aggregation (`Compressor.aggregate`: their mean in
worker order, or signSGD's majority vote), so a sync server's update equals data
parallelism with the same compressor. Each worker keeps its compressors' state (residuals,
random streams, each from the run's seed and the parameter's name: `spec.Where`); the
server keeps only what unpacking draws from: a copy of random-k's shared index stream per
worker, which advances with that worker's pushes in every mode.

PowerSGD is refused: its workers' P must be summed and orthogonalised before any worker
can compute Q, a second round trip each step plus the averaged Q back for the warm start
and the residual, which one push and one reply per step do not carry (and an asynchronous
server has no sum over workers to orthogonalise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from approxdist.comm.compressors import Compressor, Where, check_compressor, get_compressor
from approxdist.comm.compressors.spec import COMPRESSORS
from approxdist.errors import SpecError


def check_push_compressor(spec: str, channel: bool) -> None:
    """A compressor the pushes can carry; `SpecError` naming the value and a fix otherwise
    (the caller prefixes the key or argument)."""
    check_compressor(spec)
    if spec.strip().lower().startswith("powersgd"):
        others = ", ".join(COMPRESSORS.get(n).form for n in COMPRESSORS if n != "powersgd")
        raise SpecError(f"PowerSGD needs a second round trip each step (the workers' P summed "
                        f"and orthogonalised before any worker computes Q, then the averaged "
                        f"Q back), which a push and its reply do not carry; use {others}, or "
                        f"powersgd on data parallelism (--parallel dp)")
    if channel:
        raise SpecError("a compressor with a push channel: a bit error in its indices or "
                        "scale would land anywhere in the update; drop the channel "
                        "(wire.push.channel, push_channel=) or use a codec")


def _build(spec: str, params: Sequence[nn.Parameter], names: Sequence[str], worker: int,
           device: torch.device, seed: int) -> list[Compressor]:
    """`worker`'s compressor of each parameter, its streams from the run's `seed` and the
    parameter's name (`Where`)."""
    return [get_compressor(spec, Where(tuple(p.shape), n, seed, worker, device))
            for p, n in zip(params, names)]


class PushCompressors:
    """One worker's compressors of one server's shard, one per parameter."""

    def __init__(self, spec: str, params: Sequence[nn.Parameter], names: Sequence[str],
                 worker: int, device: torch.device, seed: int = 0) -> None:
        self.params, self.names = list(params), list(names)
        self.comps = _build(spec, params, names, worker, device, seed)
        self.nbytes = sum(c.wire_bytes() for c in self.comps)

    def message(self) -> torch.Tensor:
        """Every parameter's message of this step's gradients (`.grad`; zeros where None)."""
        return torch.cat([c.message(p.grad if p.grad is not None else torch.zeros_like(p))
                          for c, p in zip(self.comps, self.params)])

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {n: c.state_dict() for n, c in zip(self.names, self.comps)}

    def load_state_dict(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """States by parameter name; a parameter without one keeps its fresh state."""
        for n, c in zip(self.names, self.comps):
            if n in state:
                c.load_state_dict(state[n])


class PushDecoders:
    """A server's copies of the workers' compressors of its shard: one set shared by every
    worker, or one per worker where unpacking draws from the sender's stream (random-k)."""

    def __init__(self, spec: str, params: Sequence[nn.Parameter], names: Sequence[str],
                 workers: int, device: torch.device, seed: int = 0) -> None:
        self.names = list(names)
        first = _build(spec, params, names, 0, device, seed)
        self.per_worker = first[0].per_sender if first else False
        self.copies = [first] + [_build(spec, params, names, w, device, seed)
                                 for w in range(1, workers if self.per_worker else 1)]
        for comps in self.copies:
            for c in comps:  # a receiver's copy sends nothing: no residual to keep
                c.state.pop("residual", None)
        self.nbytes = sum(c.wire_bytes() for c in first)
        self.sizes = [c.wire_bytes() for c in first]

    def unpack(self, worker: int, data: torch.Tensor) -> torch.Tensor:
        """The shard's flat fp32 gradient one push of `worker` stands for."""
        comps = self.copies[worker if self.per_worker else 0]
        parts, at = [], 0
        for c, size in zip(comps, self.sizes):
            parts.append(c.unpack(data[at:at + size]).reshape(-1))
            at += size
        return torch.cat(parts)

    def aggregate(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """What an update applies of the kept pushes (mean or vote: elementwise, so one
        call covers the flat shard)."""
        return self.copies[0][0].aggregate(grads)

    def state_dict(self) -> dict[str, Any]:
        """The per-worker streams (random-k); nothing where the copies are shared."""
        if not self.per_worker:
            return {}
        return {str(w): {n: c.state_dict() for n, c in zip(self.names, comps)}
                for w, comps in enumerate(self.copies)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for w, comps in enumerate(self.copies if self.per_worker else []):
            saved = state.get(str(w), {})
            for n, c in zip(self.names, comps):
                if n in saved:
                    c.load_state_dict(saved[n])
