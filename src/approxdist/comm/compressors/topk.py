"""Top-k sparsification with error feedback (Aji and Heafield 2017; Lin et al., Deep Gradient
Compression, 2018; Stich et al. 2018): each worker sends its k largest-magnitude values
(fp32) and their int32 indices; the rest stays in the residual. Index sets differ between
workers, so the messages are gathered, not summed: 8 bytes per kept value.

Magnitudes are compared as the 31-bit patterns of the values (the value order; NaN above
infinity), ties go to the lower index, and the indices travel in increasing order, so
the payload is one set of bytes whoever selects it: on CPU a C radix select that also
writes the residual (`kernels/topk.c`), elsewhere the torch ops (its reference)."""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.base import Gathered
from approxdist.comm.compressors.sparse import kept
from approxdist.kernels.compress import CompressKernel, fused
from approxdist.kernels.slot import KernelSlot


class TopK(Gathered):
    """Keeps the k = floor(ratio * n) values of largest magnitude (at least one)."""

    feedback = True

    def __init__(self, ratio: float, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__(f"topk:{ratio:g}", shape, device)
        self.k = kept(ratio, self.numel)
        self.use_kernels = True  # False: always the torch ops (the reference)
        self._kernels: KernelSlot[CompressKernel] = KernelSlot()

    def wire_bytes(self) -> int:
        return 8 * self.k

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """The indices of the k largest magnitudes of flat `x`, increasing (torch ops)."""
        a = x.contiguous().view(torch.int32) & 0x7FFFFFFF
        t = torch.topk(a, self.k, sorted=False).values.min()
        above, ties = a > t, a == t
        need = self.k - int(above.sum())
        return (above | (ties & (ties.cumsum(0) <= need))).nonzero().view(-1)

    def _payload(self, device: torch.device) -> tuple[Payload, torch.Tensor, torch.Tensor]:
        """A new payload and its regions: k fp32 values, then k int32 indices."""
        data = torch.empty(8 * self.k, dtype=torch.uint8, device=device)
        split = 4 * self.k
        return Payload(data, self.shape), data[:split].view(torch.float32), \
            data[split:].view(torch.int32)

    def _kernel(self, x: torch.Tensor, *more: torch.Tensor) -> CompressKernel | None:
        return fused(self._kernels, self.use_kernels and x.numel() >= self.k, x, *more)

    def encode(self, x: torch.Tensor) -> Payload:
        payload, values, indices = self._payload(x.device)
        kernel = self._kernel(x)
        if kernel is None or not kernel.topk(x, self.k, values, indices):
            idx = self.select(x)
            values.copy_(x[idx])
            indices.copy_(idx)
        return payload

    def encode_feedback(self, x: torch.Tensor) -> Payload:
        residual = self.state["residual"]
        kernel = self._kernel(x, residual)
        if kernel is not None:
            payload, values, indices = self._payload(x.device)
            if kernel.topk(x, self.k, values, indices, residual):
                return payload
        return super().encode_feedback(x)

    def outgoing(self, grad: torch.Tensor, sent: torch.Tensor | None = None) -> Payload:
        """On CPU (and no `sent`), gradient plus residual is made inside the selection's first
        pass and the new residual written over the old: no separate sum pass."""
        x, residual = grad.detach().reshape(-1), self.state["residual"]
        kernel = None if sent is not None or x.numel() != self.numel \
            else self._kernel(x, residual)
        if kernel is not None:
            payload, values, indices = self._payload(x.device)
            if kernel.topk_feedback(x, self.k, values, indices, residual):
                return payload
        return super().outgoing(grad, sent)

    def _parts(self, payload: Payload) -> tuple[torch.Tensor, torch.Tensor]:
        split = 4 * self.k
        return typed(payload.data[:split], torch.float32), \
            typed(payload.data[split:], torch.int32).long()

    def decode(self, payload: Payload) -> torch.Tensor:
        values, idx = self._parts(payload)
        out = torch.zeros(self.numel, device=payload.data.device)
        out[idx] = values
        return out

    def decode_into(self, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            return self.decode(payload)
        values, idx = self._parts(payload)
        flat = out.view(-1).zero_()
        flat[idx] = values
        return flat
