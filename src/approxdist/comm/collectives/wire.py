"""Codec-aware messages for one all-reduce call: pack, unpack, receive in place (seed 001).

Rules every algorithm follows through this class, so that lossy codecs work and all
ranks end bitwise identical:

* **Reduce hops** send `pack(x)` (encode, then the channel corrupts the payload once),
  the receiver decodes and accumulates in fp32.
* **Distribution hops** (all-gather, broadcast, the return to folded ranks) move the
  bytes made once by `share(x)`; every rank, the owner included, ends with the decoded
  value of those same bytes. Forwarding never re-encodes, so codecs that are not
  idempotent (Table-N) stay identical too.
* `fp32` with no channel takes a raw path: the values' own bytes travel (no codec
  header) and receives land directly in the result tensor; nothing is copied.
* Zero-element messages are never sent (both ends know every size).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec, Payload
from approxdist.comm.collectives.base import (
    OnComm,
    PeerComm,
    Pending,
    Recv,
    Send,
    bounds,
    segment_count,
)

_EMPTY_BYTES = torch.empty(0, dtype=torch.uint8)
#: reduce steps move messages in pieces of this many fp32 bytes to overlap adds and transfers
SEGMENT_BYTES = 1 << 20
#: on an emulated link, a segment carries at least this many wire bytes (see `link_segment`)
LINK_SEGMENT_WIRE_BYTES = 256 << 10


def link_segment(bits_per_value: float) -> int:
    """Segment size (fp32 bytes) on an emulated link: `SEGMENT_BYTES`, or more for codecs
    under 8 bits per value so that every message still carries `LINK_SEGMENT_WIRE_BYTES`.

    Small segments keep the link busy while ranks encode, add and decode, but each message
    costs ~0.4 ms of CPU here (headers, posting, the shaper thread); with 4-bit codes a
    1 MiB segment is only 128 KiB on the wire (1 ms at 1 Gbit/s), so those fixed costs
    made the CPU, not the link, the bottleneck (16 MiB, 4 ranks: 35 -> 24 ms of CPU per
    rank with 2 MiB segments, 75 -> 55-65 ms per all-reduce).
    """
    wire_equivalent = int(LINK_SEGMENT_WIRE_BYTES * 32 / max(bits_per_value, 1.0))
    return max(SEGMENT_BYTES, wire_equivalent // 4 * 4)


class Wire(OnComm):
    """One rank's codec-aware view of a `PeerComm` for one collective call."""

    def __init__(self, comm: PeerComm, codec: Codec, channel: Channel | None,
                 scratch: BufferPool, device: torch.device, decode_into: bool = False) -> None:
        self.comm, self.codec, self.scratch, self.device = comm, codec, scratch, device
        self.channel = None if channel is None or channel.is_identity else channel
        self.exact = codec.lossless and self.channel is None
        self.raw = self.exact and codec.spec == "fp32"
        self.segment_bytes = SEGMENT_BYTES
        #: bytes a value takes on the raw path (4: fp32; 1: an all-gather of bytes)
        self.itemsize = 4
        self._nonfinite = [0]  # shared with sub-wires
        # whether codec.decode takes `out=` (no allocation per message); see `decodes_into`
        self._decode_into = decode_into

    @property
    def nonfinite(self) -> int:
        """Decoded values a channel's guard set to 0 (NaN/Inf), this call and sub-wires."""
        return self._nonfinite[0]

    def sub(self, comm: PeerComm) -> Wire:
        """The same codec and buffers over another comm (e.g. the folded core group)."""
        wire = Wire(comm, self.codec, self.channel, self.scratch, self.device,
                    self._decode_into)
        wire.segment_bytes = self.segment_bytes
        wire.itemsize = self.itemsize
        wire._nonfinite = self._nonfinite
        return wire

    # -- sizes and conversions --------------------------------------------------------------
    def nbytes(self, numel: int) -> int:
        """Bytes on the wire for `numel` values (0 for an empty message)."""
        if numel == 0:
            return 0
        return self.itemsize * numel if self.raw else self.codec.payload_nbytes(numel)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """The bytes for the values of `x` (a contiguous 1-D fp32 range)."""
        if x.numel() == 0:
            return _EMPTY_BYTES.to(x.device)
        if self.raw:
            return x.view(torch.uint8)
        payload = self.codec.encode(x)
        if self.channel is not None:
            payload = self.channel.corrupt(payload, self.codec)
        return payload.data

    def unpack(self, data: torch.Tensor, numel: int, out: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The fp32 values of a received message of `numel` values (into `out` if given,
        a contiguous fp32 tensor, when the codec can decode in place)."""
        if numel == 0:
            return torch.empty(0, dtype=torch.float32, device=data.device)
        if self.raw:
            return data.view(torch.float32)
        payload = Payload(data, torch.Size([numel]))
        if out is not None and self._decode_into:
            x = self.codec.decode(payload, out=out)  # type: ignore[call-arg]
        else:
            x = self.codec.decode(payload)
        if self.channel is not None:
            x, bad = self.channel.guard(x)
            self._nonfinite[0] += bad
        return x

    def share(self, x: torch.Tensor) -> torch.Tensor:
        """Encode `x` once for distribution and replace `x` by what receivers will decode."""
        data = self.pack(x)
        if not self.exact and x.numel():
            self.land(x, data)
        return data

    # -- receive targets -------------------------------------------------------------------
    def into(self, dest: torch.Tensor) -> int | torch.Tensor:
        """Receive target for bytes that will land in `dest` (in place on the raw path)."""
        return dest.view(torch.uint8) if self.raw and dest.numel() else self.nbytes(dest.numel())

    def land(self, dest: torch.Tensor, data: torch.Tensor) -> None:
        """Store received bytes (from `into(dest)`) as values in `dest`."""
        if dest.numel() == 0 or (self.raw and data.data_ptr() == dest.data_ptr()):
            return
        values = self.unpack(data, dest.numel(), out=dest)
        if values.data_ptr() != dest.data_ptr():
            dest.copy_(values)

    def block_targets(self, blocks: Sequence[torch.Tensor], which: Sequence[int]
                      ) -> list[torch.Tensor]:
        """Receive buffers for the bytes of `blocks[i]`, i in `which` (blocks of one size): the
        blocks' own memory on the raw path, else consecutive pieces of one reused buffer."""
        if self.raw:
            return [blocks[i].view(torch.uint8) for i in which]
        n = self.nbytes(blocks[which[0]].numel()) if which else 0
        buf = self.scratch.get("blocks", len(which) * n, torch.uint8, self.device)
        return [buf[j * n:(j + 1) * n] for j in range(len(which))]

    def keep(self, target: torch.Tensor, data: torch.Tensor) -> None:
        """Put received bytes `data` into `target`, their receive buffer, unless they are there
        already (a checked comm may hand out the bytes that came with a signature)."""
        if data.numel() and data.data_ptr() != target.data_ptr():
            target.copy_(data)

    def sum_into(self, dest: torch.Tensor, own: torch.Tensor, data: torch.Tensor) -> None:
        """`dest = own + values of data` in fp32 (one addition per value, as `accumulate`)."""
        if not dest.numel():
            return
        if self.raw:
            torch.add(own, data.view(torch.float32), out=dest)
        else:
            dest.copy_(own)
            self.accumulate(dest, data)

    def temp(self, numel: int, slot: int = 0) -> int | torch.Tensor:
        """A reusable receive buffer for a message of `numel` values (`slot` keeps several)."""
        n = self.nbytes(numel)
        if n == 0:
            return 0
        return self.scratch.get(f"wire{slot}", n, torch.uint8, self.device)

    def accumulate(self, dest: torch.Tensor, data: torch.Tensor) -> None:
        """`dest += values of data` in fp32."""
        if not dest.numel():
            return
        if self.raw:
            dest.add_(data.view(torch.float32))
        elif self.channel is None:  # fused where the codec can; a channel's guard needs the values
            self.codec.decode_add(Payload(data, dest.shape), dest)
        else:
            out = self.scratch.get("decoded", dest.numel(), torch.float32, self.device)
            dest.add_(self.unpack(data, dest.numel(), out=out))

    # -- messages ---------------------------------------------------------------------------
    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> _WirePending:
        """Post sends and receives together; empty messages are skipped (received empty)."""
        sent_keep = [i for i, (_, d) in enumerate(sends) if d.numel()]
        keep = [i for i, (_, r) in enumerate(recvs) if _size(r)]
        inner = self.comm.start([sends[i] for i in sent_keep], [recvs[i] for i in keep]) \
            if sent_keep or keep else None
        return _WirePending(inner, keep, sent_keep)

    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> list[torch.Tensor]:
        """`start`, wait for every receive, then for the sends; the received bytes in order."""
        pending = self.start(sends, recvs)
        out = [pending.recv(i) for i in range(len(recvs))]
        pending.finish()
        return out

    def segments(self, x: torch.Tensor) -> list[torch.Tensor]:
        """`x` cut into pieces of about `segment_bytes` fp32 bytes (the same cut on every rank)."""
        parts = segment_count(x.numel(), self.segment_bytes)
        return [x[a:b] for a, b in bounds(x.numel(), parts)] if parts > 1 else [x]

    def reduce_step(self, send_to: int | None, source: torch.Tensor, recv_from: int | None,
                    dest: torch.Tensor, *, shared: bool = False) -> None:
        """Send `source`'s values to `send_to` and add those from `recv_from` into `dest`.

        Both move in segments. The receives are posted first, then each segment is sent
        as soon as it is encoded (the link starts after one segment's encode, not the
        whole message's); each received segment is added as soon as it arrives,
        overlapping the additions (and decodes) with the transfer. With `shared=True`
        (`source` is `dest`, as in BRD) each sent segment is `share`d so both partners add
        the same decoded values.
        """
        send_parts = self.segments(source) if send_to is not None and source.numel() else []
        parts = self.segments(dest) if recv_from is not None and dest.numel() else []
        recvs: list[Recv] = []
        if parts:
            sizes = [self.nbytes(p.numel()) for p in parts]
            buf = self.scratch.get("reduce", sum(sizes), torch.uint8, self.device)
            at = 0
            for n in sizes:
                recvs.append((recv_from, buf[at:at + n]))  # type: ignore[arg-type]
                at += n
        if not send_parts and not recvs:
            return
        pending = self.comm.start([], recvs) if recvs else None
        sent = [self.comm.start([(send_to, self.share(s) if shared else self.pack(s))], [])
                for s in send_parts] if send_to is not None else []
        for i, part in enumerate(parts):
            assert pending is not None
            data = pending.recv(i)
            if shared:
                sent[i].finish()  # our bytes of this segment may still be on their way
            self.accumulate(part, data)
        if pending is not None:
            pending.finish()
        for p in sent:
            p.finish()


class _WirePending:
    """A batch posted through `Wire.start` (indices count the skipped empty messages too)."""

    def __init__(self, inner: Pending | None, keep: list[int], sent_keep: list[int]) -> None:
        self.inner = inner
        self.index = {i: j for j, i in enumerate(keep)}
        self.sent_index = {i: j for j, i in enumerate(sent_keep)}

    def recv(self, i: int) -> torch.Tensor:
        if i not in self.index:
            return _EMPTY_BYTES
        assert self.inner is not None
        return self.inner.recv(self.index[i])

    def sent(self, i: int) -> None:
        """Wait until send `i` has left."""
        if self.inner is not None and i in self.sent_index:
            self.inner.sent(self.sent_index[i])

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()


def decodes_into(codec: Codec) -> bool:
    """Whether `codec.decode` accepts `out=` (the FramedCodec family does)."""
    return "out" in inspect.signature(codec.decode).parameters


def _size(r: int | torch.Tensor) -> int:
    return int(r.numel()) if isinstance(r, torch.Tensor) else int(r)
