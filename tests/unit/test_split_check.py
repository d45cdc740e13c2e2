"""A stage whose backward cannot be split is refused before a zero-bubble run starts
(`pipeline.split_check`): the check itself, `approxdist.Pipeline(schedule="zbh1")` and
`approxdist train --schedule zbh1`, one line, exit 2, the model left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import approxdist
from approxdist.cli.main import main
from approxdist.config.pipeline import PipelineConfig
from approxdist.launch.context import DistContext
from approxdist.pipeline.split_backward import SplitBackwardError
from approxdist.pipeline.split_check import check_splittable, splits_backward
from tests.helpers.user_models import Scale, Square, with_middle

USER_MODELS = "tests.helpers.user_models"

REFUSAL = (r"schedule 'zbh1' splits each backward into I \(input gradient\) and W \(weight "
           r"gradients\), but block 2 \(Scale\) writes the gradient of its parameter 2.w while "
           r"computing its input gradient .*; use schedule 1f1b or gpipe \(whole backwards\), "
           r"torch.utils.checkpoint\(use_reentrant=False\), or a split whose first stage holds "
           r"block 2 \(split '3' or later")


def _model(middle: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return with_middle((6,), 3, middle)


def _pcfg(schedule: str = "zbh1", stages: int = 2, split: str = "") -> PipelineConfig:
    return PipelineConfig(stages=stages, schedule=schedule, microbatches=4, split=split)


def test_a_block_that_writes_its_weight_gradient_is_refused_and_left_as_it_was() -> None:
    model, x = _model(Scale(8)), torch.randn(5, 6)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with pytest.raises(SplitBackwardError, match=REFUSAL) as info:
        check_splittable(_pcfg(), model, x)
    assert "\n" not in str(info.value)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # BN stats
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked generator


@pytest.mark.parametrize("schedule", ["zbh2", "zbv"])
def test_every_split_schedule_refuses_it(schedule: str) -> None:
    with pytest.raises(SplitBackwardError, match=f"schedule '{schedule}' splits"):
        check_splittable(_pcfg(schedule), _model(Scale(8)), torch.randn(1, 6))


@pytest.mark.parametrize("pcfg", [
    _pcfg("1f1b"), _pcfg("gpipe"),      # whole backwards
    _pcfg(stages=1),                     # one stage, the first: its backward is whole
    _pcfg(split="3"),                    # the block in the first stage
], ids=["1f1b", "gpipe", "one stage", "first stage"])
def test_the_same_block_runs_where_nothing_is_split(pcfg: PipelineConfig) -> None:
    check_splittable(pcfg, _model(Scale(8)), torch.randn(4, 6))


@pytest.mark.parametrize("middle", [nn.ReLU(), Square(), nn.Sequential(nn.Tanh(), Square())],
                         ids=["relu", "custom function", "nested"])
@pytest.mark.parametrize("schedule", ["zbh1", "zbh2", "zbv"])
def test_parameter_free_blocks_split(middle: nn.Module, schedule: str) -> None:
    check_splittable(_pcfg(schedule), _model(middle), torch.randn(4, 6))


def test_which_schedules_split() -> None:
    assert [s for s in ("gpipe", "1f1b", "zbh1", "zbh2", "zbv", "2bw", "nope")
            if splits_backward(s)] == ["zbh1", "zbh2", "zbv"]


def test_the_public_pipeline_refuses_before_any_transfer(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Every rank refuses alike while building its stage (a two-rank world, no process
    group touched: the refusal comes first)."""
    monkeypatch.setattr("approxdist.api.pipeline.context_of",
                        lambda _m: DistContext(rank=1, world_size=2, backend="gloo"))
    with pytest.raises(SplitBackwardError, match=REFUSAL):
        approxdist.Pipeline(_model(Scale(8)), sample=torch.randn(2, 6), schedule="zbh1")


def test_approxdist_train_refuses_in_one_line_before_any_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    argv = ["train", "--parallel", "pipeline", "--stages", "2", "--microbatches", "2",
            "--epochs", "1", "--out", str(out), "--schedule"]
    assert main([*argv, "zbh1", "--model", f"{USER_MODELS}:unsplittable"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("approxdist: error: schedule 'zbh1' splits"), err
    assert "block 2 (Scale) writes the gradient of its parameter 2.w" in err
    assert not (out / "workers").exists()
    for schedule, model in (("1f1b", "unsplittable"), ("zbh1", "parameter_free")):
        assert main([*argv, schedule, "--model", f"{USER_MODELS}:{model}", "--check"]) == 0
