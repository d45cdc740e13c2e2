"""Per-parameter codec rules (seed 004: fp8 convolutions, Table-N linear layers, fp32 biases)."""

from __future__ import annotations

import pytest
from torch import nn

from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.data_parallel.compressed import check_shapes
from approxdist.errors import ConfigError, SpecError


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4, 2), nn.BatchNorm1d(2))


def test_seed_004_rules_pick_by_module_type_and_name() -> None:
    rules = CodecRules.parse(["*.bias=fp32", "type:Conv2d.weight=fp8-e5m2",
                              "type:Linear=table2"], default="bf16")
    owners = param_owners(_net())
    picked = {n: rules.codec_for(n, owners[n]) for n in owners}
    assert picked == {"0.weight": "fp8-e5m2", "0.bias": "fp32", "2.weight": "table2",
                      "2.bias": "fp32", "3.weight": "bf16", "3.bias": "fp32"}
    rules.validate()


def test_first_matching_rule_wins_and_mappings_keep_order() -> None:
    rules = CodecRules.parse({"2.*": "fp16", "*": "bf16"})
    owners = param_owners(_net())
    assert rules.codec_for("2.bias", owners["2.bias"]) == "fp16"
    assert rules.codec_for("0.bias", owners["0.bias"]) == "bf16"
    assert rules.specs() == ["fp32", "fp16", "bf16"]


def test_bad_rules_say_how_to_write_one() -> None:
    with pytest.raises(ConfigError, match="has no '='"):
        CodecRules.parse(["type:Conv2d"])
    with pytest.raises(ConfigError, match="incomplete"):
        CodecRules.parse(["type:=fp32"])
    with pytest.raises(SpecError, match="unknown codec spec"):
        CodecRules.parse(["*=fp7"]).validate()


@pytest.mark.parametrize("algorithm", ["native", "brb", "brd", "vhd"])
def test_an_all_gather_compressor_with_an_algorithm_that_only_sums_is_one_line(
        algorithm: str) -> None:
    for ok in ("ring", "auto"):  # their all-gather carries the payloads
        CodecRules.parse(["*.weight=topk:0.01"], "fp32").validate(ok)
    with pytest.raises(ConfigError) as err:
        CodecRules.parse(["*.weight=topk:0.01"], "fp32").validate(algorithm)
    text = str(err.value)
    assert "\n" not in text and "topk:0.01 needs all-gather" in text
    assert f"algorithm {algorithm!r} only sums; use --algorithm ring or auto" in text
    assert "powersgd:<r>, randomk:<ratio>" in text
    CodecRules.parse([], "randomk:0.1").validate(algorithm)  # it sums
    CodecRules.parse(["*.bias=fp32"], "powersgd:2").validate()
    with pytest.raises(SpecError, match="powersgd:2"):
        CodecRules.parse([], "powersgd:0").validate()


def test_powersgd_on_a_vector_is_named_before_any_worker_starts() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"'0\.bias' of shape \(4,\).*'\*\.bias=fp32'"):
        check_shapes(model, CodecRules.parse([], "powersgd:2"))
    check_shapes(model, CodecRules.parse(["*.bias=fp32"], "powersgd:2"))
    check_shapes(model, CodecRules.parse([], "randomk:0.5"))  # any shape
