"""The config sections. Each is frozen and validates itself on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approxdist.config.adaprec import AdaPrecConfig
from approxdist.config.checks import non_negative, one_of, positive
from approxdist.config.dp import DPConfig
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.ps import PSConfig
from approxdist.config.tp import TPConfig
from approxdist.config.wire import WireConfig
from approxdist.errors import ConfigError

LR_SCHEDULES = ("constant", "step", "cosine", "grow")
SHORTCUTS = ("A", "B")


#: how each rank's threads are bound to cores (`launch/affinity.py`)
BIND_POLICIES = ("none", "rank", "row")


@dataclass(frozen=True)
class TrainConfig:
    """How the run is organised: epochs, parallelism, devices, logging, outputs."""

    #: the parallel mode, a name of `approxdist.train.mode.MODES` (checked there)
    parallel: str = "dp"
    world_size: int = 2
    #: the mesh of named axes (`pp=2,dp=2`; docs/architecture.md); "" = from the mode's keys
    mesh: str = ""
    epochs: int = 15
    seed: int = 0
    device: str = "auto"
    out: str = ""
    log_every: int = 10
    progress: bool = True
    threads: int = 0
    timeout_s: float = 120.0
    trace: bool = False  # record every rank's timeline -> trace.json (docs/tracing.md)
    #: a folder for TensorBoard event files of the run's records ("" = none; train/sink.py)
    tensorboard: str = ""
    #: slow ranks, `RANK:DELAY` or `random:P:DELAY` (train/straggler.py; any parallel mode)
    stragglers: tuple[str, ...] = ()
    #: what a run does once a step's loss is NaN or infinite: "stop" after that epoch (its
    #: evaluation and checkpoint are kept) or "continue"; both warn and record the step
    on_divergence: str = "stop"
    #: bind each rank's threads to cores: "none", "rank" or "row" (launch/affinity.py)
    bind_cores: str = "none"

    def __post_init__(self) -> None:
        one_of("train", "bind_cores", self.bind_cores, BIND_POLICIES)
        one_of("train", "on_divergence", self.on_divergence, ("stop", "continue"))
        one_of("train", "device", self.device, ("auto", "cpu", "cuda"))
        if self.world_size < 1:
            raise ConfigError(f"train.world_size = {self.world_size} must be >= 1")
        positive("train", "epochs", self.epochs)
        positive("train", "log_every", self.log_every)
        non_negative("train", "threads", self.threads)
        positive("train", "timeout_s", self.timeout_s)


@dataclass(frozen=True)
class DataConfig:
    """Which data set, where it lives, and how it is batched and augmented."""

    dataset: str = "digits"
    data_dir: str = ""
    batch_size: int = 64
    test_batch_size: int = 512
    augment: bool = True
    synthetic_shape: tuple[int, ...] = (3, 32, 32)
    synthetic_classes: int = 10
    synthetic_samples: int = 2048
    #: tokens per sample of the text data set (stdlib-text)
    seq_len: int = 64

    def __post_init__(self) -> None:
        positive("data", "batch_size", self.batch_size)
        positive("data", "test_batch_size", self.test_batch_size)
        positive("data", "synthetic_classes", self.synthetic_classes)
        positive("data", "synthetic_samples", self.synthetic_samples)
        positive("data", "seq_len", self.seq_len)
        if not self.synthetic_shape or any(s <= 0 for s in self.synthetic_shape):
            raise ConfigError(
                f"data.synthetic_shape = {list(self.synthetic_shape)} must be a non-empty list "
                "of positive sizes, e.g. [3, 32, 32]"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Model name (a registered one, or a factory `package.module:function` called with
    `args`) and the knobs of the model families."""

    name: str = "resnet20"
    shortcut: str = "A"
    width: int = 16
    hidden: int = 256
    depth: int = 3
    dropout: float = 0.0
    #: keyword arguments of a model factory `package.module:function` (`--set model.args.K=V`)
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        one_of("model", "shortcut", self.shortcut, SHORTCUTS)
        bad = [k for k in self.args if not k.isidentifier()]
        if bad:
            raise ConfigError(f"model.args key {bad[0]!r} is not a Python argument name; "
                              f"use e.g. --set model.args.hidden=64")
        positive("model", "width", self.width)
        positive("model", "hidden", self.hidden)
        positive("model", "depth", self.depth)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout = {self.dropout} must be in [0, 1)")


@dataclass(frozen=True)
class OptimConfig:
    """SGD with momentum and weight decay, and the learning-rate rule (per step)."""

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    schedule: str = "cosine"
    step_size: int = 1000
    gamma: float = 0.1
    warmup_epochs: float = 0.0
    scale_lr: bool = False
    base_batch: int = 256
    #: schedule "grow" (Smith et al. 2018): every `grow_every_epochs` epochs the global batch
    #: grows by 1/gamma instead of the rate decaying by gamma, up to `max_batch` (0: the
    #: training set), after which the rate decays
    grow_every_epochs: int = 0
    max_batch: int = 0
    #: where gradients arrive late (asynchronous pipeline schedules, async / SSP parameter
    #: servers): "auto" lowers momentum by the delay's implicit momentum, "off" keeps it
    #: (`approxdist.optim.delay`, checked in `train/check.py`; docs/pipeline.md, "The delay rule")
    delay_rule: str = "auto"

    def __post_init__(self) -> None:
        positive("optim", "lr", self.lr)
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"optim.momentum = {self.momentum} must be in [0, 1)")
        non_negative("optim", "weight_decay", self.weight_decay)
        one_of("optim", "schedule", self.schedule, LR_SCHEDULES)
        positive("optim", "step_size", self.step_size, " (iterations between LR drops)")
        positive("optim", "gamma", self.gamma)
        non_negative("optim", "warmup_epochs", self.warmup_epochs)
        positive("optim", "base_batch", self.base_batch)
        if self.nesterov and self.momentum == 0:
            raise ConfigError("optim.nesterov = true needs optim.momentum > 0")
        non_negative("optim", "grow_every_epochs", self.grow_every_epochs)
        non_negative("optim", "max_batch", self.max_batch)
        if self.schedule == "grow" and (self.grow_every_epochs < 1 or self.gamma >= 1):
            raise ConfigError(f"optim.schedule = 'grow' grows the batch by 1/gamma every "
                              f"optim.grow_every_epochs epochs: give grow_every_epochs >= 1 "
                              f"(got {self.grow_every_epochs}) and gamma < 1 (got "
                              f"{self.gamma}), e.g. --set optim.grow_every_epochs=3")


@dataclass(frozen=True)
class CommConfig:
    """What every transfer of the run goes through: the emulated link (a link spec, docs/collectives.md;
    the spec is parsed where the links are built, `approxdist.train.check`)."""

    link: str = ""


@dataclass(frozen=True)
class Config:
    """A whole run. Rules across sections depend on the parallel mode: its record checks
    them (`approxdist.train.mode`)."""

    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    dp: DPConfig = field(default_factory=DPConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    adaprec: AdaPrecConfig = field(default_factory=AdaPrecConfig)
    tp: TPConfig = field(default_factory=TPConfig)
    wire: WireConfig = field(default_factory=WireConfig)

