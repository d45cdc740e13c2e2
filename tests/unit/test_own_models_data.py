"""A user's own model factory, image folder and .npz arrays: what loads, and one clear
line (exit 2) for what does not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from approxdist.cli.main import main
from approxdist.config.loader import load_config, parse_overrides
from approxdist.config.schema import DataConfig, ModelConfig
from approxdist.data import load_dataset
from approxdist.errors import ConfigError, DataError, ModelError
from approxdist.models import build_model

HELPERS = "tests.helpers.user_models"


def _model(name: str, **args: object) -> nn.Sequential:
    return build_model(ModelConfig(name=f"{HELPERS}:{name}", args=dict(args)), (4, 4), 3)


def test_factory_gets_its_args_shape_and_classes() -> None:
    model = _model("small_mlp", hidden=5)
    assert len(model) == 2 and model(torch.randn(2, 4, 4)).shape == (2, 3)
    assert model[0][1].out_features == 5
    assert len(_model("as_list")) == 2  # a list of blocks is wrapped


@pytest.mark.parametrize(("name", "args", "match"), [
    ("nosuch_module_xyz:f", {}, "cannot import 'nosuch_module_xyz'"),
    (f"{HELPERS}:missing", {}, "has no function 'missing'"),
    (f"{HELPERS}:NOT_A_FUNCTION", {}, "has no function"),
    (f"{HELPERS}:not_blocks", {}, "returned Linear, not an nn.Sequential"),
    (f"{HELPERS}:small_mlp", {"width": 3}, "refused the arguments"),
    (f"{HELPERS}:", {}, "package.module:function"),
])
def test_factory_errors_are_one_line(name: str, args: dict[str, object], match: str) -> None:
    with pytest.raises(ModelError, match=match) as err:
        build_model(ModelConfig(name=name, args=args), (4, 4), 3)
    assert "\n" not in str(err.value)


def test_model_args_from_overrides() -> None:
    cfg = load_config(None, parse_overrides(["model.args.hidden=6", "model.args.act='relu'"]))
    assert cfg.model.args == {"hidden": 6, "act": "relu"}
    with pytest.raises(ConfigError, match="not a Python argument name"):
        ModelConfig(args={"not-a-name": 1})


def _png(path: Path, size: tuple[int, int], value: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, dtype=np.uint8)).save(path)


def test_image_folder_loads_classes(tmp_path: Path) -> None:
    for c, cls in enumerate(("cat", "dog")):
        for i in range(5):
            _png(tmp_path / cls / f"{i}.png", (6, 5), 40 * c + i)
    data = load_dataset(DataConfig(dataset="imagefolder", data_dir=str(tmp_path)))
    assert data.num_classes == 2 and data.input_shape == (3, 5, 6)
    assert len(data.train_y) + len(data.test_y) == 10
    assert set(data.train_y.tolist()) | set(data.test_y.tolist()) == {0, 1}


@pytest.mark.parametrize(("layout", "match"), [
    ("empty", "no class sub-folders"),
    ("mixed", "mixes sizes"),
    ("missing", "does not exist"),
])
def test_image_folder_errors(tmp_path: Path, layout: str, match: str) -> None:
    root = tmp_path / "imgs"
    if layout != "missing":
        root.mkdir()
    if layout == "mixed":
        _png(root / "a" / "0.png", (4, 4), 1)
        _png(root / "b" / "0.png", (5, 4), 1)
    with pytest.raises(DataError, match=match) as err:
        load_dataset(DataConfig(dataset="imagefolder", data_dir=str(root)))
    assert "\n" not in str(err.value)


def test_npz_classification_and_tokens(tmp_path: Path) -> None:
    gen = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x_train=gen.normal(size=(20, 3)).astype(np.float32),
             y_train=gen.integers(0, 4, 20), x_test=gen.normal(size=(5, 3)),
             y_test=gen.integers(0, 4, 5))
    data = load_dataset(DataConfig(dataset="npz", data_dir=str(tmp_path / "c.npz")))
    assert data.task == "classify" and data.input_shape == (3,) and len(data.test_y) == 5
    ids = gen.integers(0, 50, (30, 9))
    np.savez(tmp_path / "t.npz", x_train=ids[:, :-1], y_train=ids[:, 1:])
    text = load_dataset(DataConfig(dataset="npz", data_dir=str(tmp_path / "t.npz")))
    assert text.task == "next-token" and text.input_shape == (8,)
    assert len(text.train_x) + len(text.test_x) == 30 and text.num_classes <= 50


@pytest.mark.parametrize(("arrays", "match"), [
    ({"x": np.zeros((3, 2)), "y": np.zeros(3)}, "lacks the array.*x_train, y_train.*has x, y"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.zeros(3, dtype=int),
      "x_test": np.zeros((1, 2))}, "lacks the array.*y_test"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.zeros(2, dtype=int)}, "3 samples, y_train 2"),
    ({"x_train": np.zeros((3, 2)), "y_train": np.zeros(3)}, "integers >= 0"),
])
def test_npz_errors(tmp_path: Path, arrays: dict[str, np.ndarray], match: str) -> None:
    np.savez(tmp_path / "d.npz", **arrays)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=match) as err:
        load_dataset(DataConfig(dataset="npz", data_dir=str(tmp_path / "d.npz")))
    assert "\n" not in str(err.value)


def test_npz_that_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(DataError, match="not a NumPy .npz file"):
        load_dataset(DataConfig(dataset="npz", data_dir=str(tmp_path / "bad.npz")))


def test_cli_trains_own_model_on_own_arrays(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    gen = np.random.default_rng(1)
    y = gen.integers(0, 3, 300)
    x = (np.eye(3)[y] * 3 + gen.normal(size=(300, 3))).astype(np.float32)
    np.savez(tmp_path / "d.npz", x_train=x.reshape(300, 3, 1), y_train=y)
    base = ["train", "--parallel", "single", "--world-size", "1", "--dataset", "npz",
            "--data-dir", str(tmp_path / "d.npz"), "--batch-size", "16", "--epochs", "3",
            "--set", "train.progress=false"]
    out = tmp_path / "run"
    assert main([*base, "--model", f"{HELPERS}:small_mlp", "--set", "model.args.hidden=6",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == f"{HELPERS}:small_mlp" and summary["epochs"] == 3
    assert summary["test_accuracy"] > 0.8  # three well-separated clusters
    assert main([*base, "--model", f"{HELPERS}:not_blocks", "--out", str(tmp_path / "b")]) == 2
    assert "not an nn.Sequential of blocks" in capsys.readouterr().err
