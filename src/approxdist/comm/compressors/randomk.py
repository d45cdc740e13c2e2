"""Random-k sparsification with error feedback and a shared seed (Stich et al. 2018; Vogels et
al. 2019, whose baseline it is): every worker draws the same k indices from the same random
stream, so only the k fp32 values travel and they sum in compressed form (all-reduce
compatible): 4 bytes per kept value. Unscaled: the residual keeps what was not sent."""

from __future__ import annotations

import torch

from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.base import SumExchange, Summed, seeded
from approxdist.comm.compressors.sparse import kept


class RandomK(Summed):
    """Sends k = floor(ratio * n) values at indices drawn from a stream shared by all workers."""

    feedback = True
    per_sender = True

    def __init__(self, ratio: float, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__(f"randomk:{ratio:g}", shape, device)
        self.k = kept(ratio, self.numel)
        self.generator = seeded(seed)  # the same on every worker: the same indices

    def wire_bytes(self) -> int:
        return 4 * self.k

    def indices(self) -> torch.Tensor:
        """The next step's k indices (the first k of a random permutation)."""
        return torch.randperm(self.numel, generator=self.generator)[: self.k].to(self.device)

    def exchange(self, grad: torch.Tensor, world: int, out: torch.Tensor | None = None,
                 sent: torch.Tensor | None = None) -> SumExchange:
        x = self._flat(grad)
        idx = self.indices()
        values = x[idx]
        residual = self.state["residual"]
        residual.copy_(x)
        residual[idx] = 0.0
        if sent is not None:
            sent.zero_()[idx] = values
        total = yield values
        result = torch.zeros(self.numel, device=self.device) if out is None else out.view(-1).zero_()
        result[idx] = total / world
        return result.view(self.shape)

    def unpack(self, data: torch.Tensor) -> torch.Tensor:
        """One worker's values at the next indices of the shared stream (a receiver keeps a
        copy of the stream per sender, each drawn once per message)."""
        out = torch.zeros(self.numel, device=self.device)
        out[self.indices()] = typed(data, torch.float32).to(self.device)
        return out
