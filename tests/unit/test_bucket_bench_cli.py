"""`approxdist bench bucket`: runs on a small model, writes its JSON keys, refuses a non-packed codec."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from approxdist.cli import bench_bucket
from approxdist.errors import ConfigError

KEYS = {"codec", "tensors", "values", "per_tensor_ms", "bucket_ms", "one_tensor_ms",
        "bucket_vs_per_tensor", "bucket_vs_one_tensor", "host_steal_fraction"}


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench_bucket.register(parser.add_subparsers())
    args = parser.parse_args(["bucket", *argv])
    return int(args.func(args))


def test_bench_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bucket.json"
    assert run(["--model", "mlp", "--codecs", "sign+ef,qsgd:7", "--repeats", "1",
                "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["codec"] for r in rows] == ["sign+ef", "qsgd:7"]
    assert all(set(r) == KEYS for r in rows)
    assert rows[0]["tensors"] > 1 and rows[0]["values"] == rows[1]["values"]
    assert all(r["bucket_ms"] > 0 and r["bucket_vs_per_tensor"] > 0 for r in rows)
    assert "reproduce: approxdist bench bucket --model mlp" in capsys.readouterr().out


def test_a_compressor_without_a_bucket_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="no bucket path"):
        run(["--model", "mlp", "--codecs", "topk:0.1", "--repeats", "1"])
    with pytest.raises(ConfigError, match="repeats"):
        run(["--model", "mlp", "--repeats", "0"])
