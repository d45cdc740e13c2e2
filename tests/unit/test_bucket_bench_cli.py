"""`approxdist bench bucket`: runs on a small model, writes its JSON keys, refuses a non-packed codec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main

KEYS = {"codec", "tensors", "values", "per_tensor_ms", "bucket_ms", "one_tensor_ms",
        "bucket_vs_per_tensor", "bucket_vs_one_tensor", "host_steal_fraction"}


def run(argv: list[str]) -> int:
    return main(["bench", "bucket", "--model", "mlp", "--repeats", "1", *argv])


def test_bench_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bucket.json"
    assert run(["--codecs", "sign+ef,qsgd:7", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["codec"] for r in rows] == ["sign+ef", "qsgd:7"]
    assert all(set(r) == KEYS for r in rows)
    assert rows[0]["tensors"] > 1 and rows[0]["values"] == rows[1]["values"]
    assert all(r["bucket_ms"] > 0 and r["bucket_vs_per_tensor"] > 0 for r in rows)
    assert "reproduce: approxdist bench bucket --model mlp" in capsys.readouterr().out


def test_a_compressor_without_a_bucket_path_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """One line naming the value and what has a bucket path, exit 2."""
    assert run(["--codecs", "topk:0.1"]) == 2
    assert "topk:0.1 has no bucket path (bit-packed compressors only" in capsys.readouterr().err
    assert run(["--workers", "0"]) == 2
    assert "--workers 0 must be >= 1" in capsys.readouterr().err
