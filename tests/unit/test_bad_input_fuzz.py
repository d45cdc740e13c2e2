"""Random and cut-off input to the command line, as a careless or unlucky user gives it:
config files (TOML), plan files (JSON), profiles (ours and PipeDream's), codec, channel,
link, mesh and other spec strings, checkpoints and a resumed run's saved config. Every
outcome is exit 0 or exactly one line `approxdist: error: ...` with exit 2, never a
traceback or a warning; `train --check` writes nothing (no run directory, no TensorBoard
folder) either way.

In-process (`approxdist.cli.main.main`), derandomized (the same cases on every run) and
without deadlines, so a loaded machine makes it slower, never flaky; more than 2,000 cases.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approxdist.cli import main as cli_main
from approxdist.cli.main import main
from approxdist.config.loader import build_config, to_dict, write_config
from approxdist.config.schema import Config
from approxdist.planner.plan_file import MODEL_KEYS
from approxdist.train.checkpoint import NAME, save_checkpoint

PIPEDREAM = Path(__file__).parents[1] / "data" / "pipedream-profiles" / "alexnet.txt"
TINY = ["--model", "mlp", "--set", "model.hidden=8", "--epochs", "1", "--out", "run"]
#: the saved runs' data: 64 synthetic 8x8 images (made in no time, unlike a data set read
#: from its file, which every resumed case would load again)
SMALL_DATA = {"dataset": "synthetic", "synthetic_shape": [1, 8, 8], "synthetic_samples": 64}


def fuzz(cases: int) -> Any:
    """The same `cases` examples on every run, no deadline, no example database."""
    return settings(max_examples=cases, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def answered(argv: list[str]) -> int:
    """Run `approxdist argv`; check the outcome is exit 0 with nothing on stderr, or one
    error line with exit 2 (a traceback fails the test with its exception)."""
    out, err = io.StringIO(), io.StringIO()
    before = set(Path().iterdir())
    with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert not seen, [str(w.message) for w in seen]
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("approxdist: error: "), lines
    else:
        assert code == 0 and not lines, (code, lines)
    if argv[0] == "train":  # `--check` writes nothing, whatever its outcome
        assert set(Path().iterdir()) == before
        assert code != 0 or "check passed" in out.getvalue()
    return code


@pytest.fixture(scope="module", autouse=True)
def in_a_scratch_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Relative paths the cases name (data folders, TensorBoard folders) land here; one
    torch thread (the cases' tensors are tiny: more threads only contend on a shared
    machine); `main` parses every case with one parser, built once (building it costs more
    than most cases)."""
    here, threads = os.getcwd(), torch.get_num_threads()
    root = tmp_path_factory.mktemp("fuzz")
    os.chdir(root)
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_main, "build_parser", functools.cache(cli_main.build_parser))
        yield root
    torch.set_num_threads(threads)
    os.chdir(here)


# -- values a user might type --------------------------------------------------------------
WORDS = ["", "auto", "fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "bits:s1e6m1",
         "bits:s0e2+2m0", "bits:auto4", "table4", "adaprec:fp32,bf16", "ber:1e-3@5",
         "bw=100mbit,lat=1ms", "bw=20gbit", "dp=2", "pp=2,dp=2", "pp=2,dp=2/1", "role=2,dp=1/2",
         "gpipe", "1f1b", "2bw", "pipedream", "ring", "native", "vhd", "sync", "async",
         "ssp:2", "backup:1", "dp", "pipeline", "hybrid", "ps", "single", "mlp", "resnet20",
         "digits", "synthetic", "cifar10", "imagefolder", "params", "time", "none", "rank",
         "row", "measure", "off", "cpu", "cuda", "3", "3,7", "1,0", "*.bias=fp32",
         "type:Linear.weight=bf16", "policy:seed004", "policy:fastest", "2:100ms",
         "random:0.1:5ms", "nan", "-1", "stop", "continue", "cosine", "grow", "step"]
SPEC_CHARS = "0123456789abdefmnprstw:+@.,=/-_*"
text = st.one_of(st.sampled_from(WORDS), st.text(SPEC_CHARS, max_size=12),
                 st.builds(str.__add__, st.sampled_from(WORDS), st.text(SPEC_CHARS, max_size=6)))
small = st.integers(-2, 70)  # sizes, counts, epochs: large enough to pass, small to build
scalar = st.one_of(small, st.sampled_from([2**31, -(2**63)]), st.booleans(), text,
                   st.floats(allow_nan=True, allow_infinity=True, width=32))
value = st.one_of(scalar, st.lists(st.integers(-1, 9), max_size=4), st.lists(text, max_size=3),
                  st.dictionaries(st.sampled_from(["hidden", "depth", "x-y", "1a"]), small,
                                  max_size=2))
SECTIONS = {name: [*keys, "bogus"] for name, keys in to_dict(Config()).items()}
WIRES = st.dictionaries(st.sampled_from(["grad", "fwd", "bwd", "push", "pull", "tp_fwd", "tp_bwd",
                                          "mail"]),
                        st.dictionaries(st.sampled_from(["codec", "channel", "error_feedback",
                                                         "rules", "times", "x"]), value,
                                        max_size=3), max_size=2)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A config file's tables: known and unknown sections and keys, values of any type."""
    out: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "extra"]), max_size=4)):
        if section == "wire":
            out["wire"] = draw(WIRES)
            continue
        keys = SECTIONS.get(section, ["x"])
        out[section] = draw(st.dictionaries(st.sampled_from(keys), value, max_size=4))
    return out


def cut_or_changed(whole: bytes) -> st.SearchStrategy[bytes]:
    """`whole` cut off anywhere, or with a few bytes changed."""
    at = st.integers(0, max(0, len(whole) - 1))
    cut = at.map(lambda n: whole[:n])
    changed = st.lists(st.tuples(at, st.integers(0, 255)), min_size=1, max_size=4).map(
        lambda edits: _edit(whole, edits))
    return st.one_of(cut, changed)


def _edit(whole: bytes, edits: list[tuple[int, int]]) -> bytes:
    data = bytearray(whole)
    for at, byte in edits:
        if data:
            data[at % len(data)] = byte
    return bytes(data)


# -- config files -------------------------------------------------------------------------
@fuzz(500)
@given(configs())
def test_config_files_of_any_keys_and_values(tables: dict[str, Any]) -> None:
    Path("c.toml").write_text(tomli_w.dumps(tables))
    answered(["train", "--check", "--config", "c.toml", *TINY])


@fuzz(200)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_config_files_of_random_bytes(content: bytes) -> None:
    Path("c.toml").write_bytes(content)
    answered(["train", "--check", "--config", "c.toml", *TINY])


VALID_TOML = tomli_w.dumps(to_dict(build_config({
    "train": {"parallel": "pipeline", "world_size": 2}, "pipeline": {"stages": 2}}))).encode()


@fuzz(150)
@given(cut_or_changed(VALID_TOML))
def test_config_files_cut_off_or_changed(content: bytes) -> None:
    Path("c.toml").write_bytes(content)
    answered(["train", "--check", "--config", "c.toml", *TINY])


# -- plan files ---------------------------------------------------------------------------
stages = st.lists(st.fixed_dictionaries(
    {"replicas": st.one_of(small, text)},
    optional={"blocks": st.lists(st.integers(-1, 6), max_size=3),
              "ranks": st.lists(st.integers(-1, 4), max_size=3)}), max_size=4)
plans = st.fixed_dictionaries({"stages": st.one_of(stages, value)}, optional={
    "format": st.sampled_from(["approxdist-plan", "approxdist-profile", "x"]),
    "version": st.one_of(st.integers(0, 3), text),
    "model": st.sampled_from(["mlp", "resnet20", "nope", "", 3]),
    "model_options": st.dictionaries(st.sampled_from([*MODEL_KEYS, "x"]), small, max_size=2),
    "data": st.dictionaries(st.sampled_from(["dataset", "data_dir", "synthetic_classes", "y"]),
                            st.one_of(small, text), max_size=2),
    "input_shape": st.lists(st.integers(-1, 9), max_size=4),
    "micro_batch_size": small, "world_size": small, "microbatches": small,
    "mode": st.sampled_from(["dp", "pipeline", "hybrid", "ps", "x"]),
    "schedule": text, "fwd_codec": text, "bwd_codec": text, "grad_codec": text,
    "algorithm": text, "link": st.one_of(text, st.dictionaries(st.sampled_from(["intra", "x"]),
                                                                text, max_size=2)),
    "predicted": st.dictionaries(st.sampled_from(["time_per_step_s", "x"]), value, max_size=2),
})
json_values = st.recursive(st.one_of(st.none(), st.booleans(), small, text, st.floats()),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(text, inner, max_size=3)),
                           max_leaves=8)
VALID_PLAN = json.dumps({"format": "approxdist-plan", "version": 1, "model": "mlp",
                         "model_options": {"hidden": 8}, "world_size": 2, "mode": "pipeline",
                         "stages": [{"blocks": [0, 2], "replicas": 1},
                                    {"blocks": [2, 4], "replicas": 1}],
                         "schedule": "gpipe", "microbatches": 4}).encode()


@fuzz(300)
@given(st.one_of(plans.map(lambda p: json.dumps(p).encode()),
                 json_values.map(lambda v: json.dumps(v).encode()),
                 cut_or_changed(VALID_PLAN)))
def test_plan_files(content: bytes) -> None:
    Path("plan.json").write_bytes(content)
    answered(["train", "--check", "--plan", "plan.json", "--epochs", "1", "--out", "run"])


# -- profiles -----------------------------------------------------------------------------
blocks = st.lists(st.fixed_dictionaries(
    {"name": st.one_of(text, small), "fwd_s": st.one_of(st.floats(-1, 1), text),
     "bwd_s": st.floats(allow_nan=True), "out_bytes": st.one_of(small, st.floats()),
     "param_bytes": small, "stash_bytes": small},
    optional={"acc_s": st.floats(-1, 1), "param_sizes": st.lists(small, max_size=2),
              "x": small}), max_size=5)
profiles = st.fixed_dictionaries({"blocks": st.one_of(blocks, value)}, optional={
    "format": st.sampled_from(["approxdist-profile", "approxdist-plan"]),
    "version": st.one_of(st.integers(0, 2), text), "model": st.one_of(text, small),
    "input_shape": st.lists(st.integers(-1, 9), max_size=4), "micro_batch_size": small,
    "threads": st.one_of(st.none(), small), "torch_version": text, "machine": text,
    "model_options": st.dictionaries(st.sampled_from([*MODEL_KEYS, "x"]), small, max_size=2)})


@fuzz(200)
@given(st.one_of(profiles.map(lambda p: json.dumps(p).encode()),
                 cut_or_changed(PIPEDREAM.read_bytes()[:3000])),
       st.sampled_from(["1", "2", "4"]))
def test_profiles_to_plan_from(content: bytes, world: str) -> None:
    Path("profile.json").write_bytes(content)
    answered(["plan", "--profile", "profile.json", "--world-size", world])


# -- spec strings -------------------------------------------------------------------------
SPEC_FLAGS = [("--codec", "dp"), ("--fwd-codec", "pipeline"), ("--bwd-codec", "hybrid"),
              ("--fwd-channel", "pipeline"), ("--bwd-channel", "pipeline"),
              ("--pull-codec", "ps"), ("--push-channel", "ps"), ("--link", "dp"),
              ("--mesh", "hybrid"), ("--mesh", "dp"), ("--mesh", "ps"), ("--codec-rule", "dp"),
              ("--ps-mode", "ps"), ("--straggler", "dp"), ("--split", "pipeline"),
              ("--replicas", "hybrid"), ("--placement", "pipeline"), ("--algorithm", "dp"),
              ("--schedule", "pipeline"), ("--calibration", "dp"), ("--tp-plan", "tensor"),
              ("--fwd-codec", "tensor"), ("--bwd-channel", "tensor"), ("--mesh", "tensor"),
              ("--tp-plan", "pipeline")]


@fuzz(400)
@given(st.sampled_from(["dp", "pipeline", "hybrid", "ps", "tensor"]),
       st.lists(st.tuples(st.sampled_from(SPEC_FLAGS), text), min_size=1, max_size=3))
def test_spec_strings(mode: str, specs: list[tuple[tuple[str, str], str]]) -> None:
    flags = [f"{flag}={spec}" for (flag, _), spec in specs]
    answered(["train", "--check", f"--parallel={specs[0][0][1] or mode}", *flags, *TINY])


# -- checkpoints and a resumed run's config ------------------------------------------------
@pytest.fixture(scope="module")
def saved_run(in_a_scratch_folder: Path) -> Path:
    """A finished 1-epoch single-process run (its checkpoint and config.toml)."""
    run = in_a_scratch_folder / "saved"
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["train", "--parallel", "single", "--out", str(run),
                     "--set", "train.progress=false", *TINY[:-2],
                     *[f"--set=data.{key}={json.dumps(value)}"
                       for key, value in SMALL_DATA.items()]]) == 0
    return run


torch_objects = st.recursive(
    st.one_of(st.none(), small, text, st.booleans(), st.just(torch.ones(2))),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["epoch", "step", "history", "w",
                                                             "elapsed_s", "bytes_sent"]),
                                            inner, max_size=6)), max_leaves=8)


@fuzz(250)
@given(st.data())
def test_checkpoints_cut_changed_or_foreign(saved_run: Path, data: st.DataObject) -> None:
    whole = (saved_run / NAME).read_bytes()
    run = Path("ck")
    if not run.exists():
        shutil.copytree(saved_run, run)
    kind = data.draw(st.sampled_from(["cut", "torch", "bytes"]))
    if kind == "torch":
        torch.save(data.draw(torch_objects), run / NAME)
    else:
        content = data.draw(cut_or_changed(whole) if kind == "cut" else st.binary(max_size=300))
        (run / NAME).write_bytes(content)
    answered(["train", "--check", "--resume", "ck", "--epochs", "2"])


PIPELINE_RUN = {"train": {"parallel": "pipeline", "world_size": 2, "epochs": 1},
                "pipeline": {"stages": 2}, "model": {"name": "mlp", "hidden": 8},
                "data": SMALL_DATA}


@fuzz(150)
@given(st.lists(st.one_of(st.none(), st.integers(-1, 3), text, st.booleans(),
                          st.binary(max_size=40)), min_size=2, max_size=2))
def test_stage_checkpoints_missing_disagreeing_or_damaged(stage_epochs: list[Any]) -> None:
    run = Path("pp")
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    write_config(build_config(PIPELINE_RUN), run / "config.toml")
    for stage, epoch in enumerate(stage_epochs):
        folder = run / f"stage{stage}"
        folder.mkdir()
        if isinstance(epoch, bytes):
            (folder / NAME).write_bytes(epoch)
        elif epoch is not None:
            save_checkpoint(folder, {"epoch": epoch, "step": 1, "history": [],
                                     "elapsed_s": 0.0, "bytes_sent": 0})
    answered(["train", "--check", "--resume", "pp", "--epochs", "2"])


@fuzz(150)
@given(st.data())
def test_a_resumed_runs_config_cut_or_changed(saved_run: Path, data: st.DataObject) -> None:
    run = Path("cf")
    if not run.exists():
        shutil.copytree(saved_run, run)
    saved = (saved_run / "config.toml").read_bytes()
    (run / "config.toml").write_bytes(data.draw(cut_or_changed(saved)))
    answered(["train", "--check", "--resume", "cf", "--epochs", "2"])
