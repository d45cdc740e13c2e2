"""A bucket's per-tensor cost: members one at a time, in one kernel call a phase, and one tensor.

A model's weight matrices (every parameter of 2 or more dimensions, as a rule like
`*.bias=fp32` leaves them) form one `GatheredTogether` bucket of one compressor; each
timed call is one worker's whole exchange in a world of `workers`: its encode, then the
combine of `workers` copies of its payload (what the communication thread does a step
besides the collective). Three variants, interleaved, alternating the order every round:

* `per tensor`: each member's own `outgoing` and `combine` (the bucket path turned off);
* `bucket`: `packed_bucket.py`, one kernel call a phase for all members;
* `one tensor`: one compressor over all the values as one flat tensor (the floor: what
  the values alone cost, without any per-tensor work).

Before timing, the first two are checked to send the same bytes and return the same
result on the same gradient. Medians over the rounds; `x per tensor` is the paired ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from approxdist.bench.report import Column, ratio, render
from approxdist.bench.stats import median, paired_ratio
from approxdist.bench.timing import interleave
from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors import Compressor, Where, get_compressor
from approxdist.comm.compressors.gathered_together import GatheredTogether
from approxdist.comm.compressors.together import Member
from approxdist.errors import ConfigError

VARIANTS = ("per tensor", "bucket", "one tensor")


@dataclass
class Row:
    """One compressor's line (key names are part of the `--json` interface)."""

    codec: str
    tensors: int
    values: int
    per_tensor_ms: float
    bucket_ms: float
    one_tensor_ms: float
    bucket_vs_per_tensor: float
    bucket_vs_one_tensor: float


def matrices(model: nn.Module) -> list[torch.Size]:
    """The shapes of the model's parameters of 2 or more dimensions, in order."""
    return [p.shape for p in model.parameters() if p.dim() > 1]


def bucket(spec: str, shapes: list[torch.Size], packed: bool) -> GatheredTogether:
    """One bucket of `spec` over `shapes` (worker 0); `packed` False: one member at a time."""
    members, at = [], 0
    for i, shape in enumerate(shapes):
        name = f"m{i}"  # its own streams, as a run's parameters (`Where`)
        members.append(Member(name, at, shape, get_compressor(spec, Where(tuple(shape), name))))
        at += shape.numel()
    made = GatheredTogether(members)
    if made.packed is None:
        raise ConfigError(f"{spec} has no bucket path (bit-packed compressors only: sign+ef, "
                          f"signsgd, qsgd:<s>, terngrad)")
    if not packed:
        made.packed = None
    return made


def round_trip(comp: Compressor, grad: torch.Tensor, out: torch.Tensor | None,
               workers: int) -> tuple[Payload, torch.Tensor]:
    """One worker's exchange: (its payload, the combine of `workers` copies of it)."""
    started = comp.exchange(grad, workers, out)
    payload = next(started)
    try:
        started.send([payload] * workers)
    except StopIteration as stop:
        return payload, stop.value
    raise AssertionError("a gathered exchange has one round")


def same_bytes(spec: str, shapes: list[torch.Size], grad: torch.Tensor, workers: int) -> None:
    """The bucket path's payload and result equal the per-tensor path's (fresh compressors)."""
    (a, x), (b, y) = (round_trip(bucket(spec, shapes, packed), grad, None, workers)
                      for packed in (False, True))
    if not (torch.equal(a.data, b.data) and torch.equal(x.view(torch.int32), y.view(torch.int32))):
        raise AssertionError(f"{spec}: the bucket path's bytes differ from the per-tensor path's")


def measure(spec: str, shapes: list[torch.Size], workers: int, repeats: int) -> Row:
    """Time the three variants of `spec` on random gradients of `shapes`."""
    n = sum(s.numel() for s in shapes)
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0))
    same_bytes(spec, shapes, grad, workers)
    flat = get_compressor(spec, Where((n,)))
    comps = [bucket(spec, shapes, False), bucket(spec, shapes, True), flat]
    outs = [torch.empty(n) for _ in comps]
    ops: dict[str, Callable[[], object]] = {
        name: partial(round_trip, c, grad, out, workers)
        for name, c, out in zip(VARIANTS, comps, outs, strict=True)}
    t = interleave(ops, repeats, warmup=2, alternate=True)
    ms = {k: 1e3 * median(v) for k, v in t.items()}
    return Row(spec, len(shapes), n, ms["per tensor"], ms["bucket"], ms["one tensor"],
               paired_ratio(t["bucket"], t["per tensor"]),
               paired_ratio(t["bucket"], t["one tensor"]))


COLUMNS = (Column("codec", 10, "codec", left=True), Column("tensors", 8, "tensors"),
           Column("values", 9, "values"), Column("per tensor ms", 14, "per_tensor_ms", ".2f"),
           Column("bucket ms", 10, "bucket_ms", ".2f"),
           Column("one tensor ms", 14, "one_tensor_ms", ".2f"),
           Column("x per tensor", 13, show=ratio("bucket_vs_per_tensor", ".3f")),
           Column("x one tensor", 13, show=ratio("bucket_vs_one_tensor", ".3f")))


def table(rows: list[Row]) -> str:
    return render(COLUMNS, [r.__dict__ for r in rows])
