"""Asynchronous schedules (PipeDream, PipeDream-vsync, 2BW) against a single-process replay.

Each rank runs a stream of K mini-batches through the executor (one `train_step` per
mini-batch, an SGD optimiser with momentum and weight decay stepping where the schedule
updates), then a second stream (the next epoch: the pipeline drained in between). The
oracle replays the same schedule's data in one process: micro-batch n's loss is computed
through every stage with the weight version the schedule names for that stage
(`versions`), its gradient is kept per stage, and each stage's `Update`s apply the
gradients of their micro-batches, computed at `computed_at`, to the stage's newest
weights: 2BW's W(t+1) = W(t) - lr * grad f(W(t-1)), PipeDream's stashed gradient per
micro-batch. Every parameter after both streams and the loss of every step must agree
within 1e-5; a stage never holds more versions than the schedule's limit. The SGD steps
out of place into a free slot (`optim.step_into`: no weight copy at all) except in the
`in_place` cases, whose hooked SGD steps in place and each kept version is a copy. In the
`fuse="all"` cases the steps take the fused layers' weight gradients as their micro-batches'
rows, whose GEMMs run inside the step (with momentum and weight decay; in the `plain` case,
SGD without either, they write the step), and PipeDream's last stage, which keeps no
version from before a step, steps its weights in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F  # noqa: N812

from approxdist.config.pipeline import PipelineConfig
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.pipeline.microbatch import microbatch_sizes, split_batch
from approxdist.pipeline.partition import Partition, stage_module
from approxdist.pipeline.runtime import build_runtime
from approxdist.pipeline.schedule.action import Kind
from approxdist.pipeline.schedule.program import loss_weights_by_update
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.stream_cut import step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule
from tests.helpers.async_oracle import minibatch, oracle_model, sgd, snapshot, train_streams


@dataclass(frozen=True)
class Case:
    stages: int
    schedule: str
    microbatches: int
    minibatches: int
    batch: int = 12
    recompute: bool = False
    threads: str = "inline"
    fuse: str = "auto"  # "all": fused Linear accumulation into each version's .grad
    in_place: bool = False  # the optimiser steps in place and versions are copies
    plain: bool = False  # SGD without momentum and weight decay

    def config(self) -> PipelineConfig:
        return PipelineConfig(stages=self.stages, microbatches=self.microbatches,
                              schedule=self.schedule, recompute=self.recompute,
                              comm_threads=self.threads,
                              fuse_accumulation=self.fuse)


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        x0, _ = minibatch(case, 0, 0)
        rt = build_runtime(case.config(), oracle_model(), ctx, x0[:2], minibatches=case.minibatches)
        losses = train_streams(rt, case, case.minibatches, in_place=case.in_place,
                               optimizer=sgd(rt.module, plain=True) if case.plain else None)
        weights = rt.executor.stream.weights
        assert weights.out_of_place != case.in_place
        assert (weights.copies > 0) == case.in_place, f"{case}: {weights.copies} copies"
        steps = 2 * len(rt.executor.stream.program.takes)  # two streams
        rows = case.fuse == "all" and not case.in_place  # the tiny layers fuse with "all" only
        assert weights.row_steps == (steps if rows else 0), f"{case}: {weights.row_steps}"
        if case.schedule == "pipedream" and rt.transport.is_last and not case.in_place:
            assert weights.in_place_steps == steps, f"{case}: {weights.in_place_steps} in place"
        params = {n: p.detach().clone() for n, p in rt.module.named_parameters()}
        stage_bytes = sum(p.nelement() * p.element_size() for p in rt.module.parameters())
        out.append({"params": params, "losses": losses, "partition": rt.partition,
                    "peak": rt.executor.stream.weights.peak_bytes, "stage_bytes": stage_bytes})
        rt.close()
    return out


def _oracle(case: Case, partition: Partition) -> tuple[dict[str, torch.Tensor],
                                                      list[tuple[float, int]]]:
    """Every parameter after two streams, and each step's (summed loss, samples) on the
    last stage, replayed in one process from the schedule's versions and updates."""
    model = oracle_model()
    p, m, k = case.stages, case.microbatches, case.minibatches
    sched = build_async_schedule(case.schedule, p, m, k)
    stages = [stage_module(model, partition, s) for s in range(p)]
    opts = [sgd(s, plain=case.plain) for s in stages]
    forward_version = {(r, a.microbatch): sched.versions[(r, i)]
                       for r, actions in sched.order.items()
                       for i, a in enumerate(actions) if a.kind is Kind.FORWARD}
    step_items = _loss_items_per_step(sched)
    losses: list[tuple[float, int]] = []
    for epoch in range(2):
        snaps = [{0: snapshot(s)} for s in stages]
        grads: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in range(p)]
        done = [0] * p
        item_loss: dict[int, float] = {}
        data = [minibatch(case, epoch, b) for b in range(k)]
        sizes = {b * m + j: size for b in range(k)
                 for j, size in enumerate(microbatch_sizes(case.batch, m))}
        weights = loss_weights_by_update(sched, sizes)
        for n in range(k * m):
            xs, ys = (split_batch(t, m)[n % m] for t in data[n // m])
            leaves = [snaps[s][forward_version[(s, n)]] for s in range(p)]
            h = xs
            for s in range(p):
                h = functional_call(stages[s], leaves[s], (h,))
            loss = F.cross_entropy(h, ys)
            item_loss[n] = float(loss.detach()) * sizes[n]
            flat = [t for leaf in leaves for t in leaf.values()]
            got = torch.autograd.grad(loss * weights[n], flat)
            it = iter(got)
            for s in range(p):
                grads[s][n] = {name: next(it) for name in leaves[s]}
            for s in range(p):
                updates = sched.updates[s]
                while done[s] < len(updates) and all(i in grads[s] for i in updates[done[s]].items):
                    u = updates[done[s]]
                    for name, param in stages[s].named_parameters():
                        param.grad = sum(grads[s][i][name] for i in u.items)  # type: ignore[assignment]
                    opts[s].step()
                    opts[s].zero_grad(set_to_none=True)
                    snaps[s][u.version] = snapshot(stages[s])
                    done[s] += 1
        assert done == [len(sched.updates[s]) for s in range(p)]
        for items in step_items:
            losses.append((sum(item_loss[n] for n in items), sum(sizes[n] for n in items)))
    return {n: t.detach().clone() for n, t in model.named_parameters()}, losses


def _loss_items_per_step(sched: AsyncSchedule) -> list[list[int]]:
    last = sched.num_stages - 1
    ends = step_cuts(sched)[last]
    return [[a.microbatch for a in sched.order[last][lo:hi] if a.kind is Kind.FORWARD]
            for lo, hi in zip([0, *ends], ends)]


def _check(case: Case, ranks: list[dict[str, Any]]) -> None:
    params, losses = _oracle(case, ranks[0]["partition"])
    got = {name: t for r in ranks for name, t in r["params"].items()}  # stages keep the names
    assert got.keys() == params.keys()
    for name, t in params.items():
        torch.testing.assert_close(got[name], t, atol=1e-5, rtol=1e-5, msg=f"{case}: {name}")
    last = ranks[-1]["losses"]
    for step, ((loss, n), (want, want_n)) in enumerate(zip(last, losses)):
        assert n == want_n, f"{case}: step {step} ran {n} samples on the last stage, not {want_n}"
        assert loss == pytest.approx(want, rel=1e-5, abs=1e-6), f"{case}: step {step} loss"
    sched = build_async_schedule(case.schedule, case.stages, case.microbatches, case.minibatches)
    for s, r in enumerate(ranks):
        assert r["peak"] <= sched.version_limit[s] * r["stage_bytes"], f"{case}: stage {s}"


CASES_2 = [
    Case(2, "2bw", 2, 4),
    Case(2, "2bw", 3, 3, recompute=True, fuse="all"),  # the recomputed forward keeps rows
    Case(2, "pipedream", 2, 3, in_place=True),
    Case(2, "pipedream", 1, 5, fuse="all"),
    Case(2, "pipedream", 2, 3, fuse="all", plain=True),
    Case(2, "2bw", 2, 3, fuse="all"),
    Case(2, "pipedream-vsync", 2, 3, threads="sa"),
]
CASES_4 = [
    Case(4, "2bw", 4, 3, fuse="all"),
    Case(4, "pipedream", 2, 3, threads="per-message"),
    Case(4, "pipedream-vsync", 3, 2, in_place=True),
]


@pytest.mark.parametrize("stages,cases", [(2, CASES_2), (4, CASES_4)], ids=["2", "4"])
def test_every_parameter_matches_the_replayed_schedule(stages: int, cases: list[Case]) -> None:
    results = run_on_ranks(_run_cases, stages, cases, timeout_s=240)
    for i, case in enumerate(cases):
        _check(case, [results[r][i] for r in range(stages)])
