"""`approxdist schedule show|list`, driven through its own `register` (no processes)."""

from __future__ import annotations

import argparse

import pytest

from approxdist.cli import schedule_cmd
from approxdist.pipeline.errors import PipelineError, ScheduleError


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="approxdist")
    schedule_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_show_1f1b_prints_grid_bubble_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "1f1b", "--stages", "4", "--microbatches", "8"], capsys)
    lines = out.splitlines()
    assert lines[0] == "schedule 1f1b: 4 stages (one per rank), 8 micro-batches; valid"
    assert lines[1].split()[:2] == ["step", "0"] and lines[1].split()[-1] == "21"
    assert [line.split()[:2] for line in lines[2:6]] == [["rank", str(r)] for r in range(4)]
    assert "(P-1)/(M+P-1) = 3/11 = 0.273; simulated" in lines[6]
    assert lines[7] == ("peak in-flight activations per stage: "
                        "stage 0: 4, stage 1: 3, stage 2: 2, stage 3: 1")


def test_show_with_comm_prints_sends(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "show", "gpipe", "-p", "2", "-m", "2", "--with-comm"], capsys)
    assert "0SF0" in out and "1RF0" in out and "1SB1" in out


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["schedule", "list"], capsys)
    assert out.startswith("1f1b ") and "\ngpipe " in out


def test_errors_are_domain_errors() -> None:
    with pytest.raises(ScheduleError, match="valid: 1f1b, gpipe"):
        schedule_cmd.render_show("pipedream", 2, 2)
    with pytest.raises(PipelineError, match=r"micro-batches \(0\)"):
        schedule_cmd.render_show("gpipe", 2, 0)
