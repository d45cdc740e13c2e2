"""Seed 004's per-layer policies (`policy:seed004`, `policy:fastest`) and the codec times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from approxdist.config.loader import build_config
from approxdist.data_parallel import DataParallel
from approxdist.data_parallel.codec_rules import POLICIES, CodecRules, param_owners
from approxdist.data_parallel.codec_times import CodecTimes
from approxdist.data_parallel.ddp_hook import HookState
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.models.alexnet import alexnet_small
from approxdist.train.check import check_parts

#: alpha-beta times per codec: fp32 wins small messages, table1 large ones, fp8 between
COSTS = {"fp32": (1e-4, 4e-9), "fp8-e5m2": (2e-4, 1e-9), "table1": (8e-4, 0.2e-9)}
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)


def _rows(world: int = 1, algorithm: str = "auto") -> list[dict]:
    return [{"algorithm": algorithm, "codec": c, "size_bytes": s, "world_size": world,
             "median_s": a + b * s, "link": "bw=100mbit"}
            for c, (a, b) in COSTS.items() for s in SIZES]


def _cheapest(nbytes: int) -> str:
    return min(COSTS, key=lambda c: COSTS[c][0] + COSTS[c][1] * nbytes)


def _picked(rules: CodecRules, model: nn.Module) -> dict[str, str]:
    owners = param_owners(model)
    return {n: rules.codec_for(n, owners[n]) for n in owners}


def test_seed004_sends_each_alexnet_parameter_as_the_seed_says() -> None:
    model = alexnet_small((3, 32, 32), 10)
    picked = _picked(CodecRules.parse(["policy:seed004"]), model)
    owners = param_owners(model)
    assert len(picked) == 16  # 5 conv + 3 linear layers, weight and bias each
    for name, codec in picked.items():
        kind, leaf = type(owners[name]).__name__, name.rsplit(".", 1)[-1]
        expect = "fp32" if leaf == "bias" else {"Conv2d": "fp8-e5m2", "Linear": "table1"}[kind]
        assert codec == expect, name
    CodecRules.parse(["policy:seed004"]).validate()


def test_seed004_keeps_norms_in_fp32_and_leaves_other_layers_to_the_default() -> None:
    model = nn.Sequential(nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4), nn.LayerNorm(4),
                          nn.Embedding(10, 4), nn.Linear(4, 2, bias=False))
    picked = _picked(CodecRules.parse(["policy:seed004"], default="bf16"), model)
    assert picked == {"0.weight": "fp8-e5m2", "0.bias": "fp32", "1.weight": "fp32",
                      "1.bias": "fp32", "2.weight": "fp32", "2.bias": "fp32",
                      "3.weight": "bf16", "4.weight": "table1"}


def test_rules_before_a_policy_win_and_unknown_policies_list_the_valid_ones() -> None:
    rules = CodecRules.parse(["*.bias=bf16", "policy:seed004"])
    assert rules.rules[0].codec == "bf16" and len(rules.rules) == 1 + len(POLICIES.get("seed004"))
    picked = _picked(rules, nn.Sequential(nn.Linear(3, 2)))
    assert picked == {"0.weight": "table1", "0.bias": "bf16"}
    with pytest.raises(ConfigError, match="unknown codec policy 'seed005'; valid: fastest, seed004"):
        CodecRules.parse(["policy:seed005"])


def test_fastest_resolves_per_size_from_the_measured_times() -> None:
    times = CodecTimes.from_rows(_rows(), "auto")
    rules = CodecRules.parse(["policy:fastest"], times=times)
    rules.validate()
    for nbytes in (1 << 10, 4 << 10, 100 << 10, 300 << 10, 5 << 20, 64 << 20):
        assert rules.resolve("fastest", nbytes) == _cheapest(nbytes), nbytes
    assert rules.resolve("bf16", 1 << 20) == "bf16"
    # exact at the measured sizes, log-log interpolation between them
    assert times.time("fp32", 64 << 10) == pytest.approx(COSTS["fp32"][0] + COSTS["fp32"][1] * 65536)
    mid = times.time("fp32", 256 << 10)
    assert times.time("fp32", 64 << 10) < mid < times.time("fp32", 1 << 20)


def test_fastest_without_times_says_how_to_measure_them() -> None:
    with pytest.raises(ConfigError, match="pass --codec-times FILE .*bench allreduce"):
        CodecRules.parse(["policy:fastest"]).validate()


def test_bad_codec_times_are_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with pytest.raises(ConfigError, match="cannot read codec times .*bench allreduce"):
        CodecTimes.load(path, "auto")
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ConfigError, match="are not `approxdist bench allreduce --json` rows"):
        CodecTimes.load(path, "auto")
    path.write_text(json.dumps(_rows(algorithm="ring")))
    with pytest.raises(ConfigError, match="no rows with .algorithm.: 'auto' .theirs: ring\\)"):
        CodecTimes.load(path, "auto")
    path.write_text(json.dumps(_rows(algorithm="hybrid")))  # `auto`'s name before
    with pytest.raises(ConfigError) as err:
        CodecTimes.load(path, "auto")
    assert f"codec times {path} have no rows with \"algorithm\": 'auto' (theirs: hybrid; " \
           f"valid: auto, brb, brd, native, ring, vhd)" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="measured on 4 ranks, this run reduces over 2"):
        CodecTimes.from_rows(_rows(world=4), "auto").check_world(2)
    bad = _rows()
    bad[0]["median_s"] = 0.0
    with pytest.raises(ConfigError, match="median_s > 0"):
        CodecTimes.from_rows(bad, "auto")


def test_the_config_checks_policies_and_times_before_any_worker_starts(tmp_path: Path) -> None:
    cfg = build_config({"wire": {"grad": {"rules": ["policy:fastest"]}}})
    with pytest.raises(ConfigError, match="wire.grad.rules = 'policy:fastest': .*--codec-times"):
        check_parts(cfg)
    path = tmp_path / "times.json"
    path.write_text(json.dumps(_rows()))
    check_parts(build_config({"wire": {"grad": {"rules": ["policy:fastest", "policy:seed004"],
                                                "times": str(path)}}}))
    with pytest.raises(ConfigError, match="wire.grad.times = .*no rows with .algorithm.: "
                                          "'ring' .theirs: auto"):
        check_parts(build_config({"dp": {"algorithm": "ring"},
                                  "wire": {"grad": {"times": str(path)}}}))


def test_data_parallel_gives_each_bucket_the_fastest_codec_for_its_size() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 64), nn.Linear(64, 4))
    dp = DataParallel(model, codec_rules=["*.bias=fp32", "policy:fastest"],
                      codec_times=CodecTimes.from_rows(_rows(), "auto"),
                      bucket_mb=0.0, solo_mb=0.0)
    try:
        got = {b.plan.names: b.plan.codec for b in dp.buckets}
        for names, codec in got.items():
            numel = sum(dict(model.named_parameters())[n].numel() for n in names)
            expect = "fp32" if names[0].endswith("bias") else _cheapest(4 * numel)
            assert codec == expect, names
        assert {"fp32", "fp8-e5m2", "table1"} == set(got.values())
    finally:
        dp.close()


def test_the_ddp_hook_cuts_a_bucket_into_runs_of_one_codec() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    named = dict(model.named_parameters())
    owners = param_owners(model)
    state = HookState(DistContext(), {id(p): n for n, p in named.items()},
                      codec_rules=["policy:seed004"],
                      owners={id(p): owners[n] for n, p in named.items()})
    try:
        params = [named[n] for n in ("2.bias", "2.weight", "0.bias", "0.weight")]
        runs = state.runs(2 + 16 + 2 + 18 + 3, params)  # 3 values of DDP padding at the end
        assert runs == [(0, 2, "fp32"), (2, 18, "table1"), (18, 20, "fp32"),
                        (20, 41, "fp8-e5m2")]
        assert HookState(DistContext(), {}).runs(7, []) == [(0, 7, "fp32")]
    finally:
        state.close()


def test_the_ddp_hook_gives_each_compressed_parameter_a_run_of_its_own() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    named = dict(model.named_parameters())
    state = HookState(DistContext(), {id(p): n for n, p in named.items()},
                      codec_rules=["*.bias=fp32"], codec="topk:0.5")
    try:
        params = [named[n] for n in ("1.bias", "1.weight", "0.weight", "0.bias")]
        runs = state.runs(2 + 4 + 6 + 2 + 3, params)  # DDP padding after a codec's run
        assert runs == [(0, 2, "fp32"), (2, 6, "topk:0.5"), (6, 12, "topk:0.5"),
                        (12, 17, "fp32")]
        assert state.runs(2 + 4 + 6 + 1, params[:3]) == [  # padding after a compressor
            (0, 2, "fp32"), (2, 6, "topk:0.5"), (6, 12, "topk:0.5"), (12, 13, "fp32")]
    finally:
        state.close()
