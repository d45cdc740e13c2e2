"""Every next step the CLI prints works as printed: `plan`'s "run it" line trains (for a
profile that names no data set, tests/unit/test_planner_plan_cli.py runs it), and
`analyze` of a data-parallel run whose all-reduce the trace cannot see names the flag
that makes it visible, which then does."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from approxdist.cli.main import main

DIGITS_MLP = ["--model", "mlp", "--epochs", "1", "--set", "model.hidden=32"]


def _last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def _printed_command(line: str, prefix: str) -> list[str]:
    """The arguments of the `approxdist ...` command `line` prints after `prefix`."""
    command = line.split(prefix, 1)[1].rstrip(")")
    words = shlex.split(command)
    assert words[0] == "approxdist", line
    return words[1:]


def test_the_plan_of_a_measured_profile_trains_as_printed(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "profile", "--model", "mlp", "--set", "model.hidden=24",
                 "--dataset", "synthetic", "--set", "data.synthetic_shape=[10]",
                 "--set", "data.synthetic_samples=64", "--microbatch-size", "4",
                 "--threads", "1", "--repeat", "1", "--json", "prof.json"]) == 0
    capsys.readouterr()
    assert main(["plan", "--profile", "prof.json", "--world-size", "2", "--link", "bw=1gbit",
                 "--json", "plan.json"]) == 0
    line = _last_line(capsys)
    assert line == "plan file: plan.json (run it: approxdist train --plan plan.json)"
    args = _printed_command(line, "run it: ")
    assert main([*args, "--epochs", "1", "--out", "run"]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()


def _analyze_traced(tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str) -> str:
    """What `approxdist analyze` prints for a traced 2-rank data-parallel run."""
    run = tmp_path / algorithm
    assert main(["train", *DIGITS_MLP, "--algorithm", algorithm, "--trace", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--no-png"]) == 0
    return capsys.readouterr().out


def test_analyze_names_the_flag_that_traces_the_all_reduce(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    out = _analyze_traced(tmp_path, capsys, "native")
    assert ("per link: no transfer events: the gradients' all-reduce ran inside "
            "torch.distributed (`native`, --algorithm native)") in out
    assert "train again with --algorithm ring" in out and "rec.transfer_hook" not in out
    out = _analyze_traced(tmp_path, capsys, "ring")  # the flag it names
    assert "per link and direction" in out and "no transfer events" not in out
