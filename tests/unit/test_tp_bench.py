"""`approxdist bench tp` without processes: wire variants, the first-step check, the rows,
torch's head-ordered attention against the whole one, and bad input as one line."""

from __future__ import annotations

import pytest
import torch

from approxdist.benchmarks.tp import (
    FP32,
    BaselineMismatch,
    TPBenchCase,
    Variant,
    first_step_mismatch,
    summarize,
    variants,
)
from approxdist.benchmarks.tp_torch import LocalHeads, missing_styles
from approxdist.cli.main import main
from approxdist.models.gpt import CausalSelfAttention


def test_variants_put_our_fp32_wire_first_and_each_codec_on_each_wire_once() -> None:
    got = variants([("bf16", False), ("fp32", False), ("fp8-e5m2", True)], ["fwd", "both", "fwd"])
    assert [v.label for v in got] == ["fp32", "bf16@fwd", "bf16@both", "fp8-e5m2+ef@fwd",
                                      "fp8-e5m2+ef@both"]
    assert (got[1].fwd_codec, got[1].bwd_codec) == ("bf16", "fp32")
    assert (Variant("bf16", "bwd").fwd_codec, Variant("bf16", "bwd").bwd_codec) == ("fp32", "bf16")
    assert (got[4].fwd_codec, got[4].bwd_codec, got[4].error_feedback) == ("fp8-e5m2",) * 2 + (True,)


def test_the_first_step_losses_must_agree_within_fp32_rounding() -> None:
    same = {"torch": 5.5416481, "approxdist:fp32": 5.5416482, "approxdist:bf16@fwd": 5.53}
    assert first_step_mismatch([same, same]) is None
    assert first_step_mismatch([{"approxdist:fp32": 1.0}]) is None  # no torch engine
    off = {**same, "approxdist:fp32": 5.5418}
    message = first_step_mismatch([same, off])
    assert message is not None and "torch 5.541648" in message and "5.5418 on rank 1" in message


def _case(link: str = "", plan: tuple[tuple[str, str], ...] = (("1.attn", "heads"),)
          ) -> TPBenchCase:
    return TPBenchCase("gpt-tiny", (64,), plan, batch_size=4, link=link,
                       variants=(FP32, Variant("bf16", "fwd")))


def _result(rounds: dict[str, list[float]], refused: str | None = None) -> dict[str, object]:
    return {"rounds": rounds, "refused": refused, "steps_run": 10,
            "first_loss": {name: 5.0 for name in rounds},
            "bytes": {"fp32": 1000, "bf16@fwd": 600}}


def test_rows_give_ratios_to_torch_and_to_our_fp32_wire() -> None:
    rounds = {"torch": [2.0, 2.0, 4.0], "approxdist:fp32": [1.0, 2.0, 2.0],
              "approxdist:bf16@fwd": [0.5, 1.0, 1.0]}
    rows = summarize([_case("bw=1gbit")], [[_result(rounds)], [_result(rounds)]], steps=2)
    torch_row, fp32, bf16 = rows
    assert [r["engine"] for r in rows] == ["torch", "approxdist", "approxdist"]
    assert torch_row["samples_per_s"] == 2 * 4 / 2.0 and torch_row["ratio_vs_torch"] == 1.0
    assert torch_row["vs_fp32"] is None and torch_row["bytes_per_step"] is None
    assert fp32["ratio_vs_torch"] == 1.0 and fp32["paired_ratio"] == 2.0  # 2/1, 2/2, 4/2
    assert bf16["vs_fp32"] == 2.0 and bf16["ratio_vs_torch"] == 2.0
    assert (bf16["fwd_codec"], bf16["bwd_codec"], bf16["wire"]) == ("bf16", "fp32", "fwd")
    assert bf16["bytes_per_step"] == 60.0 and bf16["link"] == "bw=1gbit"
    assert bf16["median_step_s"] == 1.0 / 2


def test_a_plan_torch_cannot_split_has_rows_against_our_fp32_wire_only() -> None:
    plan = (("1.conv1", "channel_out"), ("1.bn1", "channel_norm"), ("1.conv2", "channel_in"))
    assert missing_styles(dict(plan)) == ["channel_in", "channel_norm", "channel_out"]
    case = _case(plan=plan)
    assert not case.has_baseline and _case().has_baseline
    rounds = {"approxdist:fp32": [1.0], "approxdist:bf16@fwd": [0.8]}
    rows = summarize([case], [[_result(rounds)]], steps=1)
    assert [r["ratio_vs_torch"] for r in rows] == [None, None]
    assert rows[1]["vs_fp32"] == pytest.approx(1.25)


def test_a_refused_case_raises_instead_of_giving_rows() -> None:
    with pytest.raises(BaselineMismatch, match="differs"):
        summarize([_case()], [[_result({}, refused="bench tp: the loss differs")]], steps=1)


def test_the_cli_refuses_a_run_whose_first_losses_differ_in_one_line_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The ranks' first losses are compared before any timing; a mismatch prints no table."""
    from approxdist.cli import bench_tp

    def ranks(measure: object, size: int, cases: list[TPBenchCase], *args: object,
              **kwargs: object) -> list[list[dict[str, object]]]:
        refused = first_step_mismatch([{"torch": 5.5, "approxdist:fp32": 5.6}] * size)
        return [[_result({}, refused=refused) for _ in cases] for _ in range(size)]

    monkeypatch.setattr(bench_tp, "run_on_ranks", ranks)
    assert main(["bench", "tp", "--codecs", "fp32"]) == 2
    out, err = capsys.readouterr()
    assert "torch 5.5, approxdist (fp32 wire) 5.6 on rank 0" in err and "samples/s" not in out
    assert len(err.strip().splitlines()) == 1, err


def test_torch_shards_of_head_ordered_attention_sum_to_the_whole() -> None:
    """What torch's ColwiseParallel (contiguous rows of `qkv`) and RowwiseParallel (columns
    of `proj`, the bias added once) make of `LocalHeads`, summed over 2 ranks, is the
    whole attention: each rank holds whole heads."""
    torch.manual_seed(0)
    full = CausalSelfAttention(dim=16, heads=4, dropout=0.0)
    heads = LocalHeads(full, size=2)
    x = torch.randn(3, 5, 16)
    total = torch.zeros(3, 5, 16)
    for rank in range(2):
        part = LocalHeads(full, size=2)
        rows, cols = slice(rank * 24, (rank + 1) * 24), slice(rank * 8, (rank + 1) * 8)
        part.qkv = torch.nn.Linear(16, 24)
        part.proj = torch.nn.Linear(8, 16, bias=False)
        with torch.no_grad():
            part.qkv.weight.copy_(heads.qkv.weight[rows])
            part.qkv.bias.copy_(heads.qkv.bias[rows])
            part.proj.weight.copy_(full.proj.weight[:, cols])
            total += part(x)
    with torch.no_grad():
        assert torch.allclose(total + full.proj.bias, full(x), atol=1e-6)


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "alexnet"], "has no tensor-parallel plan of its own"),
    (["--tp", "3"], "tp size 3 does not divide the 4 attention heads of 1.attn"),
    (["--codecs", "bf16,fp7"], "unknown codec spec 'fp7'; valid forms"),
    (["--wire", "sideways"], "--wire 'sideways'"),
    (["--link", "bw=fast"], "bandwidth 'fast'"),
    (["--tp", "1"], "--tp 1: tensor parallelism needs 2 or more ranks"),
    (["--steps", "0"], "--steps 0 must be >= 1"),
])
def test_bad_bench_input_is_one_line_exit_2_before_any_rank_starts(
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tp", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
