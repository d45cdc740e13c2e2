"""A stage's transfers: activations forward and gradients backward through the link layer (seed 000).

Each direction is a wire of its own (`config.wire.Wire`: the `fwd` wire's codec and
channel for the activations, `--fwd-codec`/`--fwd-channel`; the `bwd` wire's for the
gradients), so seed 000's experiment
(lossy forward, exact backward) and its future work (lossy backward too) are both one
flag away. Every byte goes through `comm.link.Link` (docs/architecture.md, the wires): codecs,
bit-error channels, bandwidth emulation and byte accounting apply as for all-reduce.

Receives are *sized*: at start-up the stages pass the per-sample shape of each boundary
down the pipeline once (`exchange_shapes`, one 80-byte link header per boundary), so
every later receive can be posted before its data exists (contract item 2 in
docs/pipeline.md) and no shape travels with the payloads.

Buffers are reused: the payload of each (direction, micro-batch) is encoded into, and
received into, the same bytes every step, and decoded into the same fp32 storage (a fresh
large allocation costs more than the copy, ANCHORS.md). This is why the adapter encodes
and decodes itself around the link's byte transfers (`isend_bytes` / `irecv_bytes`):
same codec, channel, shaping and accounting as `Link.isend` / `Link.irecv`, which take
no output buffers. An exact `fp32` direction with no channel is *raw*, as the all-reduce
wire's raw path: the tensor's own bytes are sent (kept alive until `wait_sends`) and
received straight into the fp32 storage the stage reads, so nothing is encoded, decoded
or copied (both ends know every size and the codec is checked once at start-up, so no
header is needed). With a recorder (docs/tracing.md) encoding and decoding are `encode` /
`decode` spans inside the executor's send and receive phases.

A rank that holds two neighbouring stages (ZB-V's chunks P-1 and P) hands their tensors
over in memory (`handover.Handover`, shared by the rank's transports).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.channel import Channel, get_channel
from approxdist.comm.codecs import Codec, Payload, get_codec
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.comm.link import Link
from approxdist.comm.transfer import SHAPE_WORDS, LinkStats, parse_header, shape_header
from approxdist.config.wire import Wire
from approxdist.pipeline.couriers import Courier
from approxdist.pipeline.handover import Handed, Handover
from approxdist.topology.dealing import Dealing
from approxdist.trace.phases import DECODE, ENCODE
from approxdist.trace.recorder import NULL_RECORDER, Recorder

Shape = tuple[int, ...]


class PendingRecv:
    """A posted sized receive; `wait()` returns the decoded fp32 tensor (non-finite values
    set to 0 and counted in `stats.nonfinite` when a channel is set, like `Link.irecv`)."""

    def __init__(self, handle: Any, out: torch.Tensor, direction: _Direction | None,
                 stats: LinkStats, rec: Recorder = NULL_RECORDER) -> None:
        self.handle, self.out, self.direction = handle, out, direction
        self.stats, self.rec = stats, rec

    def wait(self) -> torch.Tensor:
        data = self.handle.wait()
        d = self.direction
        if d is None:  # raw: the bytes landed in `out` itself
            return self.out
        with self.rec.span(DECODE):
            x = d.decode(Payload(data, self.out.shape), self.out)
            if d.channel is not None:
                x, bad = d.channel.guard(x)
                self.stats.nonfinite += bad
        return x


@dataclass
class _Direction:
    """This rank's codec instances (one to send, one to receive) and channel of one
    direction, and the seconds its encodes and decodes took (`codec_seconds`, charged to
    communication)."""

    send_codec: Codec
    recv_codec: Codec
    channel: Channel | None
    encode_s: float = 0.0
    decode_s: float = 0.0

    @property
    def raw(self) -> bool:
        """Exact fp32 with no channel: the values' own bytes travel (module docstring)."""
        return self.channel is None and self.send_codec.spec == "fp32"

    @classmethod
    def build(cls, wire: Wire, seed: int) -> _Direction:
        channel = get_channel(wire.channel if wire.has_channel else "none", seed)
        return cls(get_codec(wire.codec), get_codec(wire.codec),
                   None if channel.is_identity else channel)

    def encode(self, x: torch.Tensor, out: torch.Tensor) -> Payload:
        """`x` through the send codec, into `out` (`payload_nbytes` bytes) where it can."""
        t0, codec = time.perf_counter(), self.send_codec
        payload = codec.encode(x, out=out) if isinstance(codec, FramedCodec) else codec.encode(x)
        self.encode_s += time.perf_counter() - t0
        return payload

    def decode(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        """`payload` through the receive codec, into `out` (contiguous fp32) where it can."""
        t0, codec = time.perf_counter(), self.recv_codec
        x = codec.decode(payload, out=out) if isinstance(codec, FramedCodec) else codec.decode(payload)
        self.decode_s += time.perf_counter() - t0
        return x


class StageTransport:
    """Stage `stage` of `num_stages`: posts receives and sends to its neighbours over `link`.

    The link's group holds every rank of the pipeline in stage-major order; `dealing`
    names the member that handles a micro-batch at a neighbour stage (one replica per
    stage by default; replicated stages deal micro-batches round robin,
    `topology.dealing`); this rank is replica `replica` of its stage. `rec` records
    encoding and decoding.
    """

    def __init__(self, link: Link, stage: int, num_stages: int, fwd: Wire,
                 bwd: Wire, dealing: Dealing | None = None, replica: int = 0,
                 seed: int = 0, rec: Recorder = NULL_RECORDER,
                 courier: Courier | None = None, handover: Handover | None = None) -> None:
        self.link, self.stage, self.num_stages = link, stage, num_stages
        #: the rank's other stages' hand-over box (a peer at this rank's own slot)
        self.handover = handover if handover is not None else Handover()
        #: who posts the per-micro-batch sends and receives (seed 002's thread strategies)
        self.courier = courier if courier is not None else Courier(link)
        self.dealing = dealing if dealing is not None else Dealing.single(num_stages)
        self.replica, self.rec = replica, rec
        self.fwd = _Direction.build(fwd, seed * 1009 + 2 * stage)
        self.bwd = _Direction.build(bwd, seed * 1009 + 2 * stage + 1)
        self.in_shape: Shape = ()
        self.out_shape: Shape = ()
        self._out_shapes: dict[Shape, Shape] = {}  # input sample shape -> output's
        self._infer: Callable[[Shape], Shape] = lambda shape: shape
        self._pool = BufferPool(link.device)
        #: posted sends by (direction, micro-batch): link handles, courier futures (`wait()`)
        self._sends: list[tuple[tuple[str, int], Any]] = []
        self.send_seconds = 0.0
        #: buffers per direction an asynchronous stream cycles through (micro-batch n uses
        #: buffer n mod window; `schedule.stream_cut.buffer_window`); 0: one per micro-batch
        self.window = 0

    def _slot(self, m: int) -> int:
        return m % self.window if self.window else m

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def peer(self, stage: int, m: int) -> int:
        """The member of the link's group that handles micro-batch `m` at `stage`."""
        return self.dealing.slot(stage, m)

    def global_rank(self, stage: int, m: int) -> int:
        """The global rank that handles micro-batch `m` at `stage` (for messages)."""
        return self.link.global_rank(self.peer(stage, m))

    # -- start-up ---------------------------------------------------------------------
    def exchange_shapes(self, input_shape: Shape, infer: Callable[[Shape], Shape]) -> None:
        """Learn this stage's per-sample input shape from the previous stage, tell the next.

        `input_shape` is the sample shape of the data (used on stage 0); `infer` maps an
        input sample shape to this stage's output sample shape. Replica k of a stage
        hears from the upstream replica that handles micro-batch k and tells every
        downstream replica j whose micro-batch j it would send to.
        """
        self._infer = infer
        if self.is_first:
            self.in_shape = tuple(input_shape)
        elif self._local(self.stage - 1):
            self.in_shape = self.handover.box.pop(("shape", self.stage, 0))
        else:
            src = self.peer(self.stage - 1, self.replica)
            buf = self.link.irecv_bytes(src, SHAPE_WORDS * 8).wait()
            self.in_shape = tuple(parse_header(buf, self.link.global_rank(src))[1])
        if self.in_shape not in self._out_shapes:
            self._out_shapes[self.in_shape] = tuple(infer(self.in_shape))
        self.out_shape = self._out_shapes[self.in_shape]
        if not self.is_last and self._local(self.stage + 1):
            self.handover.box[("shape", self.stage + 1, 0)] = self.out_shape
        elif not self.is_last:
            header = shape_header(0, self.out_shape, self.link.device)
            below = range(self.dealing.replicas[self.stage + 1])
            sends = [self.link.isend_bytes(header, self.peer(self.stage + 1, j)) for j in below
                     if self.dealing.replica(self.stage, j) == self.replica]
            for handle in sends:
                handle.wait()

    def refresh_shapes(self, input_shape: Shape) -> None:
        """`exchange_shapes` again for a mini-batch whose per-sample shape may differ from
        the last (dynamic shapes, e.g. sequence lengths): every stage calls it before the
        mini-batch's first receive; stage 0 gives the inputs' shape. Each stage's output
        shape is inferred once per input shape."""
        self.exchange_shapes(input_shape, self._infer)

    # -- per micro-batch ----------------------------------------------------------------
    def post_recv_act(self, m: int, size: int) -> PendingRecv | Handed:
        """Post the receive of micro-batch m's activation (`size` samples) from stage - 1."""
        return self._recv("act", m, (size, *self.in_shape), self.stage - 1, self.fwd)

    def post_recv_grad(self, m: int, size: int) -> PendingRecv | Handed:
        """Post the receive of micro-batch m's output gradient (`size` samples) from stage + 1."""
        return self._recv("grad", m, (size, *self.out_shape), self.stage + 1, self.bwd)

    def _local(self, stage: int) -> bool:
        """Whether `stage` runs on this rank too (a chunk: the hand-over box, no link)."""
        return self.dealing.ranks is not None and self.peer(stage, 0) == self.link.rank

    def _recv(self, name: str, m: int, shape: Shape, stage: int,
              d: _Direction) -> PendingRecv | Handed:
        if self._local(stage):
            return self.handover.receipt((name, self.stage, m))
        numel = math.prod(shape)
        flat = self._pool.get(f"out-{name}", numel, torch.float32, index=self._slot(m))
        if d.raw:
            handle = self.courier.recv(self.peer(stage, m), flat.view(torch.uint8))
            return PendingRecv(handle, flat.view(shape), None, self.link.stats, self.rec)
        data = self._pool.get(f"recv-{name}", d.recv_codec.payload_nbytes(numel), torch.uint8,
                              index=self._slot(m))
        handle = self.courier.recv(self.peer(stage, m), data)
        return PendingRecv(handle, flat.view(shape), d, self.link.stats, self.rec)

    def send_act(self, m: int, x: torch.Tensor) -> None:
        self._send("act", m, x, self.stage + 1, self.fwd)

    def send_grad(self, m: int, g: torch.Tensor) -> None:
        self._send("grad", m, g, self.stage - 1, self.bwd)

    def _send(self, name: str, m: int, x: torch.Tensor, stage: int, d: _Direction) -> None:
        """Encode into this (direction, micro-batch)'s buffer, corrupt, post; the buffer is
        reused next step, after `wait_sends`."""
        if self._local(stage):
            self.handover.box[(name, stage, m)] = x.detach()
            return
        t0 = time.perf_counter()
        if d.raw:  # the link's op holds `x` until the send has left
            values = x.detach().to(torch.float32).contiguous().view(-1)
            self._sends.append(((name, m),
                                self.courier.send(self.peer(stage, m), values.view(torch.uint8))))
            self.send_seconds += time.perf_counter() - t0
            return
        buf = self._pool.get(f"send-{name}", d.send_codec.payload_nbytes(x.numel()), torch.uint8,
                             index=self._slot(m))
        with self.rec.span(ENCODE):
            payload = d.encode(x.detach(), buf)
            if d.channel is not None:
                payload = d.channel.corrupt(payload, d.send_codec)
        self._sends.append(((name, m), self.courier.send(self.peer(stage, m), payload.data)))
        self.send_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the courier's threads (the link is closed by its owner)."""
        self.courier.close()

    def wait_sends(self, only: Collection[tuple[str, int]] | None = None) -> None:
        """Wait until every posted send has left (end of a step, contract item 6), or only
        the sends of the (direction "act"/"grad", micro-batch) pairs in `only` (an
        asynchronous stream keeps a send pending until its receive is posted)."""
        if only is None:
            sends, self._sends = self._sends, []
        else:
            sends = [s for s in self._sends if s[0] in only]
            self._sends = [s for s in self._sends if s[0] not in only]
        for _, handle in sends:
            handle.wait()

    @property
    def codec_seconds(self) -> float:
        """Seconds spent encoding and decoding, both directions, since start."""
        return sum(d.encode_s + d.decode_s for d in (self.fwd, self.bwd))

    @property
    def decode_seconds(self) -> float:
        return self.fwd.decode_s + self.bwd.decode_s
