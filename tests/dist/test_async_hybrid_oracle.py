"""Asynchronous schedules (PipeDream, 2BW) on replicated stages against a one-process replay.

Each rank is one replica of a stage of a hybrid run (`build_hybrid_runtime`: micro-batches
dealt round robin, the stage's gradients summed over its replica group by `DataParallel`).
It runs a stream of K mini-batches, one `train_step` each, with SGD + momentum + weight
decay stepping where the schedule steps, then a second stream (the next epoch).

The replay uses only the schedule's data: micro-batch n runs through every stage with the
version the schedule gives its forward on that stage (whichever replica ran it); the k-th
steps of a stage's replicas are one step of the stage, which applies the sum over its
micro-batches of (n's share of the step's samples) x (gradient of n's mean loss at n's
version): 2BW's W(t+1) = W(t) - lr * grad f(W(t-1)) over the whole mini-batch, PipeDream's
average over a round of r_s micro-batches, one per replica, each at its stashed version.
Every parameter after both streams and every step's loss (summed over the last stage's
replicas) agree within 1e-5; the replicas of a stage hold bitwise the same parameters,
whatever the codec; a replica never holds more versions than the schedule's limit.

With a bf16 all-reduce and error feedback the run is checked step by step instead (its
rounding compounds through later gradients, so no bound on the final parameters follows
from the format): every step's gradient, computed at the weight versions the run itself
held, lies within the all-reduce's bound of the exact sum, every step is SGD on the
gradient it applied, and every step's loss is the loss at the run's versions (1e-5).
The bound, per value: the replicas send x_i = g_i + r_i (r_i their error-feedback
residual) and the all-reduce adds at most (N + 2) u sum_i |x_i| (docs/collectives.md,
u = 2^-8); the residuals add sum_i |r_i| more, and each |r_i| <= u |x_i| of the step
before, so R(j+1) = u (M(j) + R(j)), R(0) = 0, with M(j) = sum_n w_n |g_n| over the step's
micro-batches (>= sum_i |g_i| whatever replica ran which micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F  # noqa: N812

from approxdist.config.loader import build_config
from approxdist.hybrid import build_hybrid_runtime
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.pipeline.microbatch import microbatch_sizes, split_batch
from approxdist.pipeline.partition import stage_module
from approxdist.pipeline.schedule.action import Kind
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.stream_cut import step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule
from approxdist.topology import Mesh
from approxdist.topology.dealing import Dealing
from approxdist.topology.groups import make_groups
from tests.helpers.async_oracle import (
    RecordingSGD,
    minibatch,
    oracle_model,
    sgd,
    snapshot,
    train_streams,
)
from tests.helpers.collective_oracles import RELATIVE

#: fp32: the replay adds the micro-batches' gradients in another order than the stages
FP32 = 1e-5
#: bf16's unit roundoff: round to nearest with 8 significant bits
BF16 = RELATIVE["bf16"][0]


@dataclass(frozen=True)
class Case:
    replicas: tuple[int, ...]
    schedule: str
    microbatches: int
    minibatches: int
    batch: int = 12
    threads: str = "inline"
    fuse: str = "auto"
    recompute: bool = False
    dp: tuple[tuple[str, Any], ...] = ()  # [dp] keys of the replica all-reduce
    grad: tuple[tuple[str, Any], ...] = ()  # its gradient wire's keys

    @property
    def lossy(self) -> bool:
        return dict(self.grad).get("codec", "fp32") != "fp32"

    def sections(self) -> dict[str, dict[str, Any]]:
        return {"train": {"parallel": "hybrid", "world_size": sum(self.replicas), "seed": 0},
                "pipeline": {"stages": len(self.replicas), "replicas": list(self.replicas),
                             "schedule": self.schedule, "microbatches": self.microbatches,
                             "comm_threads": self.threads, "fuse_accumulation": self.fuse,
                             "recompute": self.recompute},
                "dp": {"bucket_mb": 0.0005, "first_bucket_mb": 0.0002, **dict(self.dp)},
                "wire": {"grad": dict(self.grad)}}

    def build(self) -> AsyncSchedule:
        return build_async_schedule(self.schedule, len(self.replicas), self.microbatches,
                                    self.minibatches, dealing=Dealing(self.replicas))


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        cfg = build_config(case.sections())
        groups = make_groups(Mesh.stages(len(case.replicas), case.replicas), ctx,
                             lanes={("dp",): cfg.dp.threads + 2})
        x0, _ = minibatch(case, 0, 0)
        rt = build_hybrid_runtime(cfg.pipeline, cfg.dp, cfg.wire, oracle_model(), ctx, groups,
                                  x0[:2],
                                  link=cfg.comm.link, seed=cfg.train.seed,
                                  minibatches=case.minibatches)
        opt = RecordingSGD(rt.module)
        losses = train_streams(rt, case, case.minibatches, optimizer=opt)
        out.append({"steps": opt.steps if case.lossy else [],
                    "slot": rt.executor.stream.rank, "stage": rt.stage, "last": rt.transport.is_last,
                    "params": {n: p.detach().clone() for n, p in rt.module.named_parameters()},
                    "losses": losses, "partition": rt.partition,
                    "peak": rt.executor.stream.weights.peak_bytes,
                    "stage_bytes": sum(p.nelement() * p.element_size()
                                       for p in rt.module.parameters()),
                    "synced": rt.grad_sync is not None})
        rt.close()
    return out


def stage_steps(sched: AsyncSchedule, stage: int) -> list[list[int]]:
    """The micro-batches of each step of `stage`: the k-th steps of all its replicas."""
    per_slot = [sched.updates[slot] for slot in sched.slots_of(stage)]
    assert len({len(steps) for steps in per_slot}) == 1, "replicas step in lockstep"
    return [sorted(n for u in steps for n in u.items) for steps in zip(*per_slot)]


def _forward_versions(sched: AsyncSchedule) -> dict[tuple[int, int], int]:
    """(stage, micro-batch) -> the version of the stage its forward ran at."""
    return {(sched.stage_of(r), a.microbatch): sched.versions[(r, i)]
            for r, actions in sched.order.items()
            for i, a in enumerate(actions) if a.kind is Kind.FORWARD}


def _sizes(case: Case) -> dict[int, int]:
    """The samples of every micro-batch of a stream."""
    m = case.microbatches
    return {b * m + j: size for b in range(case.minibatches)
            for j, size in enumerate(microbatch_sizes(case.batch, m))}


def _item(case: Case, epoch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch `n` of stream `epoch`."""
    m = case.microbatches
    x, y = minibatch(case, epoch, n // m)
    return split_batch(x, m)[n % m], split_batch(y, m)[n % m]


def _through(stages: list[nn.Sequential], leaves: list[dict[str, torch.Tensor]],
             x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[dict[str, torch.Tensor]]]:
    """One micro-batch's mean loss through every stage at the parameters `leaves` (one dict
    a stage), and its gradient on each stage."""
    h = x
    for stage, leaf in zip(stages, leaves):
        h = functional_call(stage, leaf, (h,))
    loss = F.cross_entropy(h, y)
    got = iter(torch.autograd.grad(loss, [t for leaf in leaves for t in leaf.values()]))
    return float(loss.detach()), [{name: next(got) for name in leaf} for leaf in leaves]


def _oracle(case: Case, ranks: list[dict[str, Any]]) -> tuple[dict[str, torch.Tensor],
                                                             list[tuple[float, int]]]:
    model = oracle_model()
    sched = case.build()
    p = len(case.replicas)
    stages = [stage_module(model, ranks[0]["partition"], s) for s in range(p)]
    opts = [sgd(s) for s in stages]
    forward_version, sizes = _forward_versions(sched), _sizes(case)
    steps = [stage_steps(sched, s) for s in range(p)]
    losses: list[tuple[float, int]] = []
    for epoch in range(2):
        snaps = [{0: snapshot(s)} for s in stages]
        grads: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in range(p)]
        done = [0] * p
        item_loss: dict[int, float] = {}
        for n in range(case.minibatches * case.microbatches):
            leaves = [snaps[s][forward_version[(s, n)]] for s in range(p)]
            loss, got = _through(stages, leaves, *_item(case, epoch, n))
            item_loss[n] = loss * sizes[n]
            for s in range(p):
                grads[s][n] = got[s]
            for s in range(p):
                while done[s] < len(steps[s]) and all(i in grads[s] for i in steps[s][done[s]]):
                    items = steps[s][done[s]]
                    total = sum(sizes[i] for i in items)
                    for name, param in stages[s].named_parameters():
                        param.grad = sum(grads[s][i][name] * (sizes[i] / total)  # type: ignore[assignment]
                                         for i in items)
                    opts[s].step()
                    opts[s].zero_grad(set_to_none=True)
                    done[s] += 1
                    snaps[s][done[s]] = snapshot(stages[s])
        assert done == [len(x) for x in steps]
        for items in _loss_items_per_step(sched):
            losses.append((sum(item_loss[n] for n in items), sum(sizes[n] for n in items)))
    return {n: t.detach().clone() for n, t in model.named_parameters()}, losses


def _stepwise(case: Case, ranks: list[dict[str, Any]]) -> tuple[dict[str, torch.Tensor],
                                                               list[tuple[float, int]]]:
    """A run with a bf16 all-reduce and error feedback, step by step (the module's
    docstring): its final parameters once every step has passed, and every step's loss at
    the run's versions."""
    sched = case.build()
    p = len(case.replicas)
    stages = [stage_module(oracle_model(), ranks[0]["partition"], s) for s in range(p)]
    run = [next(r for r in ranks if r["stage"] == s)["steps"] for s in range(p)]
    steps = [stage_steps(sched, s) for s in range(p)]
    states = [[{n: t.detach().clone() for n, t in stages[s].named_parameters()},
               *(after for _, after in run[s])] for s in range(p)]
    for s in range(p):  # every step is SGD on the gradient it applied
        assert len(run[s]) == 2 * len(steps[s]), (case, s, len(run[s]))
        opt = sgd(stages[s])
        for t, (applied, after) in enumerate(run[s]):
            for name, param in stages[s].named_parameters():
                param.grad = applied[name]
            opt.step()
            for name, param in stages[s].named_parameters():
                assert torch.equal(param.detach(), after[name]), (case, s, t, name)
    forward_version, sizes = _forward_versions(sched), _sizes(case)
    residual: list[dict[str, torch.Tensor]] = [{} for _ in range(p)]  # R(j) per value
    losses: list[tuple[float, int]] = []
    rounded = False  # did the wire change a replicated stage's gradient?
    for epoch in range(2):
        grads: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in range(p)]
        item_loss: dict[int, float] = {}
        for n in range(case.minibatches * case.microbatches):
            leaves = [{name: t.clone().requires_grad_(True) for name, t in
                       states[s][epoch * len(steps[s]) + forward_version[(s, n)]].items()}
                      for s in range(p)]
            loss, got = _through(stages, leaves, *_item(case, epoch, n))
            item_loss[n] = loss * sizes[n]
            for s in range(p):
                grads[s][n] = got[s]
        for s, count in enumerate(case.replicas):
            for j, items in enumerate(steps[s]):
                applied = run[s][epoch * len(steps[s]) + j][0]
                w = {i: sizes[i] / sum(sizes[k] for k in items) for i in items}
                for name, got_g in applied.items():
                    exact = sum(grads[s][i][name] * w[i] for i in items)
                    mag = sum(grads[s][i][name].abs() * w[i] for i in items)
                    err = (got_g - exact).abs()
                    bound = torch.full_like(err, FP32)
                    if count > 1:
                        r = residual[s].get(name, torch.zeros_like(err))
                        bound += r + (count + 2) * BF16 * (mag + r)
                        residual[s][name] = BF16 * (mag + r)
                        rounded = rounded or bool((err > FP32).any())
                    assert bool((err <= bound).all()), \
                        (case, epoch, s, j, name, float((err - bound).max()))
        for items in _loss_items_per_step(sched):
            losses.append((sum(item_loss[n] for n in items), sum(sizes[n] for n in items)))
    assert rounded, f"{case}: the lossy codec changed nothing"
    return {n: t for s in range(p) for n, t in states[s][-1].items()}, losses


def _loss_items_per_step(sched: AsyncSchedule) -> list[list[int]]:
    cuts = step_cuts(sched)
    out: list[list[int]] = [[] for _ in range(sched.stream.minibatches)]
    for slot in sched.slots_of(sched.num_stages - 1):
        for b, (lo, hi) in enumerate(zip([0, *cuts[slot]], cuts[slot])):
            out[b] += [a.microbatch for a in sched.order[slot][lo:hi] if a.kind is Kind.FORWARD]
    return out


def _check(case: Case, ranks: list[dict[str, Any]]) -> None:
    sched = case.build()
    params, losses = (_stepwise if case.lossy else _oracle)(case, ranks)
    tol = FP32
    seen: set[str] = set()
    for stage, count in enumerate(case.replicas):
        mine = [r for r in ranks if r["stage"] == stage]
        assert len(mine) == count and all(r["synced"] == (count > 1) for r in mine), case
        for name, t in mine[0]["params"].items():
            for other in mine[1:]:  # the replicas of a stage stay identical
                assert torch.equal(other["params"][name], t), (case, stage, name)
            torch.testing.assert_close(t, params[name], atol=tol, rtol=tol,
                                       msg=f"{case}: {name}")
            seen.add(name)
        for r in mine:
            assert r["peak"] <= sched.version_limit[r["slot"]] * r["stage_bytes"], (case, r)
    assert seen == set(params), case
    last = [r["losses"] for r in ranks if r["last"]]
    for step, want in enumerate(losses):
        loss = sum(rank[step][0] for rank in last)
        samples = sum(rank[step][1] for rank in last)
        assert samples == want[1], f"{case}: step {step} ran {samples} samples, not {want[1]}"
        assert loss == pytest.approx(want[0], rel=tol, abs=1e-6), f"{case}: step {step} loss"


def test_the_stage_steps_are_the_documented_ones() -> None:
    """PipeDream: stage s steps once per round of r_s micro-batches, one per replica;
    2BW: once per mini-batch, on every stage, whatever the replication."""
    pd = Case((2, 1), "pipedream", 2, 3).build()
    assert stage_steps(pd, 0) == [[0, 1], [2, 3], [4, 5]]
    assert stage_steps(pd, 1) == [[n] for n in range(6)]
    two = Case((1, 2, 1), "2bw", 4, 3).build()
    for s in range(3):
        assert stage_steps(two, s) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # the versions the stage steps make are the same on every replica (lockstep)
    assert [u.version for u in two.updates[1]] == [u.version for u in two.updates[2]] == [1, 2, 3]


CASES_3 = [
    Case((2, 1), "2bw", 2, 3),
    Case((2, 1), "pipedream", 2, 3),
    Case((1, 2), "pipedream", 4, 2, batch=10),  # unequal micro-batches: 3, 3, 2, 2
    Case((1, 2), "2bw", 2, 3, threads="sa", fuse="all"),
    Case((2, 1), "pipedream", 4, 2, recompute=True, threads="per-message"),
]
CASES_4 = [
    Case((2, 2), "2bw", 4, 3, fuse="all"),
    Case((2, 2), "pipedream", 2, 3, threads="per-message"),
    Case((3, 1), "pipedream", 3, 2),
    Case((1, 2, 1), "2bw", 2, 3),
    Case((2, 2), "2bw", 2, 3, dp=(("algorithm", "ring"),),
         grad=(("codec", "bf16"), ("error_feedback", True))),  # lossy: replicas still agree
]


@pytest.mark.parametrize("world,cases", [(3, CASES_3), (4, CASES_4)], ids=["3", "4"])
def test_replicated_stages_match_the_replayed_schedule(world: int, cases: list[Case]) -> None:
    results = run_on_ranks(_run_cases, world, cases, timeout_s=240)
    for i, case in enumerate(cases):
        _check(case, [results[r][i] for r in range(world)])
