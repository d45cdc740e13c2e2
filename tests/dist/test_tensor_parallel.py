"""Tensor parallelism against one process: every gradient and parameter after steps.

Each case builds the same model from the same seed on every rank, splits it with its
family's plan (Megatron-LM's column-then-row pairs, attention by heads, convolutions by
channel) over the world, trains a few SGD steps on the same batches, and compares every
shard with the matching slice of one process training the whole model (1e-5, fp32: only
the summation order of the all-reduced partial sums differs). gpt-tiny also runs with sequence parallelism
(its sequence plan: norms, dropout and residuals on each rank's positions, the split
layers gathering and reduce-scattering them). With a lossy forward wire the output
equals one process that sums the ranks' partial outputs through the same all-reduce with
the same codec on a simulated world, and a sequence gather equals the codec applied to
each rank's positions: the error is the codec's as the algorithm applies it, nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from approxdist.comm.codecs import get_codec
from approxdist.comm.link import Link
from approxdist.config.schema import ModelConfig
from approxdist.config.wire import Wire
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import world_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model, sequence_plan_of, tp_plan_of
from approxdist.tensor_parallel import TPComm, parallelize
from approxdist.tensor_parallel.layers import shard_index
from approxdist.tensor_parallel.sequence import gather_from_sequence
from approxdist.train.task import task_named
from tests.helpers.sim_world import simulate

STEPS, LR = 3, 0.1


@dataclass(frozen=True)
class Case:
    model: str
    shape: tuple[int, ...]
    classes: int
    task: str = "classify"
    width: int = 8
    sequence: bool = False  # the family's sequence-parallel plan
    dropout: float = 0.0

    @property
    def name(self) -> str:
        return self.model + ("-sp" if self.sequence else "") + \
            (f"-drop{self.dropout}" if self.dropout else "")

    def plan(self, model: nn.Module) -> dict[str, str]:
        family = sequence_plan_of(self.model) if self.sequence else tp_plan_of(self.model)
        assert family is not None
        return family(model)

    def build(self) -> nn.Sequential:
        torch.manual_seed(3)
        cfg = ModelConfig(name=self.model, width=self.width, hidden=16, depth=3,
                          dropout=self.dropout)
        return build_model(cfg, self.shape, self.classes)

    def batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(7)
        out = []
        for _ in range(STEPS):
            if self.task == "next-token":
                x = torch.randint(0, self.classes, (4, *self.shape), generator=gen)
                out.append((x, torch.roll(x, -1, 1)))
            else:
                out.append((torch.randn(6, *self.shape, generator=gen),
                            torch.randint(0, self.classes, (6,), generator=gen)))
        return out


CASES = [Case("mlp", (1, 4, 4), 5), Case("gpt-tiny", (8,), 16, "next-token"),
         Case("resnet20", (2, 6, 6), 4), Case("gpt-tiny", (8,), 16, "next-token", sequence=True),
         # dropout on: attention's, after attention, the MLP's; split by heads and along
         # the sequence, each rank draws one process's masks and keeps its part
         Case("gpt-tiny", (8,), 16, "next-token", dropout=0.2),
         Case("gpt-tiny", (8,), 16, "next-token", sequence=True, dropout=0.2)]


def _train(model: nn.Module, case: Case) -> tuple[list[float], dict[str, torch.Tensor],
                                                  dict[str, torch.Tensor]]:
    """Losses, the first step's gradients and the parameters after `STEPS` SGD steps."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    task, losses, first = task_named(case.task), [], {}
    torch.manual_seed(13)  # dropout's masks: the same stream on every rank and in the oracle
    for step, (x, y) in enumerate(case.batches()):
        opt.zero_grad()
        loss = task(model(x), y)
        loss.backward()
        if step == 0:
            first = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    return losses, first, {n: p.detach().clone() for n, p in model.named_parameters()}


def _ranks(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    link = Link(ctx, None, group=world_group(ctx))
    comm = TPComm(link, algorithm="ring")
    for case in CASES:
        model = case.build()
        parallelize(model, case.plan(model), comm)
        seen: list[tuple[int, ...]] = []  # what the first block's norm computes on
        if case.model == "gpt-tiny":
            model.get_submodule("1.ln1").register_forward_pre_hook(
                lambda m, args, seen=seen: seen.append(tuple(args[0].shape)))
        losses, grads, params = _train(model, case)
        out[case.name] = {"losses": losses, "grads": grads, "params": params,
                          "index": shard_index(model), "norm_input": seen[:1]}
    # a lossy forward wire: one row-parallel layer's output against the simulated sum
    lossy = TPComm(link, fwd=Wire(codec="bf16"), algorithm="ring")
    torch.manual_seed(5)
    full = nn.Linear(12, 6)
    row = parallelize(nn.Sequential(full), {"0": "rowwise"}, lossy)
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(9))
    cols = slice(ctx.rank * 6, (ctx.rank + 1) * 6)
    out["lossy"] = {"y": row(x[:, cols]).detach(), "bias": row[0].bias.detach(),
                    "partial": (x[:, cols] @ row[0].weight.T).detach()}
    # a lossy forward wire on a sequence gather: each rank's positions through the codec
    seq = TPComm(link, fwd=Wire(codec="bf16"), algorithm="ring")
    mine = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(11 + ctx.rank))
    out["gathered"] = {"mine": mine, "y": gather_from_sequence(mine, seq, "s",
                                                               partial_grad=False)}
    with pytest.raises(ConfigError) as info:
        parallelize(nn.Sequential(nn.Linear(5, 3)), {"0": "colwise"}, comm)
    out["refused"] = [str(info.value)]
    for plan in ({"0.9": "colwise"}, {"0": "heads"}, {"0": "sideways"}, {},
                 {"0": "split_seq", "1": "colwise_seq"}):
        with pytest.raises(ConfigError) as info:
            parallelize(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), plan, comm)
        out["refused"].append(str(info.value))
    odd = build_model(ModelConfig(name="gpt-tiny"), (7,), 16)
    parallelize(odd, sequence_plan_of("gpt-tiny")(odd), comm)  # type: ignore[misc]
    with pytest.raises(ConfigError) as info:
        odd(torch.zeros(2, 7, dtype=torch.long))
    out["refused"].append(str(info.value))
    link.close()
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_ranks, 2, timeout_s=240)


def _part(full: torch.Tensor, where: tuple[int, Any] | None) -> torch.Tensor:
    if where is None:
        return full
    dim, index = where
    return full[index] if dim == 0 else full[:, index]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_shard_equals_one_process(two_ranks: list[dict[str, Any]], case: Case) -> None:
    losses, grads, params = _train(case.build(), case)
    if case.dropout:  # the masks act: the same run without dropout ends elsewhere
        plain = dataclasses.replace(case, dropout=0.0)
        assert _train(plain.build(), plain)[0][1:] != pytest.approx(losses[1:], rel=1e-3)
    for rank in two_ranks:
        got = rank[case.name]
        assert got["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        if case.model == "gpt-tiny":  # (batch, positions, width): each rank's half with sp
            assert got["norm_input"] == [(4, 4 if case.sequence else 8, 64)]
        assert set(got["grads"]) == set(grads)  # every parameter, split or whole
        split = [n for n in grads if n in got["index"]]
        assert split, case  # the plan did split something
        for name in grads:
            where = got["index"].get(name)
            torch.testing.assert_close(got["grads"][name], _part(grads[name], where),
                                       rtol=1e-5, atol=1e-6, msg=f"{case.model} grad {name}")
            torch.testing.assert_close(got["params"][name], _part(params[name], where),
                                       rtol=1e-5, atol=1e-6, msg=f"{case.model} param {name}")
    # the ranks' shards of every split parameter make up the whole, each entry once
    for name in grads:
        if name not in two_ranks[0][case.name]["index"]:
            continue
        whole = torch.full_like(params[name], float("nan"))
        for r in two_ranks:
            dim, index = r[case.name]["index"][name]
            if dim == 0:
                whole[index] = r[case.name]["params"][name]
            else:
                whole[:, index] = r[case.name]["params"][name]
        torch.testing.assert_close(whole, params[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_lossy_forward_wire_adds_the_codecs_error_only(two_ranks: list[dict[str, Any]]) -> None:
    """The row-parallel output is the ring all-reduce's bf16 sum, bit for bit, plus the bias."""
    partials = [r["lossy"]["partial"] for r in two_ranks]
    want = simulate("ring", partials, codec="bf16")
    for r, summed in zip(two_ranks, want):
        assert torch.equal(r["lossy"]["y"], summed + r["lossy"]["bias"])
    assert not torch.equal(want[0], partials[0] + partials[1])  # bf16 did change the sum


def test_a_lossy_sequence_gather_is_the_codec_on_each_ranks_positions(
        two_ranks: list[dict[str, Any]]) -> None:
    """bf16 on the forward wire: every rank gets each rank's positions decode(encode(.)),
    in rank order along the sequence, bit for bit."""
    bf16 = get_codec("bf16")
    mine = [r["gathered"]["mine"] for r in two_ranks]
    want = torch.cat([bf16.roundtrip(m.clone()).view(m.shape) for m in mine], dim=1)
    for r in two_ranks:
        assert torch.equal(r["gathered"]["y"], want)
    assert not torch.equal(want, torch.cat(mine, dim=1))  # bf16 did change the values


def test_bad_plans_are_one_line(two_ranks: list[dict[str, Any]]) -> None:
    got = two_ranks[0]["refused"]
    assert got[0].startswith("tp size 2 does not divide the 3 output features of 0; use a tp "
                             "size among 1, 3")
    assert got[1].startswith("tp plan names layer '0.9', which the model does not have")
    assert got[2] == "tp plan: style heads needs a self-attention with qkv, proj and heads; " \
                     "layer '0' is Linear"
    assert got[3].startswith("tp plan: layer '0' has style 'sideways', not one of: colwise")
    assert got[4].startswith("the tp plan splits no layer")
    assert got[5].startswith("tp plan uses sequence-parallel styles but no layer has style "
                             "gather_seq")
    assert got[6].startswith("tp size 2 does not divide the 7 sequence positions at 0; use a "
                             "tp size among 1, 7")
    assert all(len(m.splitlines()) == 1 for m in got)
