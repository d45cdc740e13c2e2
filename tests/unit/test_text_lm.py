"""The GPT blocks, the stdlib-text data set and the next-token task."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.config.schema import DataConfig, ModelConfig
from approxdist.data import ShardedBatches, load_dataset
from approxdist.data.base import TensorDataset
from approxdist.data.text import is_validation, load_stdlib_text, split_files, windows
from approxdist.errors import DataError, ModelError
from approxdist.models import build_model
from approxdist.models.gpt import SIZES
from approxdist.pipeline.stage import StageCompute, output_shape
from approxdist.train.task import check_fits, task_named

TOKENS = task_named("next-token")


@pytest.mark.parametrize("name", sorted(SIZES))
def test_gpt_sizes_are_blocks_of_one_tensor(name: str) -> None:
    model = build_model(ModelConfig(name=name), (16,), 256)
    assert len(model) == SIZES[name].layers + 2  # embedding, blocks, head
    ids = torch.randint(0, 256, (3, 16))
    h = ids
    for block in model:  # every cut carries one (batch, seq, dim) tensor
        h = block(h)
        if block is not model[-1]:
            assert h.shape == (3, 16, SIZES[name].dim)
    assert h.shape == (3, 16, 256)
    assert output_shape(model[:1], (16,), torch.device("cpu"), torch.int64) == (16, SIZES[name].dim)


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt-tiny"), (12,), 64).eval()
    a = torch.randint(0, 64, (1, 12))
    b = a.clone()
    b[0, 7:] = (b[0, 7:] + 1) % 64  # change the future only
    with torch.no_grad():
        torch.testing.assert_close(model(a)[:, :7], model(b)[:, :7])
        assert not torch.allclose(model(a)[:, 7:], model(b)[:, 7:])


def test_gpt_refuses_images() -> None:
    with pytest.raises(ModelError, match="stdlib-text"):
        build_model(ModelConfig(name="gpt-tiny"), (1, 8, 8), 10)


def test_windows_are_inputs_and_next_bytes() -> None:
    x, y = windows(b"abcdefghij", 3)
    assert x.dtype == torch.int64 and x.shape == (3, 3)
    assert bytes(x[1].tolist()) == b"def" and bytes(y[1].tolist()) == b"efg"


def test_split_by_file_name(tmp_path: Path) -> None:
    names = [f"m{i}.py" for i in range(40)]
    for n in names:
        (tmp_path / n).write_text(f"# {n}\n" * 20)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "inner.py").write_text("x = 1\n")
    train, valid = split_files(tmp_path)
    assert {p.name for p in valid} == {n for n in names if is_validation(n)}
    assert {p.name for p in train} | {p.name for p in valid} == set(names)  # no subpackages
    data = load_stdlib_text(8, tmp_path)
    assert data.task == "next-token" and data.num_classes == 256 and data.input_shape == (8,)
    valid_text = b"".join(p.read_bytes() for p in valid)
    assert bytes(data.test_x[0].tolist()) == valid_text[:8]


def test_stdlib_text_is_deterministic_and_bounded() -> None:
    a = load_dataset(DataConfig(dataset="stdlib-text", seq_len=32))
    b = load_dataset(DataConfig(dataset="stdlib-text", seq_len=32))
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert a.train_x.numel() <= 1 << 18 and len(a.test_x) > 0
    assert torch.equal(a.train_x[:, 1:], a.train_y[:, :-1])
    shards = [list(ShardedBatches(a, 8, r, 2, seed=3).epoch(0))[0] for r in range(2)]
    whole = next(ShardedBatches(a, 8, 0, 1, seed=3).epoch(0))
    assert torch.equal(torch.cat([s[0] for s in shards]), whole[0])


def test_empty_stdlib_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="standard-library"):
        load_stdlib_text(8, tmp_path)


def test_next_token_loss_and_hits() -> None:
    out = torch.randn(2, 5, 7)
    y = torch.randint(0, 7, (2, 5))
    ref = F.cross_entropy(out.permute(0, 2, 1), y)
    torch.testing.assert_close(TOKENS(out, y), ref)
    assert int(TOKENS.hits(out, y)) == int((out.argmax(-1) == y).sum())
    assert TOKENS.predictions(y) == 10 and TOKENS.per_sample(y) == 5
    torch.testing.assert_close(TOKENS.summed_loss(out, y), ref * 10)
    classes = task_named("classify")
    assert classes.per_sample(y[:, 0]) == 1


def test_stage_scores_with_the_task() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt-tiny"), (6,), 16)
    stage = StageCompute(model, is_first=True, is_last=True, loss_fn=TOKENS)
    x = torch.randint(0, 16, (3, 6))
    y = torch.randint(0, 16, (3, 6))
    stage.forward(0, x, y, 1.0)
    out = model(x)
    assert int(stage.correct) == int((out.argmax(-1) == y).sum())
    torch.testing.assert_close(stage.loss_sum.float(), TOKENS(out, y).detach())


def test_check_fits_names_the_mismatch() -> None:
    text = TensorDataset("t", torch.zeros(4, 6, dtype=torch.int64),
                         torch.zeros(4, 6, dtype=torch.int64),
                         torch.zeros(2, 6, dtype=torch.int64),
                         torch.zeros(2, 6, dtype=torch.int64), 16, task="next-token")
    check_fits(build_model(ModelConfig(name="gpt-tiny"), (6,), 16), text, "gpt-tiny")
    wrong = nn.Sequential(nn.Embedding(16, 4), nn.Flatten(), nn.Linear(24, 16))
    with pytest.raises(ModelError, match=r"needs \[2, 6, 16\].*gpt-tiny"):
        check_fits(wrong, text, "mine")
    with pytest.raises(ModelError, match="fails on data set"):
        check_fits(build_model(ModelConfig(name="mlp"), (6,), 16), text, "mlp")
