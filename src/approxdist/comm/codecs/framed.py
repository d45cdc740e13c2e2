"""Shared frame of every codec: header, metadata, packed codes, reused work buffers (seed 000)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.base import Codec, Payload
from approxdist.comm.codecs.header import HEADER_NBYTES, check_header, header_bytes
from approxdist.errors import CodecError


def as_fp32(x: torch.Tensor, spec: str) -> torch.Tensor:
    """`x` as fp32: fp32 passes through, other float dtypes are cast, anything else is refused."""
    if x.dtype == torch.float32:
        return x
    if x.is_floating_point():
        return x.float()
    raise CodecError(f"codec {spec!r} encodes floating-point tensors, got {x.dtype}; "
                     f"convert with x.float() first")


def typed(region: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """View a 1-D uint8 region as `dtype`; copies when the region is not aligned for it."""
    size = dtype.itemsize
    if region.storage_offset() % size != 0 or not region.is_contiguous():
        region = region.clone()
    return region.view(dtype)


#: values per chunk when torch runs one intra-op thread (see `FramedCodec.chunk`)
CHUNK = 1 << 20


class FramedCodec(Codec):
    """A codec whose payload is header + `meta_nbytes` of metadata + packed `code_bits` codes.

    Subclasses compute per-tensor metadata once (`_prepare` / `_load`) and then encode or
    decode chunks of values (a multiple of 8, so chunks start on whole bytes).

    `chunk`: None (default) picks by thread count. With one intra-op thread, chunks of
    `CHUNK` values keep the intermediates of the few passes in cache. With several, each
    torch op is a parallel region whose closing barrier can cost a scheduler tick when
    another process holds a core (a shared 2-core machine), so fewer, whole-tensor ops
    win. A codec whose fused kernel takes the tensor (`_fused_on`) needs no chunks: the
    kernel works in cache-sized blocks itself. 0 never chunks; a positive multiple of 8
    always uses that size.
    """

    family: str
    chunk: int | None = None

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.work = BufferPool()
        self._header: tuple[int, torch.Tensor] | None = None

    @property
    def bits_per_value(self) -> float:
        return float(self.code_bits)

    @property
    @abstractmethod
    def code_bits(self) -> int:
        """Width in bits of one value's code (the channel's unit)."""

    def meta_nbytes(self, numel: int) -> int:
        """Bytes of metadata between the header and the codes (a multiple of 4)."""
        return 0

    def codes_offset(self, numel: int) -> int:
        return HEADER_NBYTES + self.meta_nbytes(numel)

    def payload_nbytes(self, numel: int) -> int:
        return self.codes_offset(numel) + (numel * self.code_bits + 7) // 8

    def header(self, numel: int) -> torch.Tensor:
        """The 16 header bytes of a payload of `numel` values (CPU uint8, not to be
        modified: the one for the last `numel` asked is kept for the next call)."""
        cached = self._header
        if cached is None or cached[0] != numel:
            cached = self._header = (numel, header_bytes(self.family, self.spec, numel))
        return cached[1]

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> Payload:
        """Encode `x`; `out` (uint8, `payload_nbytes(x.numel())` bytes) avoids the allocation."""
        x = as_fp32(x, self.spec)
        n = x.numel()
        out = self._payload_buffer(n, x.device, out)
        out[:HEADER_NBYTES].copy_(self.header(n))
        start = self.codes_offset(n)
        flat = self._flat(x)
        state = self._prepare(flat, out[HEADER_NBYTES:start])
        for lo, hi in self._chunks(n, x.device):
            self._encode_chunk(flat[lo:hi], out[start + self._byte(lo): start + self._byte(hi)],
                               state)
        return Payload(out, x.shape)

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode into a new fp32 tensor, or into `out` (fp32, contiguous, same numel)."""
        n, data = payload.numel, payload.data
        check_header(data, self.family, self.spec, n, self.payload_nbytes(n))
        y = self._output_buffer(payload, out)
        self._each_chunk(data, y.view(-1), self._decode_chunk)
        return y

    def decode_add(self, payload: Payload, dest: torch.Tensor) -> None:
        """`dest += decode(payload)`, chunk by chunk through `_decode_add_chunk`."""
        n, data = payload.numel, payload.data
        if dest.dtype != torch.float32 or dest.numel() != n or not dest.is_contiguous() \
                or dest.device != data.device:
            super().decode_add(payload, dest)
            return
        check_header(data, self.family, self.spec, n, self.payload_nbytes(n))
        self._each_chunk(data, dest.view(-1), self._decode_add_chunk)

    def _each_chunk(self, data: torch.Tensor, flat: torch.Tensor,
                    per_chunk: Callable[[torch.Tensor, torch.Tensor, object], None]) -> None:
        """Load the payload's metadata, then call `per_chunk(codes, values, state)` for each
        chunk of the (header-checked) payload `data` and the flat fp32 `flat`."""
        n = flat.numel()
        start = self.codes_offset(n)
        state = self._load(data[HEADER_NBYTES:start])
        for lo, hi in self._chunks(n, flat.device):
            per_chunk(data[start + self._byte(lo): start + self._byte(hi)], flat[lo:hi], state)

    def _byte(self, index: int) -> int:
        return (index * self.code_bits + 7) // 8

    def _chunks(self, n: int, device: torch.device) -> list[tuple[int, int]]:
        step = self.chunk
        if step is None:
            step = CHUNK if torch.get_num_threads() == 1 and not self._fused_on(device) else 0
        step = step or max(n, 1)
        return [(lo, min(lo + step, n)) for lo in range(0, n, step)]

    def _fused_on(self, device: torch.device) -> bool:
        """True where one fused kernel call encodes or decodes a whole tensor on `device`."""
        return False

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous():
            return x.view(-1)
        return self.work.get("contig", x.numel(), torch.float32, x.device).copy_(x.reshape(-1))

    def _payload_buffer(self, n: int, device: torch.device,
                        out: torch.Tensor | None) -> torch.Tensor:
        size = self.payload_nbytes(n)
        if out is None:
            return torch.empty(size, dtype=torch.uint8, device=device)
        if out.dtype != torch.uint8 or out.shape != (size,) or out.device != device \
                or out.storage_offset() % 4 or not out.is_contiguous():
            raise CodecError(f"encode out= for {self.spec!r} must be a contiguous uint8 tensor "
                             f"of shape ({size},) on {device} starting 4-byte aligned, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
        return out

    def _output_buffer(self, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        device = payload.data.device
        if out is None:
            return torch.empty(payload.shape, dtype=torch.float32, device=device)
        if out.dtype != torch.float32 or out.numel() != payload.numel \
                or not out.is_contiguous() or out.device != device:
            raise CodecError(f"decode out= for {self.spec!r} must be a contiguous fp32 tensor "
                             f"of {payload.numel} values on {device}, got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
        return out

    def _prepare(self, x: torch.Tensor, meta: torch.Tensor) -> object:
        """Compute per-tensor metadata of flat `x`, write it to `meta`, return encoder state."""
        return None

    def _load(self, meta: torch.Tensor) -> object:
        """Read the metadata of a payload; return decoder state."""
        return None

    @abstractmethod
    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        """Pack the codes of flat contiguous fp32 `x` into the uint8 region `codes`."""

    @abstractmethod
    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        """Fill flat contiguous fp32 `y` from the uint8 region `codes`."""

    def _decode_add_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        """`y += ` the values of the uint8 region `codes` (decoded into a work buffer)."""
        tmp = self.work.get("decode_add", y.numel(), torch.float32, y.device)
        self._decode_chunk(codes, tmp, state)
        y.add_(tmp)
