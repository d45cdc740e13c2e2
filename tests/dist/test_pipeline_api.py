"""`approxdist.Pipeline` from a user's own loop: a model of the user's own blocks, the user's
loss (regression and classification), against single-process gradients; zero-bubble
schedules (split backward) against single-process parameters after steps of SGD with
momentum; an asynchronous schedule through the API; the documented example
(examples/pipeline_api.py) trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.pipeline.errors import PipelineError
from approxdist.trace.recorder import Recorder
from tests.helpers.examples import load_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline_api.py"


class Gate(nn.Module):
    """A block of a user's own (not one of approxdist's models)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.a(x)) * torch.sigmoid(self.b(x)) + x


def _model(out: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), Gate(16), nn.ReLU(), Gate(16), nn.Linear(16, out))


def _data(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(12, 6, generator=gen)
    if kind == "regression":
        return x, torch.randn(12, 2, generator=gen)
    return x, torch.randint(0, 3, (12,), generator=gen)


CASES = [("regression", "1f1b", 4, False), ("classification", "gpipe", 3, True),
         ("classification", "1f1b", 1, False), ("regression", "zbh1", 4, True),
         ("classification", "zbh2", 3, False), ("classification", "zbv", 4, True)]
#: (schedule, micro-batches, recompute) trained for STEPS steps of SGD with momentum
STEPPED = [("zbh1", 4, False), ("zbh1", 3, True), ("zbh2", 4, True), ("zbv", 3, False)]
STEPS = 3


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _stepped(schedule: str, m: int, recompute: bool) -> dict[str, Any]:
    """STEPS optimizer steps of a zero-bubble pipeline; losses and the parameters after."""
    x, y = _data("classification")
    pipe = approxdist.Pipeline(_model(3), sample=x[:2], schedule=schedule, microbatches=m,
                               recompute=recompute)
    opt = _sgd(pipe.parameters())
    losses = []
    for _ in range(STEPS):
        losses.append(pipe.step(x if pipe.is_first else None, y if pipe.is_last else None,
                                batch_size=12))
        opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in pipe.module.named_parameters()}
    # evaluated after the steps: summed loss, hits, and the samples this rank ran (each
    # micro-batch once, though ZB-V's rank 0 forwards it through two chunks)
    scored = pipe.eval_step(x if pipe.is_first else None, y if pipe.is_last else None,
                            batch_size=12)
    pipe.close()
    return {"losses": losses, "params": params, "eval": scored}
LOSSES = {"regression": F.mse_loss, "classification": F.cross_entropy}
OUTS = {"regression": 2, "classification": 3}


class Pool(nn.Module):
    """Mean over the sequence dimension, then classes."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(1))


def _sequence_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), Pool(8, 3))


LENGTHS = (5, 9, 3)


def _sequences(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(t)
    return torch.randn(6, t, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen)


def _variable(ctx: DistContext) -> dict[str, Any]:
    """Sequence lengths that change between mini-batches (dynamic_shapes)."""
    x0, _ = _sequences(LENGTHS[0])
    pipe = approxdist.Pipeline(_sequence_model(), sample=x0[:2], schedule="1f1b",
                               microbatches=2, dynamic_shapes=True)
    grads = []
    for t in LENGTHS:
        x, y = _sequences(t)
        loss = pipe.step(x, y)
        grads.append(({n: p.grad.clone() for n, p in pipe.module.named_parameters()}, loss))
        for p in pipe.parameters():
            p.grad = None
    pipe.close()
    fixed = approxdist.Pipeline(_sequence_model(), sample=x0[:2], schedule="1f1b",
                                microbatches=2)
    refused = ""
    if fixed.is_first:  # stage 0 refuses before any transfer, so the others are not called
        with pytest.raises(PipelineError) as info:
            fixed.step(_sequences(7)[0], None)
        refused = str(info.value)
    fixed.close()
    return {"grads": grads, "refused": refused}


def _ranks(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {"cases": [], "variable": _variable(ctx)}
    for kind, schedule, m, recompute in CASES:
        x, y = _data(kind)
        pipe = approxdist.Pipeline(_model(OUTS[kind]), sample=x[:2], schedule=schedule,
                                   microbatches=m, recompute=recompute, loss_fn=LOSSES[kind])
        loss = pipe.step(x if pipe.is_first else None, y if pipe.is_last else None,
                         batch_size=12)
        grads = {n: p.grad.clone() for n, p in pipe.module.named_parameters()}
        out["cases"].append({"loss": loss, "grads": grads})
        pipe.close()
    out["stepped"] = [_stepped(*case) for case in STEPPED]
    # an asynchronous schedule: the pipeline steps the optimiser itself
    x, y = _data("classification")
    pipe = approxdist.Pipeline(_model(3), sample=x[:2], schedule="2bw", microbatches=2,
                               optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), stream=3)
    before = [p.detach().clone() for p in pipe.parameters()]
    out["async"] = [pipe.step(x, y) for _ in range(3)]
    out["moved"] = any(not torch.equal(a, p) for a, p in zip(before, pipe.parameters()))
    pipe.close()
    with pytest.raises(ConfigError, match="schedule '2bw' is asynchronous"):
        approxdist.Pipeline(_model(3), sample=x[:2], schedule="2bw")
    example = load_example(EXAMPLE, "pipeline_api_example")
    out["example"] = example.main(steps=30)
    return out


def test_the_public_pipeline_matches_single_process_and_runs_the_example() -> None:
    ranks = run_on_ranks(_ranks, 2, timeout_s=240)
    for i, (kind, schedule, _, _) in enumerate(CASES):
        last = 0 if schedule == "zbv" else 1  # ZB-V: rank 0 holds the first and last chunk
        x, y = _data(kind)
        model = _model(OUTS[kind])
        loss = LOSSES[kind](model(x), y)
        loss.backward()
        got = {**ranks[0]["cases"][i]["grads"], **ranks[1]["cases"][i]["grads"]}
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name], p.grad, atol=1e-5, rtol=1e-5, msg=name)
        assert ranks[1 - last]["cases"][i]["loss"] is None
        assert ranks[last]["cases"][i]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for i, case in enumerate(STEPPED):  # zero bubble: the parameters after the steps
        x, y = _data("classification")
        model = _model(3)
        opt, losses = _sgd(model.parameters()), []
        for _ in range(STEPS):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        last = 0 if case[0] == "zbv" else 1
        assert ranks[last]["stepped"][i]["losses"] == pytest.approx(losses, rel=1e-5), case
        with torch.no_grad():
            out = model(x)
        summed, hits, ran = ranks[last]["stepped"][i]["eval"]
        assert summed == pytest.approx(float(F.cross_entropy(out, y, reduction="sum")),
                                       rel=1e-5) and ran == x.shape[0], case
        assert hits == int((out.argmax(1) == y).sum()) and ranks[1 - last]["stepped"][i][
            "eval"][2] == x.shape[0], case
        got = {**ranks[0]["stepped"][i]["params"], **ranks[1]["stepped"][i]["params"]}
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name], p.detach(), atol=1e-5, rtol=1e-5,
                                       msg=f"{case} {name}")
    assert all(r["moved"] for r in ranks)
    assert ranks[0]["async"] == [None] * 3 and all(v is not None for v in ranks[1]["async"])
    for i, t in enumerate(LENGTHS):  # variable sequence lengths: every step's gradients
        x, y = _sequences(t)
        model = _sequence_model()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        got = {**ranks[0]["variable"]["grads"][i][0], **ranks[1]["variable"]["grads"][i][0]}
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name], p.grad, atol=1e-5, rtol=1e-5, msg=name)
        assert ranks[1]["variable"]["grads"][i][1] == pytest.approx(float(loss.detach()), rel=1e-5)
    assert ranks[0]["variable"]["refused"] == (
        "the inputs' per-sample shape (7, 4) differs from the (5, 4) the pipeline was built "
        "for; shapes that change between mini-batches need dynamic_shapes=True "
        "(pipeline.dynamic_shapes)")
    losses = ranks[1]["example"]
    assert ranks[0]["example"] == [] and len(losses) == 30 and losses[-1] < 0.5 * losses[0]


def test_without_a_process_group_the_api_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"needs torch.distributed: call "
                       r"dist.init_process_group\(...\) on every rank first"):
        approxdist.Pipeline(_model(3), sample=torch.zeros(2, 6))


HYBRID_EXAMPLE = EXAMPLE.parent / "hybrid_api.py"


def _hybrid_ranks(ctx: DistContext) -> dict[str, Any]:
    """replicas=(2, 1): stage 0 on ranks 0 and 1, stage 1 on rank 2."""
    out: dict[str, Any] = {"cases": []}
    x, y = _data("classification")
    for schedule, m in (("gpipe", 4), ("1f1b", 2)):
        pipe = approxdist.Pipeline(_model(3), sample=x[:2], split=[2], replicas=(2, 1),
                                   schedule=schedule, microbatches=m)
        loss = pipe.step(x, y)
        out["cases"].append({"loss": loss, "stage": pipe.stage, "grads": {
            n: p.grad.clone() for n, p in pipe.module.named_parameters()}})
        pipe.close()
    with pytest.raises(ConfigError, match=r"replicas=\[2, 2\] place 4 rank\(s\) but the world "
                                          r"has 3"):
        approxdist.Pipeline(_model(3), sample=x[:2], replicas=(2, 2))
    # what the CLI has, the class has: placement (stage 0 on ranks 2 and 0, stage 1 on rank
    # 1), a recorder, the stage's state; an option it cannot honour is refused
    rec = Recorder(ctx.rank, profiler="never")
    pipe = approxdist.Pipeline(_model(3), sample=x[:2], split=[2], replicas=(2, 1),
                               placement=[2, 0, 1], schedule="1f1b", microbatches=2,
                               recorder=rec)
    out["placed"] = {"loss": pipe.step(x, y), "stage": pipe.stage, "grads": {
        n: p.grad.clone() for n, p in pipe.module.named_parameters()}}
    out["placed"]["phases"] = sorted({e[0] for e in rec.events})
    state = pipe.state_dict()
    with torch.no_grad():
        for p in pipe.parameters():
            p.add_(1.0)
    pipe.load_state_dict(state)
    out["placed"]["restored"] = all(torch.equal(p, state["model"][n])
                                    for n, p in pipe.module.named_parameters())
    pipe.close()
    with pytest.raises(ConfigError, match=r"grad_codec='bf16', algorithm='\w+' and "
                                          r"calibration='' set how a replicated stage's "
                                          r"gradients are summed"):
        approxdist.Pipeline(_model(3), sample=x[:2], grad_codec="bf16")
    # 2bw on replicated stages: a stream of 2 mini-batches (the same one twice), plain SGD
    pipe = approxdist.Pipeline(_model(3), sample=x[:2], split=[2], replicas=(2, 1),
                               schedule="2bw", microbatches=2, stream=2,
                               optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    losses = [pipe.step(x, y) for _ in range(2)]
    out["2bw"] = {"losses": losses, "params": {n: p.detach().clone()
                                               for n, p in pipe.module.named_parameters()}}
    pipe.close()
    with pytest.raises(ConfigError, match=r"schedule 'pipedream-vsync' on replicas=\[2, 1\]: "
                                          r"pipedream-vsync with replicated stages .* is not "
                                          r"available") as info:
        approxdist.Pipeline(_model(3), sample=x[:2], replicas=(2, 1), schedule="pipedream-vsync",
                            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), stream=2)
    assert len(str(info.value).splitlines()) == 1
    example = load_example(HYBRID_EXAMPLE, "hybrid_api_example")
    out["example"] = example.main(steps=20)
    return out


def test_the_public_pipeline_with_replicated_stages_matches_single_process() -> None:
    ranks = run_on_ranks(_hybrid_ranks, 3, timeout_s=240)
    x, y = _data("classification")
    for i in range(2):
        model = _model(3)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        want = dict(model.named_parameters())
        for r in ranks:  # each replica of stage 0 holds the whole batch's gradient
            case = r["cases"][i]
            for name, g in case["grads"].items():
                torch.testing.assert_close(g, want[name].grad, atol=1e-5, rtol=1e-5, msg=name)
        assert [r["cases"][i]["stage"] for r in ranks] == [0, 0, 1]
        assert ranks[2]["cases"][i]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
        assert ranks[0]["cases"][i]["loss"] is None
    for r, stage in zip(ranks, (0, 1, 0)):  # placed on ranks 2, 0 | 1: the same numbers
        placed = r["placed"]
        assert placed["stage"] == stage and placed["restored"]
        for name, g in placed["grads"].items():
            torch.testing.assert_close(g, want[name].grad, atol=1e-5, rtol=1e-5, msg=name)
        assert {"run_for", "run_back"} <= set(placed["phases"])  # the recorder saw the stage
    assert ranks[1]["placed"]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    losses = ranks[2]["example"]
    assert ranks[0]["example"] == [] and len(losses) == 20 and losses[-1] < 0.5 * losses[0]
    # 2BW: both mini-batches of the stream run at version 0 (W(t+1) = W(t) - lr * grad
    # f(W(t-1)), W(-1) = W(0)), so after it W = W0 - 2 * lr * grad f(W0); the replicas of
    # stage 0 hold the same weights; each step's loss is the mean over the samples the last
    # stage finished during it (the stream drains in the second)
    model = _model(3)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    for r in ranks:
        for name, t in r["2bw"]["params"].items():
            p = dict(model.named_parameters())[name]
            torch.testing.assert_close(t, p.detach() - 2 * 0.1 * p.grad, atol=1e-5, rtol=1e-5,
                                       msg=name)
    assert ranks[0]["2bw"]["params"].keys() == ranks[1]["2bw"]["params"].keys()
    for name, t in ranks[0]["2bw"]["params"].items():
        assert torch.equal(t, ranks[1]["2bw"]["params"][name]), name
    finished = [v for v in ranks[2]["2bw"]["losses"] if v is not None]
    assert finished and all(v == pytest.approx(float(loss.detach()), rel=1e-5) for v in finished)
    assert ranks[0]["2bw"]["losses"] == [None, None]
