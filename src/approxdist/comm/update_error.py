"""What a lossy codec does to the update: the error of what a rank sent against its exact gradient.

AdaPrec's direct signal (seed 004; docs/adaprec.md). A rank's gradient g of a flat buffer
of named slices (a data-parallel bucket, a parameter-server shard) goes out as Q(g), or
with error feedback as Q(g + r). `UpdateError` sums, over the steps it watches, the
exact gradients G = sum g and the error E = sum (sent - g) of each slice; the relative
error of the update is ||E|| / ||G||. With error feedback E telescopes to r_0 - r_T, so
what feedback gives back later is counted as given back: it is the error of the
fed-back update, not of one message. Measured on the rank's own values before they
travel: no communication, one roundtrip of the codec per step (none with error feedback,
whose residual already holds x - Q(x)). Partial sums re-encoded inside an all-reduce are
not counted: the signal is what this rank's contribution loses.

A compressor is a contraction when ||Q(x) - x|| < ||x|| (Karimireddy et al. 2019, EF-SGD;
Stich et al. 2018): a relative error of 1 is no better than sending nothing, and a
sign-dropping codec is at about sqrt(2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from approxdist.comm.codecs import Codec

#: (name, offset, numel) of one named slice of a flat buffer
Slice = tuple[str, int, int]
#: per slice name: (||sent - exact||^2, ||exact||^2) summed over the watched steps, and
#: the slice's size
Sums = dict[str, tuple[float, float, int]]


class UpdateError:
    """The accumulated exact gradient and codec error of one flat buffer's named slices."""

    def __init__(self, layout: Sequence[Slice], numel: int, device: torch.device) -> None:
        self.layout = list(layout)
        self.exact = torch.zeros(numel, dtype=torch.float64, device=device)
        self.error = torch.zeros(numel, dtype=torch.float64, device=device)

    def observe(self, start: int, exact: torch.Tensor, sent: torch.Tensor | None) -> None:
        """Values `start:` of the buffer: this step's `exact` gradient and what was `sent`
        for it (None: sent exactly). Disjoint ranges may be observed from several threads."""
        stop = start + exact.numel()
        self.exact[start:stop] += exact.reshape(-1)
        if sent is not None:
            self.error[start:stop] += sent.reshape(-1).double() - exact.reshape(-1)

    def sums(self) -> Sums:
        """Per slice: (||E||^2, ||G||^2, its size)."""
        return {name: (float(self.error[o:o + n].square().sum()),
                       float(self.exact[o:o + n].square().sum()), n) for name, o, n in self.layout}


def sent_values(x: torch.Tensor, codec: Codec, residual: torch.Tensor | None) -> torch.Tensor:
    """What `codec` delivers for `x` (the values as encoded, error feedback's compensation
    included): `x - residual` when error feedback just left `residual = x - Q(x)`, else a
    roundtrip."""
    if residual is not None:
        return x - residual
    return codec.roundtrip(x.clone())


def merge(parts: Sequence[Mapping[str, tuple[float, float, int]]]) -> Sums:
    """Sums of several ranks or buffers, added per slice name (in the order given; a
    slice's size is its own, not added)."""
    out: Sums = {}
    for part in parts:
        for name, (e, g, n) in part.items():
            e0, g0, _ = out.get(name, (0.0, 0.0, n))
            out[name] = (e0 + e, g0 + g, n)
    return out


def relative(sums: Mapping[str, tuple[float, float, int]]) -> float:
    """The relative error of the whole update, ||E|| / ||G|| over every slice (0 when
    nothing was sent lossily, inf when an error came with no gradient)."""
    e = sum(v[0] for v in sums.values())
    g = sum(v[1] for v in sums.values())
    if e == 0.0:
        return 0.0
    return (e / g) ** 0.5 if g > 0 else float("inf")
