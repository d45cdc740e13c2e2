"""`tensor_parallel.reshard` (the whole model from its shards) and `approxdist evaluate`'s
bad input, in one process.

The shards are cut here by the same index rule the layers use (`shard.piece`,
`shard.head_rows`), so merging them must give the whole back bit for bit; a shard
missing, repeated, from another plan or another run is an error, never a wrong model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from approxdist.cli.main import main
from approxdist.errors import ConfigError
from approxdist.tensor_parallel.reshard import index_table, merge_shards
from approxdist.tensor_parallel.shard import head_rows, piece


def _whole() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"qkv.weight": torch.randn(12, 4, generator=g),   # 2 heads of width 2, q k v
            "fc.weight": torch.randn(6, 8, generator=g),      # split by columns
            "fc.bias": torch.randn(6, generator=g)}           # whole on every shard


def _cut(whole: dict[str, torch.Tensor], rank: int, size: int
         ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[int, torch.Tensor]]]:
    rows, cols = head_rows(4, 2, rank, size), piece(8, rank, size, "input features")
    table = index_table({"m.qkv.weight": (0, rows), "m.fc.weight": (1, cols)})
    state = {"m.qkv.weight": whole["qkv.weight"][rows], "m.fc.weight": whole["fc.weight"][:, cols],
             "m.fc.bias": whole["fc.bias"].clone()}
    return state, table


@pytest.mark.parametrize("size", [1, 2])
def test_merging_every_shard_gives_the_whole_back(size: int) -> None:
    whole = _whole()
    merged = merge_shards(whole, [_cut(whole, r, size) for r in range(size)], prefix="m.")
    assert merged.keys() == whole.keys()
    for name, want in whole.items():
        assert torch.equal(merged[name], want), name


def test_index_table_lists_a_slice_and_rows_as_int64() -> None:
    table = index_table({"a": (1, slice(4, 8)), "b": (0, [0, 1, 4, 5])})
    assert table["a"][0] == 1 and table["a"][1].tolist() == [4, 5, 6, 7]
    assert table["b"][1].dtype == torch.int64 and table["b"][1].tolist() == [0, 1, 4, 5]


def test_a_missing_repeated_or_foreign_shard_is_an_error() -> None:
    whole = _whole()
    zero, one = _cut(whole, 0, 2), _cut(whole, 1, 2)
    with pytest.raises(ConfigError, match="do not cover it exactly once"):
        merge_shards(whole, [zero, zero], prefix="m.")
    with pytest.raises(ConfigError, match="do not cover it exactly once"):
        merge_shards(whole, [zero], prefix="m.")
    other = ({**one[0], "m.fc.bias": one[0]["m.fc.bias"] + 1}, one[1])
    with pytest.raises(ConfigError, match="'fc.bias' differs between shard 0 and shard 1"):
        merge_shards(whole, [zero, other], prefix="m.")
    unsplit = (one[0], {k: v for k, v in one[1].items() if k != "m.fc.weight"})
    with pytest.raises(ConfigError, match="shard 1 holds 'fc.weight' whole"):
        merge_shards(whole, [zero, unsplit], prefix="m.")
    lacking = ({k: v for k, v in one[0].items() if k != "m.fc.bias"}, one[1])
    with pytest.raises(ConfigError, match="shard 1 holds no 'fc.bias'"):
        merge_shards(whole, [zero, lacking], prefix="m.")


def _run_dir(root: Path, parallel: str = "tensor") -> Path:
    (root / "config.toml").write_text(f'[train]\nparallel = "{parallel}"\nworld_size = 2\n'
                                      '[tp]\nsize = 2\n[model]\nname = "mlp"\nhidden = 8\n'
                                      '[data]\ndataset = "synthetic"\nsynthetic_shape = [4]\n'
                                      'synthetic_samples = 16\n')
    return root


@pytest.mark.parametrize(("make", "args", "message"), [
    (lambda p: p, [], "holds no config.toml; pass the --out directory"),
    (lambda p: _run_dir(p), [], "holds no checkpoint.pt (nor shard<t>/ folders)"),
    (lambda p: (_run_dir(p) / "stage0").mkdir(), [], "is a pipeline run (stage0/, ...)"),
    (lambda p: (_run_dir(p) / "shard1").mkdir(), [], "holds shards [1]: one is missing"),
    (lambda p: (_run_dir(p) / "shard0").mkdir(), [], "shard0' holds no checkpoint.pt: the run"),
    (lambda p: _run_dir(p), ["--tp", "0"], "--tp 0: the ranks to evaluate on must be >= 1"),
])
def test_evaluate_bad_input_is_one_line_exit_2(tmp_path: Path, make: object, args: list[str],
                                               message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    make(tmp_path)  # type: ignore[operator]
    assert main(["evaluate", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
