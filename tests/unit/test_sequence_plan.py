"""Sequence parallelism's plans, checked in one process: gpt's own plan puts every norm on
the split sequence between one entry and one exit, and bad plans are one line."""

from __future__ import annotations

import pytest
from torch import nn

from approxdist.config.schema import ModelConfig
from approxdist.errors import ConfigError
from approxdist.models import build_model, sequence_plan_of, tp_plan_of
from approxdist.tensor_parallel import STYLES, check_plan


def _gpt() -> nn.Sequential:
    return build_model(ModelConfig(name="gpt-tiny"), (8,), 16)


def test_gpt_sequence_plan_splits_what_the_plain_plan_does_and_every_norm() -> None:
    model = _gpt()
    plan = sequence_plan_of("gpt-tiny")(model)  # type: ignore[misc]
    plain = tp_plan_of("gpt-tiny")(model)  # type: ignore[misc]
    assert {k: v.removesuffix("_seq") for k, v in plan.items() if k in plain} == plain
    norms = {n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    assert norms == {n for n, s in plan.items() if s == "norm_seq"}
    assert [n for n, s in plan.items() if s == "split_seq"] == ["0"]  # the embedding's output
    assert [n for n, s in plan.items() if s == "gather_seq"] == ["3.1"]  # the head's linear
    assert set(plan.values()) <= set(STYLES)
    check_plan(model, plan, 2)
    check_plan(model, plan, 4)


def test_models_without_a_sequence_have_no_sequence_plan() -> None:
    assert sequence_plan_of("mlp") is None and sequence_plan_of("resnet20") is None
    assert sequence_plan_of("gpt-small") is not None


@pytest.mark.parametrize(("plan", "size", "message"), [
    ({"0": "split_seq", "1.mlp.0": "colwise_seq"}, 2,
     "no layer has style gather_seq (where the sequence-split region leaves)"),
    ({"1.mlp.0": "colwise_seq", "3.1": "gather_seq"}, 2, "no layer has style split_seq"),
    ({"0": "split_seq", "1.attn": "norm_seq", "3.1": "gather_seq"}, 2,
     "style norm_seq needs an nn.LayerNorm; layer '1.attn' is CausalSelfAttention"),
    ({"0": "split_seq", "1.attn": "heads_seq", "3.1": "gather_seq"}, 3,
     "tp size 3 does not divide the 4 attention heads of 1.attn"),
])
def test_bad_sequence_plans_are_one_line(plan: dict[str, str], size: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_plan(_gpt(), plan, size)
    assert message in str(info.value) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("sequence", [False, True])
def test_tp_sequence_parallel_picks_the_models_sequence_plan(sequence: bool) -> None:
    from approxdist.config.loader import build_config
    from approxdist.train.engines.tp_split import plan_of
    cfg = build_config({"train": {"parallel": "tensor"}, "model": {"name": "gpt-tiny"},
                        "tp": {"size": 2, "sequence_parallel": sequence}})
    model = _gpt()
    family = sequence_plan_of if sequence else tp_plan_of
    assert plan_of(cfg, model) == family("gpt-tiny")(model)  # type: ignore[misc]
