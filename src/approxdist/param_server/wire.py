"""What a push and a pull put on the link: an 8-byte version word, then a flat shard.

A push (worker -> server) is the version of the parameters its gradient was computed on,
then the shard's flat gradient in the push codec, or, where the push wire names a
compressor, each parameter's compressed message (`param_server.compressed`); a reply (server -> worker) is the
server's version, then the shard's flat parameters in the pull codec. Both are sized
transfers: each end knows the shard's length, so no shape header travels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from approxdist.comm.channel import Channel, get_channel
from approxdist.comm.codecs import Codec, get_codec
from approxdist.comm.compressors import is_compressor
from approxdist.config.wire import Wire
from approxdist.param_server.compressed import check_push_compressor

VERSION_BYTES = 8


@dataclass(frozen=True)
class WireFormats:
    """The built codecs and channels of the `push` and `pull` wires (None: no bit errors);
    `compressor` is the push wire's compressor spec ("" where its codec carries pushes)."""

    push: Codec
    pull: Codec
    push_channel: Channel | None = None
    pull_channel: Channel | None = None
    compressor: str = ""

    @classmethod
    def of(cls, push: Wire, pull: Wire) -> WireFormats:
        """The parts of two wires (their specs checked: a bad one raises `SpecError`)."""
        return cls.build(push.codec, pull.codec,
                         get_channel(push.channel) if push.has_channel else None,
                         get_channel(pull.channel) if pull.has_channel else None)

    @classmethod
    def build(cls, push: str, pull: str, push_channel: Channel | None = None,
              pull_channel: Channel | None = None) -> WireFormats:
        """A push spec naming a codec or a compressor (checked: `param_server.compressed`),
        a pull codec, the channels built."""
        if not is_compressor(push):
            return cls(get_codec(push), get_codec(pull), push_channel, pull_channel)
        check_push_compressor(push, push_channel is not None)
        return cls(get_codec("fp32"), get_codec(pull), None, pull_channel, push.strip().lower())

    @property
    def push_spec(self) -> str:
        """What carries the pushes: the compressor, or the codec."""
        return self.compressor or self.push.spec


def version_word(version: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([version], dtype=torch.int64, device=device).view(torch.uint8)


def read_version(buf: torch.Tensor) -> int:
    return int(buf.view(torch.int64)[0].item())


def flat_grads(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """The gradients of `params` as one fp32 vector (zeros where a gradient is None)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params]).float()


def flat_values(params: Sequence[nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).float()


@torch.no_grad()
def load_flat(params: Sequence[nn.Parameter], flat: torch.Tensor, into_grad: bool = False) -> None:
    """Copy `flat` into the parameters; with `into_grad`, make their gradients views of
    `flat` instead (no copy: the caller hands `flat` over)."""
    at = 0
    for p in params:
        n = p.numel()
        chunk = flat[at:at + n].view_as(p).to(p.dtype)
        if into_grad:
            p.grad = chunk
        else:
            p.copy_(chunk)
        at += n
