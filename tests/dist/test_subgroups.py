"""Communication on sub-groups: data parallelism on any group, a pipeline on any ranks.

One set of 4 processes runs every case (the cases share nothing but the processes):
* groups {0, 2} and {1, 3} train two independent data-parallel replicas at the same time
  with different algorithms, each equal to its own single-process oracle (fp32, 1e-5)
  and bitwise equal across its members; an all-reduce through our link layer on each
  group equals `dist.all_reduce` on the same `new_group`, and a bf16 one is bitwise equal
  across members; byte counts name global ranks;
* a group of 3 ranks in the order (3, 1, 2) (broadcast from rank 3) trains while rank 0,
  outside it, trains its own model alone on a group of one (`DataParallel` whose
  all-reduce is the identity: its hooks, buckets and step equal the oracle, 1e-5);
* a 3-stage pipeline placed on ranks [2, 0, 3] (GPipe and 1F1B) while rank 1 runs its own
  job the same way: loss and every gradient equal the single-process oracle;
* `make_groups` of a 2 x 2 topology hands every rank its replica group and pipeline row.
A second set of 4 processes checks that a rank dying inside a sub-group ends its peers'
work with an error naming its global rank, not a hang.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.collectives import AllReduce
from approxdist.comm.link import Link
from approxdist.config.pipeline import PipelineConfig
from approxdist.data_parallel import DataParallel
from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, new_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.mlp import mlp
from approxdist.pipeline.microbatch import split_microbatches
from approxdist.pipeline.runtime import build_runtime
from approxdist.topology import Mesh
from approxdist.topology.groups import make_groups

STEPS, BATCH = 3, 12
SMALL = {"bucket_mb": 0.002, "first_bucket_mb": 0.001, "solo_mb": 0.004}
#: per group: its ranks (member order) and the engine's options
DP_GROUPS: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {
    "even": ((0, 2), {"algorithm": "ring", **SMALL}),
    "odd": ((1, 3), {"algorithm": "vhd", "threads": 3, "chunk_kb": 0.25, **SMALL}),
    "three": ((3, 1, 2), {"algorithm": "brd", "early_forward": True, **SMALL}),
}
PLACEMENT = [2, 0, 3]


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 3))


def _data(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g))
            for _ in range(STEPS)]


def _sgd(m: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)


def _oracle(seed: int) -> dict[str, torch.Tensor]:
    m = _net()
    opt = _sgd(m)
    for x, y in _data(seed):
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def _seed(name: str) -> int:
    return 10 + sorted(DP_GROUPS).index(name)


def _train_dp(ctx: DistContext, group: Group, name: str) -> dict[str, Any]:
    """Train on `group`; members start from different weights (the broadcast must fix them)."""
    options = DP_GROUPS[name][1]
    m = _net()
    if not group.is_root:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
    opt = _sgd(m)
    dp = DataParallel(m, ctx=ctx, group=group, optimizer=opt, **options)
    share = BATCH // group.size
    rows = slice(group.rank * share, (group.rank + 1) * share)
    for x, y in _data(_seed(name)):
        opt.zero_grad()
        F.cross_entropy(dp(x[rows]), y[rows]).backward()
        if not dp.owns_step:
            opt.step()
    links = dp.link_bytes()
    dp.close()
    return {"params": {k: v.detach().clone() for k, v in m.named_parameters()}, "links": links}


def _alone(ctx: DistContext, group: Group, seed: int) -> dict[str, torch.Tensor]:
    """A job of its own on a group of one rank: `DataParallel` on the whole batch."""
    m = _net()
    opt = _sgd(m)
    dp = DataParallel(m, ctx=ctx, group=group, optimizer=opt, algorithm="ring", **SMALL)
    for x, y in _data(seed):
        opt.zero_grad()
        F.cross_entropy(dp(x), y).backward()
        if not dp.owns_step:
            opt.step()
    dp.close()
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def _allreduce_vs_native(ctx: DistContext, group: Group) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    x = torch.randn(3001, generator=gen)
    native = x.clone()
    dist.all_reduce(native, group=group.pg)
    link = Link(ctx, group=group.fork())
    ours = AllReduce(link, "brb")(x.clone())
    bf16 = AllReduce(link, "ring", "bf16")(x.clone())
    link.close()
    link.group.release()
    return {"max_diff": float((ours - native).abs().max()), "bf16": bf16,
            "sent": dict(link.stats.sent)}


def _pipeline(ctx: DistContext, group: Group) -> dict[str, Any]:
    out = {}
    for schedule in ("gpipe", "1f1b"):
        x, y = _data(20)[0]
        torch.manual_seed(0)
        model = mlp((6,), 3, hidden=16, depth=3)
        rt = build_runtime(PipelineConfig(stages=3, microbatches=4, schedule=schedule,
                                          fuse_accumulation="all"), model, ctx, x[:2], group=group)
        first, last = rt.transport.is_first, rt.transport.is_last
        res = rt.executor.train_step(x if first else None, y if last else None, BATCH)
        out[schedule] = {"stage": rt.stage, "loss": res.loss,
                         "grads": {n: p.grad.clone() for n, p in rt.module.named_parameters()},
                         "sent": dict(rt.link.stats.sent)}
        rt.close()
    return out


def _pipeline_oracle() -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = mlp((6,), 3, hidden=16, depth=3)
    x, y = _data(20)[0]
    total = 0.0
    for mb in split_microbatches(x, y, 4):
        loss = F.cross_entropy(model(mb.inputs), mb.labels) * mb.weight
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


def _every_case(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # groups are created by every rank, in the same order (torch's rule for new_group)
    made = {name: new_group(ctx, ranks, name, lanes=5) for name, (ranks, _) in DP_GROUPS.items()}
    pipe = new_group(ctx, PLACEMENT, "pipeline")
    solo = [new_group(ctx, (r,), f"solo{r}", lanes=5) for r in (0, 1)]
    for name in ("even", "odd"):  # {0, 2} and {1, 3} train at the same time
        group = made[name]
        if group is not None:
            out["pair"] = _train_dp(ctx, group, name)
            out["native"] = _allreduce_vs_native(ctx, group)
    if made["three"] is not None:
        out["three"] = _train_dp(ctx, made["three"], "three")
    else:  # rank 0, outside the group of three, trains alone meanwhile
        assert solo[0] is not None
        out["alone"] = _alone(ctx, solo[0], 99)
    if pipe is not None:
        out["pipeline"] = _pipeline(ctx, pipe)
    else:  # rank 1, outside the pipeline, runs a job of its own
        assert solo[1] is not None
        out["own job"] = _alone(ctx, solo[1], 98)
    groups = make_groups(Mesh.stages(2, 2), ctx)
    lanes = [made["three"], made["three"].fork()] if made["three"] is not None else []
    lanes += [groups.replicas, groups.pipeline.fork() if groups.pipeline else None]
    out["timeouts"] = [_timeout_s(g) for g in lanes]
    out["grid"] = {"replicas": groups.replicas.ranks, "row": groups.pipeline.ranks
                   if groups.pipeline else None, "place": (groups.place.stage, groups.place.replica)}
    return out


def _timeout_s(group: Group | None) -> float | None:
    """The collective timeout of `group`'s lane (torch keeps it in the backend's options)."""
    if group is None:
        return None
    return group.pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()


@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_every_case, 4, timeout_s=180)


def _assert_oracle(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str) -> None:
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0, msg=f"{what}: {name}")


def test_two_groups_train_independent_replicas_each_equal_to_its_oracle(
        four_ranks: list[dict[str, Any]]) -> None:
    for name in ("even", "odd"):
        ranks = DP_GROUPS[name][0]
        ref = _oracle(_seed(name))
        _assert_oracle(four_ranks[ranks[0]]["pair"]["params"], ref, name)
        for k, v in four_ranks[ranks[0]]["pair"]["params"].items():
            assert torch.equal(four_ranks[ranks[1]]["pair"]["params"][k], v), (name, k)
        # bytes are counted per link between global ranks of the group, and only there
        a, b = ranks
        assert set(four_ranks[a]["pair"]["links"]) == {f"{a}->{b}"}
        assert four_ranks[a]["pair"]["links"][f"{a}->{b}"] > 0


def test_allreduce_on_a_subgroup_equals_dist_all_reduce_on_it(
        four_ranks: list[dict[str, Any]]) -> None:
    for name in ("even", "odd"):
        a, b = DP_GROUPS[name][0]
        for r in (a, b):
            assert four_ranks[r]["native"]["max_diff"] < 1e-5
            assert set(four_ranks[r]["native"]["sent"]) == {b if r == a else a}
        assert torch.equal(four_ranks[a]["native"]["bf16"], four_ranks[b]["native"]["bf16"])


def test_group_of_three_trains_while_a_rank_outside_works_alone(
        four_ranks: list[dict[str, Any]]) -> None:
    ranks = DP_GROUPS["three"][0]
    ref = _oracle(_seed("three"))
    for r in ranks:
        _assert_oracle(four_ranks[r]["three"]["params"], ref, f"three, rank {r}")
    _assert_oracle(four_ranks[0]["alone"], _oracle(99), "rank 0 alone")


def test_pipeline_on_ranks_2_0_3_matches_the_oracle(four_ranks: list[dict[str, Any]]) -> None:
    loss, grads = _pipeline_oracle()
    for schedule in ("gpipe", "1f1b"):
        stages = {four_ranks[r]["pipeline"][schedule]["stage"]: r for r in PLACEMENT}
        assert stages == {0: 2, 1: 0, 2: 3}, schedule
        assert four_ranks[3]["pipeline"][schedule]["loss"] == pytest.approx(loss, abs=1e-5)
        seen: set[str] = set()
        for r in PLACEMENT:
            for name, g in four_ranks[r]["pipeline"][schedule]["grads"].items():
                torch.testing.assert_close(g, grads[name], atol=1e-5, rtol=0,
                                           msg=f"{schedule} rank {r} {name}")
                seen.add(name)
        assert seen == set(grads)
        # activations flow 2 -> 0 -> 3 and gradients back; bytes name global ranks
        assert set(four_ranks[2]["pipeline"][schedule]["sent"]) == {0}
        assert set(four_ranks[0]["pipeline"][schedule]["sent"]) == {2, 3}
        assert set(four_ranks[3]["pipeline"][schedule]["sent"]) == {0}
    _assert_oracle(four_ranks[1]["own job"], _oracle(98), "rank 1's own job")


def test_make_groups_hands_each_rank_its_replicas_and_row(four_ranks: list[dict[str, Any]]
                                                          ) -> None:
    grid = [r["grid"] for r in four_ranks]
    assert [g["place"] for g in grid] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [g["replicas"] for g in grid] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [g["row"] for g in grid] == [(0, 1, 2, 3)] * 4  # the pipeline group, stage-major


def test_sub_groups_and_forked_lanes_take_the_jobs_timeout(four_ranks: list[dict[str, Any]]
                                                           ) -> None:
    """A sub-group, a lane forked from it, a mesh's replica group and a new lane of the
    world all wait as long as the job's own collective timeout (the spawn's 30 s), not
    torch's 30-minute default for a new group: a peer that vanishes without a reset is
    reported after the job's timeout."""
    for rank, r in enumerate(four_ranks):
        expected = [30.0] * len(r["timeouts"])
        assert r["timeouts"] == expected, (rank, r["timeouts"])
    assert len(four_ranks[1]["timeouts"]) == 4  # rank 1 is in the group of three


def _dies_in_subgroup(ctx: DistContext) -> None:
    pairs = [new_group(ctx, ranks, "pair", lanes=4) for ranks in ((0, 2), (1, 3))]
    group = next(g for g in pairs if g is not None)
    m = _net()
    dp = DataParallel(m, ctx=ctx, group=group, algorithm="ring")
    for i, (x, y) in enumerate(_data(5)):
        if ctx.rank == 3 and i == 1:
            os._exit(3)  # dies between steps, inside group {1, 3}
        F.cross_entropy(dp(x), y).backward()
    dp.close()


def test_a_rank_dying_in_a_subgroup_is_named_by_its_peer() -> None:
    with pytest.raises(LaunchError) as info:
        run_on_ranks(_dies_in_subgroup, 4, timeout_s=90, comm_timeout_s=15)
    text = str(info.value)
    assert "rank 3 failed" in text
    assert "rank 1 failed" in text and "from rank 3" in text, text
