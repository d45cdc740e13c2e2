"""One block's measured seconds and bytes: what `profiler.measure_blocks` gives and a profile file holds.

The one record of a block's costs for the partitioners (`pipeline.partition` by time, the
planner's solvers and cost model): forward and backward seconds per micro-batch, its
backward split in two as zero-bubble schedules run it (the input gradient `I` and the
weight gradients `W`; unknown in older and PipeDream profiles), what its backward adds
when accumulating into gradients that already exist, and the bytes it outputs, holds as
parameters and keeps for its backward. Validated on construction, so a measured block and
one read from a file are checked alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from approxdist.errors import DataError


@dataclass(frozen=True)
class BlockProfile:
    """One block: seconds per micro-batch and bytes (`stash_bytes`: the tensors autograd
    saved for its backward, parameters not counted; `acc_s`: what its backward adds when
    its parameters' gradients already exist, as every micro-batch of a step after a
    rank's first adds into them; `param_sizes`: each parameter tensor's bytes in
    registration order, as the data-parallel engine buckets them, summing to
    `param_bytes`, or empty where unknown; `input_s` and `weight_s`: the seconds of its
    split backward's `I` and `W` (`split_backward`) in a stage that is not the first, None
    where unknown: their sum may exceed `bwd_s` by what splitting costs)."""

    name: str
    fwd_s: float
    bwd_s: float
    out_bytes: int
    param_bytes: int
    stash_bytes: int
    acc_s: float = 0.0
    param_sizes: tuple[int, ...] = ()
    input_s: float | None = None
    weight_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DataError(f"block name = {self.name!r} must be a non-empty string")
        where = f"block {self.name!r}"
        for field in ("fwd_s", "bwd_s", "acc_s"):
            _seconds(where, field, getattr(self, field))
        if (self.input_s is None) != (self.weight_s is None):
            raise DataError(f"{where} gives input_s = {self.input_s!r} and weight_s = "
                            f"{self.weight_s!r}: give both halves of the split backward, or "
                            f"neither")
        for field in ("input_s", "weight_s"):
            if getattr(self, field) is not None:
                _seconds(where, field, getattr(self, field))
        for field in ("out_bytes", "param_bytes", "stash_bytes"):
            _byte_count(where, field, getattr(self, field))
        sizes = self.param_sizes
        if isinstance(sizes, list):  # as JSON gives it
            object.__setattr__(self, "param_sizes", sizes := tuple(sizes))
        if not isinstance(sizes, tuple):
            raise DataError(f"{where} param_sizes = {sizes!r} must be a list of each parameter "
                            "tensor's bytes (or empty where unknown)")
        for k, size in enumerate(sizes):
            _byte_count(where, f"param_sizes[{k}]", size)
        if sizes and sum(sizes) != self.param_bytes:
            raise DataError(f"{where} param_sizes sum to {sum(sizes)} bytes, not its "
                            f"param_bytes = {self.param_bytes}; list every parameter tensor "
                            "of the block, or none")

    @property
    def compute_s(self) -> float:
        """Forward plus backward seconds."""
        return self.fwd_s + self.bwd_s

    @property
    def split_known(self) -> bool:
        """Whether the profile measured the split backward (`input_s`, `weight_s`)."""
        return self.input_s is not None

    def scaled(self, factor: float) -> BlockProfile:
        """This block with every time (forward, backward, its halves, accumulating) x
        `factor`; sizes as they were."""
        return replace(self, fwd_s=self.fwd_s * factor, bwd_s=self.bwd_s * factor,
                       acc_s=self.acc_s * factor,
                       input_s=None if self.input_s is None else self.input_s * factor,
                       weight_s=None if self.weight_s is None else self.weight_s * factor)


def _seconds(where: str, field: str, value: Any) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise DataError(f"{where} {field} = {value!r} must be a finite number of seconds >= 0")


def _byte_count(where: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{where} {field} = {value!r} must be a whole number of bytes >= 0")
