"""Cut an `nn.Sequential` of blocks into contiguous pipeline stages (seeds 000 and 002).

A `Partition` is a plain object: the block indices where stages 1..P-1 start. It comes
from an explicit split (`"3"` -> blocks [0:3], [3:]; `"3,7"` -> [0:3], [3:7], [7:]) or
from a pure solver that minimises the largest per-stage cost over a list of per-block
costs (parameter counts, or times from `pipeline.profiler`; torchgpipe's
balance_by_size / balance_by_time, with an exact dynamic program instead of a heuristic).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from approxdist.errors import unknown_name
from approxdist.pipeline.errors import PipelineError
from approxdist.text import comma_list

BALANCES = ("params", "time")


@dataclass(frozen=True)
class Partition:
    """Stage s runs blocks [bounds[s], bounds[s+1]) with bounds = (0, *boundaries, n)."""

    boundaries: tuple[int, ...]
    num_blocks: int

    def __post_init__(self) -> None:
        check_stage_count(len(self.boundaries) + 1, self.num_blocks)
        previous = 0
        for b in self.boundaries:
            if not 1 <= b <= self.num_blocks - 1:
                raise PipelineError(
                    f"split index {b} out of range for a model of {self.num_blocks} blocks; "
                    f"valid boundaries are 1..{self.num_blocks - 1}")
            if b <= previous:
                raise PipelineError(
                    f"split {_text(self.boundaries)!r} is not increasing ({b} after "
                    f"{previous}); list boundaries in increasing order, e.g. '3,7'")
            previous = b

    @property
    def num_stages(self) -> int:
        return len(self.boundaries) + 1

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """(first block, end block) per stage."""
        bounds = (0, *self.boundaries, self.num_blocks)
        return list(zip(bounds[:-1], bounds[1:]))

    def stage_of_block(self, block: int) -> int:
        return next(s for s, (a, b) in enumerate(self.ranges) if a <= block < b)

    def describe(self) -> str:
        return "; ".join(f"stage {s}: blocks [{a}:{b}]" for s, (a, b) in enumerate(self.ranges))


def _text(boundaries: Sequence[int]) -> str:
    return ",".join(map(str, boundaries))


def check_stage_count(num_stages: int, num_blocks: int) -> None:
    """P must be 1..num_blocks (every stage holds at least one block)."""
    if not 1 <= num_stages <= num_blocks:
        raise PipelineError(
            f"{num_stages} stages for a model of {num_blocks} blocks; use 1..{num_blocks} "
            "stages (each stage holds at least one block)")


def parse_split(spec: str, num_blocks: int) -> Partition:
    """`"3"` or `"3,7"`: the block indices where stages 1, 2, ... begin."""
    boundaries = comma_list(spec, int, PipelineError(
        f"split {spec!r} is not a comma-separated list of block indices; e.g. '3' or "
        f"'3,7' (valid indices 1..{num_blocks - 1})"))
    return Partition(boundaries, num_blocks)


def balance_costs(costs: Sequence[float], num_stages: int) -> Partition:
    """Contiguous partition minimising the largest stage cost (exact DP, O(P n^2)).

    Among equally good partitions the last cut is placed as early as possible (later
    stages take the slack, earlier ones hold fewer in-flight activations under 1F1B),
    so the result is deterministic. Costs must be finite and >= 0.
    """
    n = len(costs)
    check_stage_count(num_stages, n)
    bad = [c for c in costs if not 0 <= c < float("inf")]
    if bad:
        raise PipelineError(f"block cost {bad[0]!r} is not a finite number >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    # best[k][i]: smallest max-stage cost of blocks [0:i] in k stages; cut[k][i]: last start
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    boundaries, i = [], n
    for k in range(num_stages, 1, -1):
        i = cut[k][i]
        boundaries.append(i)
    return Partition(tuple(reversed(boundaries)), n)


def param_counts(model: nn.Module) -> list[int]:
    """Number of parameters in each block of an `nn.Sequential`."""
    return [sum(p.numel() for p in block.parameters()) for block in blocks_of(model)]


def blocks_of(model: nn.Module) -> nn.Sequential:
    if not isinstance(model, nn.Sequential):
        raise PipelineError(
            f"cannot cut a {type(model).__name__} into stages; pipeline models must be an "
            "nn.Sequential of blocks")
    if len(model) == 0:
        raise PipelineError("cannot cut an empty nn.Sequential into stages; give it blocks")
    return model


def plan_partition(model: nn.Module, *, num_stages: int | None = None,
                   split: str | None = None, balance: str | None = None,
                   block_times: Sequence[float] | None = None) -> Partition:
    """One front door: an explicit `split`, or `balance` ("params" | "time") over P stages.

    `balance="time"` needs `block_times` (from `pipeline.profiler.profile_times`), keeping
    this module free of timing. With a split, `num_stages` (if given) must agree.
    """
    n = len(blocks_of(model))
    if (split is None) == (balance is None):
        raise PipelineError("give exactly one of split (e.g. '3,7') or balance "
                            f"({' | '.join(BALANCES)})")
    if split is not None:
        plan = parse_split(split, n)
        if num_stages is not None and num_stages != plan.num_stages:
            raise PipelineError(
                f"split {split!r} makes {plan.num_stages} stages but {num_stages} were asked "
                f"for; give {num_stages - 1} boundaries")
        return plan
    if balance not in BALANCES:
        raise PipelineError(unknown_name("balance", str(balance), BALANCES))
    if num_stages is None:
        raise PipelineError(f"balance={balance!r} needs num_stages (1..{n})")
    if balance == "params":
        return balance_costs(param_counts(model), num_stages)
    if block_times is None or len(block_times) != n:
        got = "none" if block_times is None else len(block_times)
        raise PipelineError(f"balance='time' needs one time per block ({n}), got {got}; "
                            "measure them with pipeline.profiler.profile_times")
    return balance_costs(block_times, num_stages)


def stage_module(model: nn.Module, partition: Partition, stage: int) -> nn.Sequential:
    """The blocks of `stage` as an `nn.Sequential` sharing the model's modules and names."""
    blocks = blocks_of(model)
    if len(blocks) != partition.num_blocks:
        raise PipelineError(f"partition is for {partition.num_blocks} blocks but the model "
                            f"has {len(blocks)}; plan it for this model")
    if not 0 <= stage < partition.num_stages:
        raise PipelineError(f"stage {stage} out of range; valid stages are "
                            f"0..{partition.num_stages - 1}")
    first, end = partition.ranges[stage]
    items = list(blocks._modules.items())[first:end]  # keeps repeated blocks and names
    return nn.Sequential(OrderedDict(items))
