"""Top-k sparsification with error feedback (Aji and Heafield 2017; Lin et al., Deep Gradient
Compression, 2018; Stich et al. 2018): each worker sends its k largest-magnitude values
(fp32) and their int32 indices; the rest stays in the residual. Index sets differ between
workers, so the messages are gathered, not summed: 8 bytes per kept value."""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.base import Gathered
from approxdist.comm.compressors.sparse import kept


class TopK(Gathered):
    """Keeps the k = floor(ratio * n) values of largest magnitude (at least one)."""

    feedback = True

    def __init__(self, ratio: float, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__(f"topk:{ratio:g}", shape, device)
        self.k = kept(ratio, self.numel)

    def wire_bytes(self) -> int:
        return 8 * self.k

    def encode(self, x: torch.Tensor) -> Payload:
        idx = torch.topk(x.abs(), self.k, sorted=False).indices
        values = x[idx]
        data = torch.cat([values.view(torch.uint8), idx.to(torch.int32).view(torch.uint8)])
        return Payload(data, self.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        split = 4 * self.k
        values = typed(payload.data[:split], torch.float32)
        idx = typed(payload.data[split:], torch.int32).long()
        out = torch.zeros(self.numel, device=payload.data.device)
        out[idx] = values
        return out
