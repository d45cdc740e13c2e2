"""Data-parallel step-time benchmark: our engine vs torch DDP, measured in the same run.

Every rank builds one model and gives an identical copy to each *variant*:
* `local`: no communication at all (the lower bound of a step);
* `ddp`: `torch.nn.parallel.DistributedDataParallel` in `ddp_codec` (the reference row)
  and in each of `ddp_codecs`: fp32, fp16 (torch's `fp16_compress_hook`) or torch's
  `powerSGD_hook`; with an emulated link each pays the same link as our engine
  (`ddp_baselines.py`);
* `approxdist` per codec: `DataParallel` with the plan's options; a compressor
  (docs/compressors.md) sends vectors (biases, norms) in fp32, as `powerSGD_hook` does.
A step is forward, backward and optimizer step (SGD, momentum) on a fixed batch. Rounds
interleave the variants (`steps` timed steps each, after warm-up) so drift hits all
alike; the figure is the median step. Communication alone is timed per codec on a twin
engine (`reduce_gradients()` on the same gradients). Two shares of it are reported:

    hidden_comm_fraction = clamp(1 - t_blocked / t_comm, 0, 1)
    hidden_comm_fraction_wall = clamp((t_local + t_comm - t_step) / t_comm, 0, 1)

`t_blocked` is the median over steps of the time the training thread spent waiting for
communication inside the step (`DataParallel.comm_seconds`, the engine's `wait` spans),
on the rank that waited least: a rank that finishes backward early also waits for the
others to catch up (skew, not communication), while the last one to finish waits only
for what its backward did not hide. It is the direct measure of exposed communication. The wall
estimate charges everything that made the step slower than `local` to communication,
including the CPU the communication threads take from the compute on a machine with
fewer cores than threads (`interference_s` = t_step - t_local - t_blocked) and the
noise of the step; on a 2-core machine it can be 0 while nothing waits (docs).
`cpu_over_local_s` measures that CPU directly: the median over steps of the process's CPU
time in a step (every thread, gloo's included; the mean over ranks) minus the `local`
step's. Where it is as large as `interference_s` the step paid for CPU, not for waiting.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from approxdist.bench.stats import fastest, median, paired_ratio, slowest
from approxdist.bench.timing import timed
from approxdist.benchmarks.ddp_baselines import ddp_model
from approxdist.comm.codecs import get_codec
from approxdist.comm.compressors import check_compressor, is_compressor
from approxdist.config.schema import ModelConfig
from approxdist.data_parallel.module import DataParallel
from approxdist.data_parallel.threads import GIL_SWITCH_MS
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.models.bench_inputs import BenchInput, bench_input

INPUT_SHAPE = (3, 32, 32)
CLASSES = 10


@dataclass(frozen=True)
class DPBenchPlan:
    """What every rank measures."""

    model: str = "resnet20"
    hidden: int = 1536
    depth: int = 3
    batch_size: int = 32  # per rank
    codecs: tuple[str, ...] = ("fp32",)  # labels: a codec spec, `+ef` for error feedback
    error_feedback: bool = False
    link: str | None = None
    ddp_codec: str = "fp32"  # the reference DDP row (`ddp_baselines.DDP_FORMS`)
    ddp_codecs: tuple[str, ...] = ()  # more DDP rows, e.g. ("fp16", "powersgd:2")
    engine_options: dict[str, Any] = field(default_factory=dict)
    rounds: int = 5
    steps: int = 4
    warmup: int = 2


Step = Callable[[], None]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _inputs(plan: DPBenchPlan) -> BenchInput:
    return bench_input(plan.model, INPUT_SHAPE, CLASSES)


def _model(plan: DPBenchPlan) -> nn.Module:
    torch.manual_seed(0)
    inputs = _inputs(plan)
    return build_model(ModelConfig(name=plan.model, hidden=plan.hidden, depth=plan.depth),
                       inputs.shape, inputs.classes)


def _stepper(model: nn.Module, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor,
             loss: Loss) -> Step:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(wrapped(x), y).backward()
        opt.step()

    return step


def _early_stepper(dp: DataParallel, x: torch.Tensor, y: torch.Tensor, loss: Loss) -> Step:
    """Early forward: the engine applies the optimizer step bucket by bucket."""
    def step() -> None:
        loss(dp(x), y).backward()

    return step


def split_label(label: str) -> tuple[str, bool]:
    """`"bits:s0e2+2m0+ef"` -> (codec, error feedback): `+ef` asks for error feedback
    (a compressor's name is never split: `sign+ef` is one compressor)."""
    if label.endswith("+ef") and is_compressor(label) and not is_compressor(label[:-3]):
        return label, False
    return (label[:-3], True) if label.endswith("+ef") else (label, False)


def codec_label(text: str) -> str:
    """A codec spec, canonicalised (`SpecError` listing the valid forms), keeping a `+ef`
    suffix (error feedback for that codec), or a compressor spec (which keeps its own
    residual: no `+ef`); `bench dp` and `bench tp` take these."""
    codec, ef = split_label(text.strip())
    if is_compressor(codec):
        check_compressor(codec)
        if ef:
            raise ConfigError(f"{text}: a compressor keeps its own residual where its method "
                              f"has one (docs/compressors.md); write {codec}")
        return codec.lower()
    return get_codec(codec).spec + ("+ef" if ef else "")


def _engine(ctx: DistContext, model: nn.Module, label: str, plan: DPBenchPlan,
            opt: torch.optim.Optimizer | None = None, **extra: Any) -> DataParallel:
    codec, ef = split_label(label)
    options = {**plan.engine_options, **extra}
    if is_compressor(codec):  # vectors (biases, norms) in fp32, as torch's powerSGD_hook
        options["codec_rules"] = [f"{n}=fp32" for n, p in model.named_parameters()
                                  if p.dim() < 2]
    return DataParallel(model, ctx=ctx, codec=codec, link=plan.link, optimizer=opt,
                        error_feedback=ef or plan.error_feedback, **options)


def measure_rank(ctx: DistContext, plan: DPBenchPlan) -> dict[str, Any]:
    """Per-variant step times and per-codec communication times on this rank."""
    base = _model(plan)
    gen = torch.Generator().manual_seed(1 + ctx.rank)
    inputs = _inputs(plan)
    x, y = inputs.sample(plan.batch_size, gen)
    steps: dict[str, Step] = {}
    finish: dict[str, Step] = {}
    blocked: dict[str, Callable[[], float]] = {}
    m = copy.deepcopy(base)
    steps["local"] = _stepper(m, m, x, y, inputs.loss)
    closers = []
    for label in (plan.ddp_codec, *plan.ddp_codecs):
        m = copy.deepcopy(base)
        ddp, close = ddp_model(ctx, m, label, plan.link,
                               plan.engine_options.get("gil_switch_ms", GIL_SWITCH_MS))
        steps[_ddp_key(plan, label)] = _stepper(m, ddp, x, y, inputs.loss)
        closers.append(close)
    engines: dict[str, DataParallel] = {}
    for codec in plan.codecs:
        m = copy.deepcopy(base)
        early = bool(plan.engine_options.get("early_forward"))
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) if early else None
        dp = _engine(ctx, m, codec, plan, opt)
        engines[codec] = dp
        steps[f"approxdist:{codec}"] = _early_stepper(dp, x, y, inputs.loss) if early \
            else _stepper(m, dp, x, y, inputs.loss)
        finish[f"approxdist:{codec}"] = dp.wait
        blocked[f"approxdist:{codec}"] = functools.partial(getattr, dp, "comm_seconds")
    times, waits, cpu = _interleave(steps, finish, blocked, plan)
    comm = {codec: _comm_only(ctx, base, codec, plan, x, y) for codec in plan.codecs}
    n_steps = plan.warmup + plan.rounds * plan.steps
    sent = {codec: dp.bytes_sent // n_steps for codec, dp in engines.items()}
    for dp in engines.values():
        dp.close()
    for close in closers:
        close()
    return {"times": times, "blocked": waits, "comm": comm, "bytes": sent, "cpu": cpu}


def _ddp_key(plan: DPBenchPlan, label: str) -> str:
    """The reference DDP row is `ddp`; the others `ddp:<wire>`."""
    return "ddp" if label == plan.ddp_codec else f"ddp:{label}"


def _interleave(steps: dict[str, Step], finish: dict[str, Step],
                blocked: dict[str, Callable[[], float]], plan: DPBenchPlan
                ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Step times per variant; for engines the seconds each step (plus the round's final
    `finish`, charged to its last step) waited for communication; and per variant the CPU
    seconds the whole process (every thread: compute, communication, gloo's) used in each
    step and its `finish`."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    waits: dict[str, list[float]] = {name: [] for name in blocked}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for name, step in steps.items():
        for _ in range(plan.warmup):
            step()
        finish.get(name, _noop)()
    for _ in range(plan.rounds):
        for name, step in steps.items():
            probe = blocked.get(name)
            for i in range(plan.steps):
                w0 = probe() if probe else 0.0
                c0 = time.process_time()
                times[name].append(timed(step))
                if i == plan.steps - 1:
                    finish.get(name, _noop)()
                cpu[name].append(time.process_time() - c0)
                if probe:
                    waits[name].append(probe() - w0)
    return times, waits, cpu


def _noop() -> None:
    return None


def _comm_only(ctx: DistContext, base: nn.Module, codec: str, plan: DPBenchPlan,
               x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Time `reduce_gradients()` alone on a twin engine (no overlap, no early forward)."""
    m = copy.deepcopy(base)
    _inputs(plan).loss(m(x), y).backward()
    dp = _engine(ctx, m, codec, plan, early_forward=False, overlap=False, broadcast=False)
    grads = [p.grad.clone() if p.grad is not None else None for p in m.parameters()]
    out = []
    for i in range(plan.warmup + plan.rounds * plan.steps):
        for p, g in zip(m.parameters(), grads):
            if p.grad is not None and g is not None:
                p.grad.copy_(g)
        took = timed(dp.reduce_gradients)
        if i >= plan.warmup:
            out.append(took)
    dp.close()
    return out


def summarize(per_rank: list[dict[str, Any]], plan: DPBenchPlan) -> list[dict[str, Any]]:
    """One row per variant; a step's time is the slowest rank's."""
    def worst(key: str, name: str) -> list[float]:
        return slowest([r[key][name] for r in per_rank])

    def last_rank(key: str, name: str) -> list[float]:
        return fastest([r[key][name] for r in per_rank])

    def cpu(name: str) -> float:  # the median over steps of the ranks' mean
        per_step = zip(*(r["cpu"][name] for r in per_rank), strict=True)
        return median([sum(c) / len(c) for c in per_step])

    link = plan.link or "none"
    t_local = median(worst("times", "local"))
    c_local = cpu("local")
    t_ddp = median(worst("times", "ddp"))
    rows = [_row("local", "-", link, t_local, t_ddp, None, 0),
            _row("ddp", plan.ddp_codec, link, t_ddp, t_ddp, None, None)]
    for label in plan.ddp_codecs:
        times = worst("times", _ddp_key(plan, label))
        rows.append(_row("ddp", label, link, median(times), t_ddp, None, None,
                         paired_ratio_vs_ddp=paired_ratio(times, worst("times", "ddp"))))
    for codec in plan.codecs:
        name = f"approxdist:{codec}"
        t = median(worst("times", name))
        t_comm = median(worst("comm", codec))
        t_blocked = median(last_rank("blocked", name))
        hidden = _clamp(1.0 - t_blocked / t_comm) if t_comm > 0 else None
        wall = _clamp((t_local + t_comm - t) / t_comm) if t_comm > 0 else None
        rows.append(_row("approxdist", codec, link, t, t_ddp, hidden, per_rank[0]["bytes"][codec],
                         paired_ratio_vs_ddp=paired_ratio(worst("times", name), worst("times", "ddp")),
                         comm_only_s=t_comm, blocked_s=t_blocked,
                         hidden_comm_fraction_wall=wall,
                         interference_s=t - t_local - t_blocked,
                         cpu_over_local_s=cpu(name) - c_local))
    return rows


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def _row(engine: str, codec: str, link: str, t: float, t_ddp: float, hidden: float | None,
         nbytes: int | None, **extra: float | None) -> dict[str, Any]:
    return {"engine": engine, "codec": codec, "link": link, "median_step_s": t,
            "ratio_vs_ddp": t / t_ddp if t_ddp else None, "hidden_comm_fraction": hidden,
            "bytes_per_step_rank0": nbytes, **extra}
