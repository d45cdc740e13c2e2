"""The `[pipeline]` config section: stages, cut, micro-batches, schedule (seeds 000, 002).

How activations and their gradients travel is the `fwd` and `bwd` wires' (`[wire.fwd]`,
`[wire.bwd]`, `config/wire.py`): seed 000 sends the forward activations through a lossy
wire format, its future work the backward gradients too. Self-checks (ranges, fixed
choices, syntax) happen here; schedule names are checked against their registry where
the parts are built (`approxdist.train.parts`), and checks that need the model, the data
or the world size live in `approxdist.pipeline.runtime.check_run`.
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.config.checks import one_of
from approxdist.errors import ConfigError
from approxdist.text import comma_list

BALANCE_CHOICES = ("", "params", "time")
#: seed 002's communication-thread strategies (`pipeline.couriers`)
COMM_THREADS = ("inline", "per-message", "sa", "sra")
FUSE_CHOICES = ("auto", "all", "off")


def _check_split(split: str) -> None:
    """Syntax only: comma-separated increasing integers >= 1 (range needs the model)."""
    cuts = comma_list(split, int, ConfigError(f"pipeline.split = {split!r} is not a "
                                              f"comma-separated list of block indices; e.g. "
                                              f"'3' or '3,7'"))
    if any(c < 1 for c in cuts) or any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ConfigError(f"pipeline.split = {split!r} must be increasing block indices >= 1; "
                          f"e.g. '3' or '3,7'")


@dataclass(frozen=True)
class PipelineConfig:
    """How `--parallel pipeline` cuts and runs the model (GPipe; PipeDream-Flush; seed 000).

    `split` ("3", "3,7") names the first block of stages 1, 2, ...; otherwise `balance`
    ("params" by default, or "time") lets the partitioner choose. `recompute` keeps only
    each stage's inputs and recomputes the forward in backward (GPipe's rematerialisation).
    `fuse_accumulation` ("auto", "all", "off") adds each micro-batch's `nn.Linear` weight
    gradients into `.grad` inside the GEMM: "auto" for layers of 2^19 weights or more
    (docs/pipeline.md, "Fused gradient accumulation"). `replicas` (`--parallel hybrid`)
    gives each stage's replica count ([3, 1], or [2] for every stage; default 1).
    `placement` names the ranks in stage-major order (stage 0's replicas first; [2, 0, 1]:
    stage 0 on rank 2); it must name every rank once (the topology checks it).
    """

    stages: int = 2
    split: str = ""
    balance: str = ""
    microbatches: int = 4
    schedule: str = "gpipe"
    recompute: bool = False
    fuse_accumulation: str = "auto"
    placement: tuple[int, ...] = ()  # ranks, stage-major (default: 0, 1, 2, ...)
    replicas: tuple[int, ...] = ()   # ranks per stage: one count for all, or one per stage
    comm_threads: str = "inline"     # who posts sends/receives (seed 002 Table 4)
    dynamic_shapes: bool = False     # per-sample shapes may change between mini-batches

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ConfigError(f"pipeline.stages = {self.stages} must be >= 1 (one stage per rank)")
        if self.microbatches < 1:
            raise ConfigError(f"pipeline.microbatches = {self.microbatches} must be >= 1")
        if self.balance not in BALANCE_CHOICES:
            raise ConfigError(f"pipeline.balance = {self.balance!r} is not one of: params, time")
        one_of("pipeline", "comm_threads", self.comm_threads, COMM_THREADS)
        one_of("pipeline", "fuse_accumulation", self.fuse_accumulation, FUSE_CHOICES)
        if self.split and self.balance:
            raise ConfigError(f"pipeline.split = {self.split!r} and pipeline.balance = "
                              f"{self.balance!r}: give one of them, not both")
        if self.split:
            _check_split(self.split)
        if self.replicas and (len(self.replicas) not in (1, self.stages)
                              or min(self.replicas) < 1):
            raise ConfigError(f"pipeline.replicas = {list(self.replicas)} must be one count >= 1 "
                              f"for every stage or one per stage ({self.stages}), e.g. "
                              f"{[2] * self.stages} or [2]")
        if self.placement and len(self.placement) != sum(self.replica_counts):
            raise ConfigError(f"pipeline.placement = {list(self.placement)} names "
                              f"{len(self.placement)} rank(s) for {sum(self.replica_counts)} "
                              f"stage replica(s); give one rank per replica, stage 0's first")


    @property
    def replica_counts(self) -> tuple[int, ...]:
        """The replica count of every stage (1 each by default)."""
        if not self.replicas:
            return (1,) * self.stages
        return self.replicas * self.stages if len(self.replicas) == 1 else self.replicas

    @property
    def balance_method(self) -> str | None:
        """The partitioner's cost when no split is given ("params" by default)."""
        return None if self.split else (self.balance or "params")
