"""`approxdist.text`: the one comma-list parser, JSON writer and file reader the layers share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.errors import ConfigError, DataError
from approxdist.text import comma_list, name_list, read_json, read_text, write_json


def test_comma_list_parses_each_part_with_its_kind() -> None:
    assert comma_list("2,1,1", int, ConfigError("unused")) == (2, 1, 1)
    assert comma_list("7", int, ConfigError("unused")) == (7,)
    assert comma_list("0.5, 4,12", float, ConfigError("unused")) == (0.5, 4.0, 12.0)


@pytest.mark.parametrize("text", ["", "2,,1", "2,x", "1.5"])
def test_comma_list_raises_the_callers_error_on_a_bad_part(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--replicas .* e\.g\. 2,1,1$") as info:
        comma_list(text, int, ConfigError(f"--replicas {text!r}: e.g. 2,1,1"))
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_name_list_strips_each_name_and_drops_empty_items() -> None:
    assert name_list("ring, brd,,auto ") == ("ring", "brd", "auto")
    assert name_list("fp32") == ("fp32",)
    assert name_list(" , ") == ()


def test_write_json_makes_the_folder_and_ends_in_a_newline(tmp_path: Path) -> None:
    path = write_json(tmp_path / "a" / "b.json", {"x": [1, 2], "y": None})
    text = path.read_text()
    assert path == tmp_path / "a" / "b.json"
    assert text == json.dumps({"x": [1, 2], "y": None}, indent=1) + "\n"
    assert json.loads(text) == {"x": [1, 2], "y": None}


def test_read_json_reads_back_what_write_json_wrote(tmp_path: Path) -> None:
    path = write_json(tmp_path / "rows.json", [{"a": 1}, {"b": [2.5]}])
    assert read_json(path, "rows file", "unused") == [{"a": 1}, {"b": [2.5]}]
    assert read_text(path, "rows file", "unused") == path.read_text()


def test_a_missing_file_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(DataError) as info:
        read_json(path, "profile file", "write one with write_profile")
    assert str(info.value) == f"profile file {str(path)!r} does not exist; write one with write_profile"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_an_unreadable_file_says_why_in_the_callers_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^plan file '.*' cannot be read \(.*\); pass a plan$"):
        read_text(tmp_path, "plan file", "pass a plan", ConfigError)  # a folder, not a file
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes([0xff, 0xfe, 0x80]))
    with pytest.raises(DataError, match=r"^graph '.*weights\.bin' cannot be read \(.*\); fix$"):
        read_text(binary, "graph", "fix")


def test_a_file_that_is_not_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"a": 1,\n oops}')
    with pytest.raises(DataError, match=r"^calibration '.*bad\.json' is not JSON \(.* at line 2\); "
                                        r"fit one$"):
        read_json(path, "calibration", "fit one")
