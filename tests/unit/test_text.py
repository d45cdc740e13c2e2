"""`approxdist.text`: the one comma-list parser and JSON writer the layers share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.errors import ConfigError
from approxdist.text import comma_list, write_json


def test_comma_list_parses_each_part_with_its_kind() -> None:
    assert comma_list("2,1,1", int, ConfigError("unused")) == (2, 1, 1)
    assert comma_list("7", int, ConfigError("unused")) == (7,)
    assert comma_list("0.5, 4,12", float, ConfigError("unused")) == (0.5, 4.0, 12.0)


@pytest.mark.parametrize("text", ["", "2,,1", "2,x", "1.5"])
def test_comma_list_raises_the_callers_error_on_a_bad_part(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--replicas .* e\.g\. 2,1,1$") as info:
        comma_list(text, int, ConfigError(f"--replicas {text!r}: e.g. 2,1,1"))
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_write_json_makes_the_folder_and_ends_in_a_newline(tmp_path: Path) -> None:
    path = write_json(tmp_path / "a" / "b.json", {"x": [1, 2], "y": None})
    text = path.read_text()
    assert path == tmp_path / "a" / "b.json"
    assert text == json.dumps({"x": [1, 2], "y": None}, indent=1) + "\n"
    assert json.loads(text) == {"x": [1, 2], "y": None}
