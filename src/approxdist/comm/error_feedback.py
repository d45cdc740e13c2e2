"""Error feedback (1-bit SGD, Seide et al. 2014; EF-SGD, Karimireddy et al. 2019): what a lossy
codec dropped from a gradient is added to the next step's, so nothing is lost for good.

With a lossy codec Q, a rank sends Q(g + r) instead of g and keeps the residual
r <- (g + r) - Q(g + r) — how seed 004's low-precision all-reduces keep accuracy, and
what DeepSpeed's 1-bit Adam and GRACE call the compressor's memory. Only this rank's own
contribution (the first encoding) is compensated; partial sums re-encoded inside an
all-reduce algorithm are not.

One implementation serves every user (`DataParallel`'s buckets, the DDP comm hook): the
residual of a flat buffer of *named* slices (a gradient bucket: one slice per
parameter) lives in one flat tensor, compensated in place fragment by fragment (several
communication threads may each take a fragment), and is saved and restored per name, so
it survives a change of bucket layout (DDP's rebuild after the first step, another
bucket size) and travels in checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from approxdist.comm.codecs import Codec
from approxdist.errors import ConfigError

#: (name, offset, numel) of one named slice of a flat buffer
Slice = tuple[str, int, int]


class ErrorFeedback:
    """Residual memory of one flat buffer laid out as named slices."""

    def __init__(self, layout: Sequence[Slice], numel: int | None = None,
                 device: torch.device | None = None) -> None:
        self.layout = list(layout)
        size = numel if numel is not None else max((o + n for _, o, n in self.layout), default=0)
        self.flat = torch.zeros(size, dtype=torch.float32, device=device or torch.device("cpu"))

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.layout]

    def compensate(self, x: torch.Tensor, start: int, codec: Codec) -> None:
        """x += r; r = x - Q(x), for `x` = the buffer's values from `start` on (in place:
        `x` then holds what to encode)."""
        r = self.flat[start:start + x.numel()]
        x.add_(r)
        codec.roundtrip(x, out=r)  # r = Q(x) (a bit mask or a cast for most codecs) ...
        torch.sub(x, r, out=r)     # ... then r = x - Q(x)
        torch.nan_to_num_(r, nan=0.0, posinf=0.0, neginf=0.0)  # never carry a non-finite error

    def residual_norm(self) -> float:
        return float(self.flat.double().norm())

    def reset(self) -> None:
        self.flat.zero_()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The residual of every named slice (a copy)."""
        return {name: self.flat[o:o + n].clone() for name, o, n in self.layout}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Residuals by name; a slice without a saved residual starts from zero."""
        for name, o, n in self.layout:
            if name not in state:
                continue
            value = state[name]
            if value.numel() != n:
                raise ConfigError(f"error-feedback residual of {name!r} has {value.numel()} "
                                  f"values but the parameter has {n}; was the checkpoint saved "
                                  f"from another model?")
            self.flat[o:o + n].copy_(value.reshape(-1))
