"""The profile file: validation on construction, JSON round trip, one-line errors for foreign files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.errors import DataError
from approxdist.planner.profile import (
    BlockProfile,
    Profile,
    from_json,
    median_profile,
    read_profile,
    to_json,
    write_profile,
)

PIPEDREAM_LINE = ("node2 -- Conv2d(3, 64) -- forward_compute_time=1.0, backward_compute_time=2.0, "
                  "activation_size=8.0, parameter_size=4.0\n")


def _block(name: str = "conv1", **changes: Any) -> BlockProfile:
    fields: dict[str, Any] = dict(name=name, fwd_s=0.002, bwd_s=0.004, out_bytes=4096,
                                  param_bytes=1728, stash_bytes=12288)
    fields.update(changes)
    return BlockProfile(**fields)


def _profile(**changes: Any) -> Profile:
    fields: dict[str, Any] = dict(model="tiny-cnn", input_shape=(3, 32, 32), micro_batch_size=8,
                                  threads=2, torch_version="2.5.1", machine="x86_64 2-core",
                                  blocks=(_block("conv1", acc_s=0.0005),
                                         _block("fc", fwd_s=0.0, out_bytes=40)))
    fields.update(changes)
    return Profile(**fields)


def test_json_round_trip_keeps_every_field(tmp_path: Path) -> None:
    profile = _profile(threads=None)
    assert from_json(to_json(profile)) == profile
    path = tmp_path / "tiny.json"
    write_profile(profile, path)
    assert read_profile(path) == profile
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("approxdist-profile", 1)
    assert data["blocks"][1] == {"name": "fc", "fwd_s": 0.0, "bwd_s": 0.004, "out_bytes": 40,
                                 "param_bytes": 1728, "stash_bytes": 12288, "acc_s": 0.0}
    assert data["blocks"][0]["acc_s"] == 0.0005


def test_parameter_tensor_sizes_round_trip_and_are_optional() -> None:
    """`param_sizes` (each tensor's bytes) is written where known, read back as a tuple,
    and absent in files that do not list them (PipeDream's, and ours before it)."""
    profile = _profile(blocks=(_block("conv1", param_sizes=(1728 - 64, 64)), _block("fc")))
    data = json.loads(to_json(profile))
    assert data["blocks"][0]["param_sizes"] == [1664, 64]
    assert "param_sizes" not in data["blocks"][1]
    back = from_json(to_json(profile))
    assert back == profile and back.blocks[0].param_sizes == (1664, 64)
    assert back.blocks[1].param_sizes == ()
    # as JSON gives it: a list is taken as the tuple
    assert _block(param_sizes=[1700, 28]).param_sizes == (1700, 28)
    with pytest.raises(DataError, match=r"profiles\[1\] differs from profiles\[0\] in blocks"):
        median_profile([profile, _profile()])


def test_a_block_without_acc_s_reads_as_not_accumulating() -> None:
    """Files written before `acc_s` (and PipeDream's) still read: 0 seconds."""
    data = json.loads(to_json(_profile()))
    for block in data["blocks"]:
        del block["acc_s"]
    assert [b.acc_s for b in from_json(json.dumps(data)).blocks] == [0.0, 0.0]


def test_totals_sum_the_blocks() -> None:
    profile = _profile()
    assert profile.total_compute_s == pytest.approx(0.002 + 0.004 + 0.0 + 0.004)
    assert profile.total_param_bytes == 2 * 1728
    assert profile.blocks[0].compute_s == pytest.approx(0.006)


def test_median_profile_takes_each_blocks_median_of_each_time() -> None:
    def at(f0: float, b0: float, a0: float, f1: float) -> Profile:
        return _profile(blocks=(_block("conv1", fwd_s=f0, bwd_s=b0, acc_s=a0),
                                _block("fc", fwd_s=f1, out_bytes=40)))

    got = median_profile([at(1.0, 5.0, 0.2, 3.0), at(3.0, 4.0, 0.1, 1.0), at(2.0, 9.0, 0.3, 2.0)])
    assert [(b.fwd_s, b.bwd_s, b.acc_s) for b in got.blocks] == [(2.0, 5.0, 0.2), (2.0, 0.004, 0.0)]
    assert got.model == "tiny-cnn" and got.blocks[1].out_bytes == 40
    two = median_profile([at(1.0, 1.0, 0.0, 1.0), at(2.0, 4.0, 0.0, 1.0)])  # even: the mean
    assert (two.blocks[0].fwd_s, two.blocks[0].bwd_s) == (1.5, 2.5)
    assert median_profile([_profile()]) == _profile()


@pytest.mark.parametrize("other, message", [
    (_profile(micro_batch_size=16), "profiles\\[1\\] differs from profiles\\[0\\] in micro_batch_size"),
    (_profile(threads=1), "in threads"),
    (_profile(blocks=(_block("conv1"),)), "in blocks"),
    (_profile(blocks=(_block("conv1"), _block("fc", out_bytes=41))), "in blocks"),
])
def test_median_profile_refuses_profiles_of_other_things(other: Profile, message: str) -> None:
    with pytest.raises(DataError, match=message):
        median_profile([_profile(), other])
    with pytest.raises(DataError, match="at least one profile"):
        median_profile([])


@pytest.mark.parametrize("changes, message", [
    ({"fwd_s": -0.001}, r"block 'conv1' fwd_s = -0\.001 must be a finite number of seconds >= 0"),
    ({"bwd_s": float("nan")}, r"block 'conv1' bwd_s = nan must be a finite number"),
    ({"fwd_s": "1ms"}, r"block 'conv1' fwd_s = '1ms' must be a finite number"),
    ({"fwd_s": True}, r"fwd_s = True must be a finite number"),
    ({"acc_s": -1e-3}, r"block 'conv1' acc_s = -0\.001 must be a finite number of seconds"),
    ({"out_bytes": -1}, r"block 'conv1' out_bytes = -1 must be a whole number of bytes >= 0"),
    ({"param_bytes": 1.5}, r"param_bytes = 1\.5 must be a whole number of bytes"),
    ({"stash_bytes": None}, r"stash_bytes = None must be a whole number of bytes"),
    ({"name": ""}, r"block name = '' must be a non-empty string"),
    ({"param_sizes": (1000, 700)}, r"block 'conv1' param_sizes sum to 1700 bytes, not its "
                                   r"param_bytes = 1728; list every parameter tensor"),
    ({"param_sizes": (1729, -1)}, r"block 'conv1' param_sizes\[1\] = -1 must be a whole number"),
    ({"param_sizes": 1728}, r"block 'conv1' param_sizes = 1728 must be a list of each "
                            r"parameter tensor's bytes"),
])
def test_block_errors_name_field_value_and_fix(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        _block(**changes)


@pytest.mark.parametrize("changes, message", [
    ({"blocks": ()}, r"profile blocks = \(\) must be a non-empty tuple of BlockProfile; profile "
                     r"at least one block"),
    ({"blocks": [_block()]}, r"profile blocks = \[.*\] must be a non-empty tuple"),
    ({"blocks": (_block(), _block())}, r"blocks\[1\] repeats the name 'conv1'; give every block"),
    ({"blocks": ("conv1",)}, r"profile blocks\[0\] = 'conv1' must be a BlockProfile"),
    ({"model": ""}, r"profile model = '' must be a non-empty string"),
    ({"torch_version": 2.5}, r"profile torch_version = 2\.5 must be a non-empty string"),
    ({"input_shape": (3, 0, 32)}, r"input_shape = \(3, 0, 32\) must be a non-empty tuple of positive"),
    ({"input_shape": [3, 32, 32]}, r"input_shape = \[3, 32, 32\] must be a non-empty tuple"),
    ({"micro_batch_size": 0}, r"micro_batch_size = 0 must be an integer >= 1"),
    ({"threads": 0}, r"threads = 0 must be an integer >= 1, or None where unknown"),
])
def test_profile_errors_name_field_value_and_fix(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        _profile(**changes)


def _edited(edit: Any) -> str:
    data = json.loads(to_json(_profile()))
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"^profile is not JSON \(.*line 1\); write one with approxdist\.planner\.write_profile, "
                  r"or convert a PipeDream graph\.txt"),
    (PIPEDREAM_LINE, r"not JSON .*it looks like a PipeDream graph\.txt: read it with "
                     r"approxdist\.planner\.read_pipedream_profile"),
    ('{"layers": []}', r"^profile is not an approxdist profile \(no 'blocks' key\); write one with"),
    ("[1, 2]", r"^profile is not an approxdist profile \(a JSON list\)"),
    (_edited(lambda d: d.update(version=7)), r"version = 7; this approxdist reads format "
                                             r"'approxdist-profile' version 1"),
    (_edited(lambda d: d.pop("format")), r"has format = None"),
    (_edited(lambda d: d.update(batch=3)), r"profile has unknown key\(s\) 'batch'; valid: format"),
    (_edited(lambda d: d.pop("machine")), r"profile lacks 'machine'; it needs all of"),
    (_edited(lambda d: d["blocks"][1].pop("stash_bytes")), r"profile blocks\[1\] lacks 'stash_bytes'"),
    (_edited(lambda d: d["blocks"].append(3)), r"profile blocks\[2\] = 3 must be an object with keys"),
    (_edited(lambda d: d["blocks"][0].update(fwd_s=-2)), r"^profile: block 'conv1' fwd_s = -2 must be"),
    (_edited(lambda d: d.update(blocks={})), r"profile blocks = \{\} must be a list of block objects"),
    (_edited(lambda d: d.update(blocks=[])), r"profile blocks = \(\) must be a non-empty tuple"),
])
def test_foreign_or_broken_json_gives_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(DataError, match=message) as info:
        from_json(text)
    assert "\n" not in str(info.value)


def test_read_profile_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match=r"profile file '.*nope\.json' does not exist; write one with"):
        read_profile(missing)
    foreign = tmp_path / "metrics.json"
    foreign.write_text('{"loss": 0.3}')
    with pytest.raises(DataError, match=r"^profile file '.*metrics\.json' is not an approxdist "
                                        r"profile \(no 'blocks' key\)"):
        read_profile(foreign)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(DataError, match=r"profile file '.*weights\.bin' cannot be read"):
        read_profile(binary)


def test_profiles_are_frozen() -> None:
    profile = _profile()
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.model = "other"


def test_what_a_profile_was_measured_on_round_trips_and_is_checked() -> None:
    profile = _profile(model_options={"hidden": 24, "depth": 2},
                       data={"dataset": "synthetic", "synthetic_shape": [10]})
    assert from_json(to_json(profile)) == profile
    assert profile.planned_for == {"model_options": {"hidden": 24, "depth": 2},
                                   "data": {"dataset": "synthetic", "synthetic_shape": [10]}}
    assert _profile().planned_for is None  # where unknown, the plan leaves them out
    with pytest.raises(DataError, match="profile model_options has unknown key 'widht'; "
                                        "known: "):
        _profile(model_options={"widht": 24})
    with pytest.raises(DataError, match="profile data = 'cifar' must be an object of dataset"):
        _profile(data="cifar")
