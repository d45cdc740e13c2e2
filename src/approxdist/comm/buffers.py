"""Reusable work buffers: codecs, all-reduce hops and pipeline transfers reuse their memory.

A fresh large allocation costs more than the copy it holds (page faults; ANCHORS.md: a
256 MiB buffer ~100 ms), and a training step asks for the same sizes again and again.
`BufferPool.get` returns a contiguous view of the first `numel` elements of one flat
buffer per key, grown when a larger size is asked for, so a caller that sees the same
(or a smaller) size again allocates nothing. One pool serves one thread at a time.
"""

from __future__ import annotations

import torch


class BufferPool:
    """Flat buffers by (name, index, dtype, device), grown as needed."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self._bufs: dict[tuple[str, int, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device | None = None,
            index: int = 0) -> torch.Tensor:
        """The first `numel` elements of buffer (`name`, `index`) (contents undefined)."""
        dev = device if device is not None else self.device
        key = (name, index, dtype, dev)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=dev)
            self._bufs[key] = buf
        return buf[:numel]

    def clear(self) -> None:
        self._bufs.clear()
