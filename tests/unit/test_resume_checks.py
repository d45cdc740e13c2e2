"""What `--resume` checks before anything is written (`train/resumable.py`), the run
directory's checks (`train/run_dir.py`), damaged checkpoints (`train/checkpoint.py`) and a
sink whose output fails (`train/sink.py`): each refusal one line naming the values."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch

from approxdist.config.loader import build_config
from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.topology import Mesh
from approxdist.train.checkpoint import NAME, TMP_NAME, load_checkpoint, save_checkpoint
from approxdist.train.resumable import check_checkpoints, check_unchanged
from approxdist.train.resume import part_dir, parts
from approxdist.train.run_dir import check_can_make, check_writable, make_run_dir
from approxdist.train.sink import JsonlOutput, MetricsSink

PIPELINE = {"train": {"parallel": "pipeline", "world_size": 2, "epochs": 3},
            "pipeline": {"stages": 2}, "model": {"name": "mlp"}}


def _cfg(base: dict[str, dict[str, object]], **changes: dict[str, object]) -> Config:
    sections = {k: dict(v) for k, v in base.items()}
    for section, values in changes.items():
        sections.setdefault(section, {}).update(values)
    return build_config(sections)


def _progress(epoch: int) -> dict[str, object]:
    return {"epoch": epoch, "step": 11 * epoch, "history": [], "elapsed_s": 1.0,
            "bytes_sent": 0, "w": torch.ones(3)}


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(("changes", "flag", "said"), [
    ({"train": {"parallel": "dp"}}, "--parallel",
     "train.parallel = 'pipeline' and this asks for 'dp' (--parallel); a resumed run keeps "
     "its parallel mode: drop --parallel, or start a new run with --out DIR"),
    ({"pipeline": {"split": "3"}}, "--split",
     "pipeline.split = '' and this asks for '3' (--split); a resumed run keeps its pipeline "
     "partition: drop --split"),
    ({"pipeline": {"schedule": "1f1b"}}, "--schedule", "pipeline.schedule = 'gpipe'"),
    ({"model": {"hidden": 32}}, "--set model.hidden", "model.hidden = 256 and this asks for 32"),
    ({"train": {"mesh": "pp=3", "world_size": 3}, "pipeline": {"stages": 3}}, "--world-size",
     "train.world_size = 2 and this asks for 3 (--world-size)"),
])
def test_a_change_to_what_the_checkpoints_were_saved_for_is_refused(
        changes: dict[str, dict[str, object]], flag: str, said: str) -> None:
    saved = _cfg(PIPELINE)
    with pytest.raises(ConfigError) as exc:
        check_unchanged(saved, _cfg(PIPELINE, **changes), Path("rr"),
                        {k: flag for k in ("train.parallel", "pipeline.split",
                                           "pipeline.schedule", "model.hidden",
                                           "train.world_size")})
    assert _one_line(exc).startswith("--resume 'rr': the run was trained with ")
    assert said in str(exc.value)


def test_what_a_resumed_run_may_change_and_the_same_mesh_said_otherwise() -> None:
    saved = _cfg(PIPELINE)
    check_unchanged(saved, _cfg(PIPELINE, train={"epochs": 9, "mesh": "pp=2"},
                                optim={"lr": 0.01}, pipeline={"placement": [1, 0]},
                                model={"dropout": 0.1}), Path("rr"), {})
    hybrid = _cfg(PIPELINE, train={"parallel": "hybrid", "world_size": 3},
                  pipeline={"replicas": [2, 1]})
    with pytest.raises(ConfigError, match=r"train.mesh = 'pp=2,dp=2/1' and this asks for "
                                          r"'pp=2,dp=1/2'; .* set train.mesh back"):
        check_unchanged(hybrid, dataclasses.replace(hybrid, train=dataclasses.replace(
            hybrid.train, mesh="pp=2,dp=1/2")), Path("rr"), {})


def _staged(root: Path, epochs: dict[int, int]) -> Path:
    for stage, epoch in epochs.items():
        (root / f"stage{stage}").mkdir(parents=True, exist_ok=True)
        save_checkpoint(root / f"stage{stage}", _progress(epoch))
    return root


def test_every_stage_checkpoint_there_readable_and_at_one_epoch(tmp_path: Path) -> None:
    mesh = Mesh.pipeline(2)
    assert check_checkpoints(_staged(tmp_path / "ok", {0: 2, 1: 2}), mesh, 3) == 2
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(_staged(tmp_path / "differ", {0: 2, 1: 1}), mesh, 3)
    assert "stage checkpoints disagree: stage 0 at epoch 2; stage 1 at epoch 1" in _one_line(exc)
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(_staged(tmp_path / "one", {0: 2}), mesh, 3)
    assert f"{tmp_path / 'one' / 'stage1' / NAME} is missing while the other " \
           f"checkpoints are there (epoch 2)" in _one_line(exc)
    (tmp_path / "none").mkdir()
    with pytest.raises(ConfigError, match="the run finished no epoch: start it again without"):
        check_checkpoints(tmp_path / "none", mesh, 3)
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(_staged(tmp_path / "done", {0: 3, 1: 3}), mesh, 3)
    assert "the run has trained 3 of its 3 epochs already; ask for more with --epochs 4" \
        in _one_line(exc)


def test_every_shard_of_every_stage_has_its_checkpoint(tmp_path: Path) -> None:
    """A tensor-parallel mesh keeps one checkpoint per stage and shard (`stage<s>/shard<t>/`);
    the check names the part that is missing or behind."""
    mesh = Mesh.of({"pp": 2, "dp": 1, "tp": 2})
    assert parts(mesh) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert part_dir(tmp_path, mesh, 1, 0) == tmp_path / "stage1" / "shard0"
    assert part_dir(tmp_path, Mesh.of({"dp": 2, "tp": 2}), 0, 1) == tmp_path / "shard1"
    assert part_dir(tmp_path, Mesh.data_parallel(2), 0, 0) == tmp_path
    for stage, shard in parts(mesh):
        folder = part_dir(tmp_path, mesh, stage, shard)
        folder.mkdir(parents=True)
        save_checkpoint(folder, _progress(1 if (stage, shard) == (1, 1) else 2))
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(tmp_path, mesh, 3)
    assert ("stage checkpoints disagree: stage 0, shard 0 at epoch 2; stage 0, shard 1 at "
            "epoch 2; stage 1, shard 0 at epoch 2; stage 1, shard 1 at epoch 1") in _one_line(exc)
    (tmp_path / "stage0" / "shard1" / NAME).unlink()
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(tmp_path, mesh, 3)
    assert f"{tmp_path / 'stage0' / 'shard1' / NAME} is missing" in _one_line(exc)


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "an empty or cut-off file"),
    (b"PK\x03\x04 not a zip", "failed reading zip archive"),
    (pickle.dumps({"a": object}), "Weights only load failed"),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path: Path, content: bytes,
                                                          reason: str) -> None:
    (tmp_path / NAME).write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(tmp_path)
    assert _one_line(exc).startswith(f"checkpoint '{tmp_path / NAME}' cannot be read (")
    assert reason in str(exc.value) and "restore it from a copy" in str(exc.value)
    assert len(str(exc.value)) < 400  # torch's explanation is not repeated whole


def test_a_cut_off_checkpoint_and_one_that_is_not_a_table(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _progress(1))
    whole = (tmp_path / NAME).read_bytes()
    (tmp_path / NAME).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match="cannot be read"):
        load_checkpoint(tmp_path)
    torch.save([1, 2], tmp_path / NAME)
    with pytest.raises(ConfigError, match="it holds a list, not a table of named state"):
        load_checkpoint(tmp_path)
    torch.save({"w": torch.ones(1)}, tmp_path / NAME)
    with pytest.raises(ConfigError, match="has no epoch count"):
        check_checkpoints(tmp_path, Mesh.single(), 3)


def test_a_failed_checkpoint_write_leaves_the_last_one_and_no_temporary_file(
        tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _progress(1))
    before = (tmp_path / NAME).read_bytes()
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    (tmp_path / TMP_NAME).symlink_to("/dev/full")  # writes fail with ENOSPC
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, _progress(2))
    assert (tmp_path / NAME).read_bytes() == before
    assert not (tmp_path / TMP_NAME).exists() and not (tmp_path / TMP_NAME).is_symlink()
    assert load_checkpoint(tmp_path)["epoch"] == 1


def test_a_run_directory_that_cannot_be_made_or_written(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError) as exc:
        make_run_dir(afile / "run", "--out")
    assert _one_line(exc).startswith(f"--out '{afile / 'run'}': cannot make that folder (")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_can_make(afile / "run" / "deeper", "--out")
    with pytest.raises(ConfigError, match="cannot write into that folder"):
        check_writable(afile, "--resume")
    check_can_make(tmp_path / "new" / "run", "--out")
    assert not (tmp_path / "new").exists()  # nothing made
    make_run_dir(tmp_path / "new" / "run", "--out")
    assert sorted((tmp_path / "new" / "run").iterdir()) == []  # the probe is gone


def test_a_sink_output_that_fails_is_kept_as_its_problem(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    ok = JsonlOutput(tmp_path / "metrics.jsonl")
    sink = MetricsSink([JsonlOutput("/dev/full"), ok])
    sink.write({"kind": "step", "step": 1})
    assert sink.problem == "cannot write the metrics /dev/full (No space left on device)"
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] \
        == [{"kind": "step", "step": 1}]  # the other outputs still get it


def test_a_resumed_jsonl_drops_what_the_stopped_run_wrote_past_its_checkpoint(
        tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"kind": "wires", "step": 0}, {"kind": "step", "step": 10},
               {"kind": "epoch", "step": 22}, {"kind": "step", "step": 30},
               {"kind": "epoch", "step": 44}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "st')
    JsonlOutput(path).open(22)
    assert [json.loads(x) for x in path.read_text().splitlines()] == records[:3]
    JsonlOutput(path).open(0)  # a fresh start leaves the file to the caller
    assert len(path.read_text().splitlines()) == 3
