"""Measures our tensor parallelism against `torch.distributed.tensor.parallel` on the same
model, plan, group and batch, and each wire format's step time on emulated links (seed 003).

`measure_rank` runs on every rank of the `tp` group (through `launch.spawn.run_on_ranks`).
Per case (one per `--link`) it builds one model from a seed and gives a copy to torch's
`parallelize_module` (`benchmarks.tp_torch`: the same plan's column- and row-parallel
layers) and one to `approxdist.TensorParallel` per wire *variant*: our fp32 wire, then
each codec on the forward wire (a row-parallel layer's partial sums), the backward one
(a column-parallel layer's input gradients) or both (`+ef`: with error feedback). Every
engine takes one SGD step on the same batch first, and torch's loss must equal our fp32
wire's within fp32 rounding (`LOSS_RTOL`): otherwise the two compute different things,
and the case is refused before anything is timed. Then every engine takes its turn in
each round (interleaved, alternating order, between barriers), `steps` mini-batches a
round. `link` shapes our transfers only: torch's collectives bypass the link layer, so
its row stays an unshaped baseline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from approxdist.api.tensor_parallel import TensorParallel
from approxdist.bench.baseline import LOSS_RTOL, BaselineMismatch, beyond_rounding
from approxdist.bench.stats import median, paired_ratio
from approxdist.bench.timing import Timing, interleave, repeat, timed
from approxdist.benchmarks.tp_torch import missing_styles, torch_tp
from approxdist.config.schema import ModelConfig
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.models import build_model
from approxdist.models.bench_inputs import BenchInput
from approxdist.topology import Mesh
from approxdist.topology.groups import make_groups

WIRES = ("fwd", "bwd", "both")
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Variant:
    """Our wires: `codec` on the forward wire, the backward one or both (the other fp32)."""

    codec: str = "fp32"
    wire: str = "both"
    error_feedback: bool = False

    @property
    def fwd_codec(self) -> str:
        return self.codec if self.wire in ("fwd", "both") else "fp32"

    @property
    def bwd_codec(self) -> str:
        return self.codec if self.wire in ("bwd", "both") else "fp32"

    @property
    def label(self) -> str:
        """`fp32`, `bf16@fwd`, `fp8-e5m2+ef@both`."""
        if self.codec == "fp32" and not self.error_feedback:
            return "fp32"
        return f"{self.codec}{'+ef' if self.error_feedback else ''}@{self.wire}"


FP32 = Variant()


def variants(codecs: Sequence[tuple[str, bool]], wires: Sequence[str]) -> tuple[Variant, ...]:
    """Our fp32 wire first (the baseline of every codec), then each (codec, error feedback)
    on each wire, in order, each once."""
    out = [FP32]
    for codec, ef in codecs:
        for wire in wires:
            v = FP32 if codec == "fp32" and not ef else Variant(codec, wire, ef)
            if v not in out:
                out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class TPBenchCase:
    """One configuration: model, input, plan, tp size, batch, our wire variants, link."""

    model: str
    input_shape: tuple[int, ...]
    plan: tuple[tuple[str, str], ...]
    tp: int = 2
    batch_size: int = 16
    hidden: int = 1024
    depth: int = 7
    classes: int = 10
    tokens: bool = False
    link: str = ""
    variants: tuple[Variant, ...] = (FP32,)

    @property
    def inputs(self) -> BenchInput:
        return BenchInput(self.input_shape, self.classes, self.tokens)

    @property
    def has_baseline(self) -> bool:
        """Whether torch can split the model as the plan says (it has no convolutions)."""
        return not missing_styles(dict(self.plan))


def case_model(case: TPBenchCase) -> nn.Module:
    """The case's whole model, the same on every rank and for every engine (seed 0)."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=case.model, hidden=case.hidden, depth=case.depth, dropout=0.0)
    return build_model(cfg, case.input_shape, case.classes)


def sgd_step(module: nn.Module, x: torch.Tensor, y: torch.Tensor,
             loss_fn: Loss) -> Callable[[], float]:
    """One mini-batch (forward, loss, backward) and an SGD step; returns the loss."""
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def step() -> float:
        loss = loss_fn(module(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def first_step_mismatch(first: Sequence[Mapping[str, float]]) -> str | None:
    """Why the engines may not be timed: torch's first loss differs from our fp32 wire's
    on some rank beyond `LOSS_RTOL` (None: they agree, or there is no torch engine)."""
    for rank, losses in enumerate(first):
        ours, theirs = losses.get(f"approxdist:{FP32.label}"), losses.get("torch")
        if ours is None or theirs is None:
            continue
        if beyond_rounding(ours, theirs):
            return (f"bench tp: the first step's loss on the same batch differs: torch "
                    f"{theirs:.7g}, approxdist (fp32 wire) {ours:.7g} on rank {rank} "
                    f"(beyond fp32 rounding, {LOSS_RTOL:g} relative), so the two do not "
                    f"compute the same model and their times would not compare; check the "
                    f"plan (--tp-plan): torch and approxdist must split the same layers")
    return None


def measure_case(ctx: DistContext, group: Group, case: TPBenchCase,
                 timing: Timing) -> dict[str, Any]:
    """Every engine's first loss, then (unless refused) its round times; our bytes sent."""
    model = case_model(case)
    x, y = case.inputs.sample(case.batch_size, torch.Generator().manual_seed(1))
    plan = dict(case.plan)
    ours = {v.label: TensorParallel(copy.deepcopy(model), plan=plan, group=group,
                                    fwd_codec=v.fwd_codec, bwd_codec=v.bwd_codec,
                                    error_feedback=v.error_feedback, link=case.link)
            for v in case.variants}
    steps = {}
    if case.has_baseline:
        steps["torch"] = sgd_step(torch_tp(copy.deepcopy(model), plan, group, ctx.device.type),
                                  x, y, case.inputs.loss)
    steps.update({f"approxdist:{label}": sgd_step(tp, x, y, case.inputs.loss)
                  for label, tp in ours.items()})
    first = {name: step() for name, step in steps.items()}
    refused = first_step_mismatch(group.all_gather_object(first))
    rounds: dict[str, list[float]] = {}
    if refused is None:
        for step in steps.values():
            timed(repeat(step, timing.warmup), group.barrier)
        rounds = interleave({name: repeat(step, timing.steps) for name, step in steps.items()},
                            timing.rounds, alternate=True, sync=group.barrier)
    sent = {label: tp.comm.link.stats.bytes_sent for label, tp in ours.items()}
    for tp in ours.values():
        tp.close()
    return {"first_loss": first, "refused": refused, "rounds": rounds, "bytes": sent,
            "steps_run": 1 + (timing.warmup + timing.rounds * timing.steps if rounds else 0)}


def measure_rank(ctx: DistContext, cases: list[TPBenchCase],
                 timing: Timing) -> list[dict[str, Any]]:
    """Entry point for `run_on_ranks`: every case in order on the `tp` group (the world)."""
    groups = make_groups(Mesh.of({"tp": cases[0].tp}), ctx)
    return [measure_case(ctx, groups["tp"], case, timing) for case in cases]


def summarize(cases: list[TPBenchCase], per_rank: list[list[dict[str, Any]]],
              steps: int) -> list[dict[str, Any]]:
    """Rows: median samples/s per engine (rank 0's clock, rounds between barriers), the
    ratio of medians to torch, `paired_ratio` (the median over rounds of torch's round
    time over ours in the same round), `vs_fp32` (the same against our fp32 wire), each
    engine's first-step loss and our bytes sent per step. `BaselineMismatch` if a case was
    refused."""
    rows = []
    for i, case in enumerate(cases):
        res = per_rank[0][i]
        if res["refused"]:
            raise BaselineMismatch(res["refused"])
        rounds = res["rounds"]
        rate = {name: steps * case.batch_size / median(ts) for name, ts in rounds.items()}
        torch_rounds, fp32_rounds = rounds.get("torch"), rounds[f"approxdist:{FP32.label}"]
        by_label = {v.label: v for v in case.variants}
        for name, ts in rounds.items():
            engine, _, label = name.partition(":")
            v = by_label.get(label, FP32)
            sent = res["bytes"].get(label)
            rows.append({
                "engine": engine, "model": case.model, "tp": case.tp,
                "batch_size": case.batch_size, "link": case.link or "none",
                "codec": v.codec, "wire": v.wire if engine == "approxdist" else "-",
                "fwd_codec": v.fwd_codec, "bwd_codec": v.bwd_codec,
                "error_feedback": v.error_feedback, "samples_per_s": rate[name],
                "median_step_s": median(ts) / steps,
                "ratio_vs_torch": rate[name] / rate["torch"] if "torch" in rate else None,
                "paired_ratio": (paired_ratio(torch_rounds, ts)
                                 if torch_rounds is not None else None),
                "vs_fp32": paired_ratio(fp32_rounds, ts) if engine == "approxdist" else None,
                "first_loss": res["first_loss"][name],
                "bytes_per_step": sent / res["steps_run"] if sent is not None else None})
    return rows
