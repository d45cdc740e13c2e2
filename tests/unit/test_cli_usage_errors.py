"""A flag argparse cannot parse (a word for a number, a choice that is not one, a missing
value, an unknown command) is one line naming the command, the flag and where the help
is, exit 2, at every level of sub-commands; `--help` still prints the usage."""

from __future__ import annotations

import pytest

from approxdist.cli.main import main


@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--tp", "x"], "approxdist train: error: argument --tp: invalid int value: 'x'; "
                             "see approxdist train --help"),
    (["train", "--epochs", "1.5"], "approxdist train: error: argument --epochs: invalid int"),
    (["train", "--parallel", "nope"], "approxdist train: error: argument --parallel: invalid "
                                      "choice: 'nope'"),
    (["bench", "tp", "--rounds", "y"], "approxdist bench tp: error: argument --rounds"),
    (["plan", "show", "--mesh"], "approxdist plan show: error: argument --mesh: expected one"),
    (["evaluate"], "approxdist evaluate: error: the following arguments are required: RUN"),
    (["bogus"], "approxdist: error: argument COMMAND: invalid choice: 'bogus'"),
])
def test_an_unparsable_flag_is_one_line_exit_2(argv: list[str], line: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_help_still_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage: approxdist evaluate")
