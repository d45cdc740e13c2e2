"""The GPT block sequence cut into pipeline stages against the single-process oracle.

A small transformer (embedding | 2 transformer blocks | head) on next-token labels: token
ids enter stage 0 as int64, (batch, seq, dim) activations cross each cut, and the last
stage scores (batch, seq, vocab) logits with the `next-token` task. The loss, the
next-token hits and every parameter gradient must equal one process accumulating
`weight_m * loss_m` over the same micro-batches, within 1e-5; a forward-only evaluation
must give the same summed loss and hits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from approxdist.config.pipeline import PipelineConfig
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.gpt import GPTSize, gpt
from approxdist.pipeline.microbatch import split_microbatches
from approxdist.pipeline.runtime import build_runtime
from approxdist.train.task import task_named

VOCAB, SEQ = 32, 8
TASK = task_named("next-token")


@dataclass(frozen=True)
class Case:
    split: str
    microbatches: int
    schedule: str
    batch: int = 8

    def config(self) -> PipelineConfig:
        return PipelineConfig(stages=self.split.count(",") + 2, split=self.split,
                              microbatches=self.microbatches, schedule=self.schedule)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return gpt(GPTSize(dim=16, layers=2, heads=2), VOCAB, SEQ)


def _data(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        x, y = _data(case.batch)
        rt = build_runtime(case.config(), _model(), ctx, x[:2], loss_fn=TASK)
        first, last = rt.transport.is_first, rt.transport.is_last
        res = rt.executor.train_step(x if first else None, y if last else None, case.batch)
        grads = {n: p.grad.clone() for n, p in rt.module.named_parameters()}
        xt, yt = _data(5, seed=2)
        rt.compute.reset_step()
        rt.executor.eval_batch(xt if first else None, yt if last else None, 5)
        out.append({"loss": res.loss, "correct": res.correct, "grads": grads,
                    "eval": (float(rt.compute.loss_sum), int(rt.compute.correct))})
        rt.close()
    return out


def _oracle(case: Case) -> tuple[float, int, dict[str, torch.Tensor], tuple[float, int]]:
    model, (x, y) = _model(), _data(case.batch)
    loss_total, correct = 0.0, 0
    for mb in split_microbatches(x, y, case.microbatches):
        out = model(mb.inputs)
        loss = TASK(out, mb.labels) * mb.weight
        loss.backward()
        loss_total += float(loss.detach())
        correct += int(TASK.hits(out, mb.labels))
    xt, yt = _data(5, seed=2)
    with torch.no_grad():
        out = model(xt)
        ev = (float(TASK(out, yt)) * 5, int(TASK.hits(out, yt)))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss_total, correct, grads, ev


CASES = [Case("1", 2, "gpipe"), Case("2", 4, "1f1b"), Case("3", 1, "gpipe")]


def test_gpt_pipeline_matches_single_process() -> None:
    ranks_per_case = run_on_ranks(_run_cases, 2, CASES, timeout_s=120)
    for i, case in enumerate(CASES):
        loss, correct, grads, ev = _oracle(case)
        last = ranks_per_case[-1][i]
        assert last["loss"] == pytest.approx(loss, abs=1e-5), case
        assert last["correct"] == correct, case
        assert last["eval"][0] == pytest.approx(ev[0], abs=1e-4), case
        assert last["eval"][1] == ev[1], case
        seen: set[str] = set()
        for rank in ranks_per_case:
            for name, g in rank[i]["grads"].items():
                torch.testing.assert_close(g, grads[name], atol=1e-5, rtol=0,
                                           msg=f"{case} {name}")
                seen.add(name)
        assert seen == set(grads), case
