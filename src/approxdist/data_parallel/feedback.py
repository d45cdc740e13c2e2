"""Error feedback for lossy gradient codecs: what the wire dropped is added to the next step.

With a lossy codec Q, each rank sends Q(g + r) instead of g and keeps the residual
r <- (g + r) - Q(g + r) for the next step (1-bit SGD, Seide et al. 2014; EF-SGD,
Karimireddy et al. 2019; DeepSpeed 1-bit Adam), so no gradient component is lost for
good — how seed 004's low-precision all-reduces keep accuracy. Residuals are per
parameter name, so they survive a change of bucket layout and travel in checkpoints.

Only this rank's own contribution (the first encoding) is compensated; partial sums
re-encoded inside the all-reduce algorithm are not.

Same rule as `approxdist.comm.error_feedback.ErrorFeedback`, kept in one flat, in-place
buffer per bucket: fragments of a bucket are encoded concurrently on several threads
(each with its own codec instance), and residuals are saved per parameter so they
survive a change of bucket layout or fragment size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from approxdist.comm.codecs import Codec
from approxdist.errors import ConfigError


class Residuals:
    """One flat residual per bucket, addressed per parameter name for checkpoints."""

    def __init__(self, layout: Sequence[tuple[str, int, int]], numel: int,
                 device: torch.device) -> None:
        """`layout`: (name, offset, numel) of each parameter inside the flat bucket."""
        self.layout = list(layout)
        self.flat = torch.zeros(numel, dtype=torch.float32, device=device)

    def apply(self, x: torch.Tensor, start: int, codec: Codec) -> None:
        """x += r; r = x - Q(x), for the fragment `x` starting at `start` in the bucket."""
        r = self.flat[start:start + x.numel()]
        x.add_(r)
        codec.roundtrip(x, out=r)  # r = Q(x) (a bit mask or a cast for most codecs) ...
        torch.sub(x, r, out=r)     # ... then r = x - Q(x)
        torch.nan_to_num_(r, nan=0.0, posinf=0.0, neginf=0.0)  # never carry a non-finite error

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.flat[o:o + n].clone() for name, o, n in self.layout}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for name, o, n in self.layout:
            if name not in state:
                continue  # a parameter without saved residual starts from zero
            value = state[name]
            if value.numel() != n:
                raise ConfigError(f"error-feedback residual of {name!r} has {value.numel()} "
                                  f"values but the parameter has {n}; was the checkpoint saved "
                                  f"from another model?")
            self.flat[o:o + n].copy_(value.reshape(-1))
