"""`approxdist bench tp` on 2 gloo ranks at a tiny size, through the CLI: both engines
compute the same first-step loss, every wire variant runs on every link, rows have their
keys and our wires' bytes follow their codecs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.benchmarks.tp import LOSS_RTOL
from approxdist.cli.main import main
from approxdist.models.gpt import SIZES
from tests.helpers.collective_oracles import allreduce_relative

#: the bf16 forward wire's bound on the first loss, relative: gpt-tiny's forward path
#: crosses two bf16 all-reduces per block (attention's output projection and the MLP's
#: second linear, `models.gpt.tp_plan`) of 2 ranks, each within (2 + 2) 2^-8 of its
#: inputs' magnitude; to first order the relative errors of roundings in sequence add
#: (each block's gain on a relative error taken as one: its residual path carries it
#: unchanged, and the layer norms undo a change of scale)
FWD_BF16_RTOL = 2 * SIZES["gpt-tiny"].layers * allreduce_relative("bf16", 2)

KEYS = {"engine", "model", "tp", "batch_size", "link", "codec", "wire", "fwd_codec",
        "bwd_codec", "error_feedback", "samples_per_s", "median_step_s", "ratio_vs_torch",
        "paired_ratio", "vs_fp32", "first_loss", "bytes_per_step", "host_steal_fraction"}


def test_bench_tp_compares_torch_and_every_wire_on_every_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tp.json"
    assert main(["bench", "tp", "--model", "gpt-tiny", "--batch-size", "2", "--rounds", "1",
                 "--steps", "1", "--codecs", "bf16", "--wire", "fwd,both", "--link", "none",
                 "--link", "bw=1gbit", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert all(set(r) == KEYS for r in rows)
    assert [(r["link"], r["engine"], r["fwd_codec"], r["bwd_codec"]) for r in rows] == [
        (link, engine, fwd, bwd) for link in ("none", "bw=1gbit")
        for engine, fwd, bwd in (("torch", "fp32", "fp32"), ("approxdist", "fp32", "fp32"),
                                 ("approxdist", "bf16", "fp32"), ("approxdist", "bf16", "bf16"))]
    for case in (rows[:4], rows[4:]):
        torch_row, fp32, fwd, both = case
        # the same computation: torch's first loss is our fp32 wire's (fp32 rounding);
        # a bf16 forward wire changes it (it rounds) by its roundings' bound only; the
        # backward wire has not run when the first loss is taken: both wires' loss is the
        # forward wire's, bit for bit
        assert fp32["first_loss"] == pytest.approx(torch_row["first_loss"], rel=LOSS_RTOL)
        assert fwd["first_loss"] != fp32["first_loss"]
        assert fwd["first_loss"] == pytest.approx(fp32["first_loss"], rel=FWD_BF16_RTOL)
        assert both["first_loss"] == fwd["first_loss"]
        assert torch_row["ratio_vs_torch"] == 1.0 and fp32["vs_fp32"] == 1.0
        assert all(r["samples_per_s"] > 0 and r["paired_ratio"] > 0 for r in case)
        # a bf16 wire halves what it carries: the forward wire alone, then both
        assert both["bytes_per_step"] < fwd["bytes_per_step"] < fp32["bytes_per_step"]
        assert both["bytes_per_step"] == pytest.approx(fp32["bytes_per_step"] / 2, rel=0.05)
    assert [r["bytes_per_step"] for r in rows[:4]] == [r["bytes_per_step"] for r in rows[4:]]
    printed = capsys.readouterr().out
    assert "vs torch" in printed and "checked before timing" in printed
    assert "reproduce: approxdist bench tp --model gpt-tiny --tp 2" in printed
