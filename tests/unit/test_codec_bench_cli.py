"""`approxdist bench codec`: runs on a small size, writes the documented JSON keys."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from approxdist.benchmarks.codec import bench_shape
from approxdist.cli import bench_codec
from approxdist.comm.compressors import DEFAULT_COMPRESSORS
from approxdist.errors import ConfigError, SpecError

KEYS = {"codec", "encode_gbps", "decode_gbps", "roundtrip_gbps", "bits_per_value",
        "ratio_vs_fp16_roundtrip", "break_even_gbit", "host_steal_fraction"}


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench_codec.register(parser.add_subparsers())
    args = parser.parse_args(["codec", *argv])
    return int(args.func(args))


@pytest.mark.parametrize("alloc", [[], ["--alloc"]])
def test_bench_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           alloc: list[str]) -> None:
    out = tmp_path / "codec.json"
    codecs = "fp16,bits:s0e2+2m0,table4,bits:auto4"
    assert run(["--size", "4K", "--repeats", "2", "--codecs", codecs, "--json", str(out),
                *alloc]) == 0
    rows = json.loads(out.read_text())
    assert [r["codec"] for r in rows] == ["copy_", "fp16-cast", *codecs.split(",")]
    assert all(set(r) == KEYS for r in rows)
    by_name = {r["codec"]: r for r in rows}
    assert by_name["fp16-cast"]["ratio_vs_fp16_roundtrip"] == pytest.approx(1.0)
    assert by_name["bits:s0e2+2m0"]["bits_per_value"] == 4
    assert by_name["copy_"]["break_even_gbit"] == 0.0
    assert by_name["table4"]["break_even_gbit"] > 0
    assert "x fp16 rt" in capsys.readouterr().out


def test_sizes_and_bad_input() -> None:
    assert bench_codec.parse_size("16M") == 16 << 20
    assert bench_codec.parse_size("1k") == 1024 and bench_codec.parse_size("100") == 100
    with pytest.raises(ConfigError, match="16M"):
        bench_codec.parse_size("lots")
    with pytest.raises(ConfigError, match="repeats"):
        run(["--size", "1K", "--repeats", "0"])
    with pytest.raises(SpecError, match="valid forms"):
        run(["--size", "1K", "--codecs", "fp7"])


def test_compressors_get_rows_with_their_message_bits(tmp_path: Path) -> None:
    out = tmp_path / "codec.json"
    assert run(["--size", "4K", "--repeats", "1", "--codecs", "compressors",
                "--json", str(out)]) == 0
    rows = {r["codec"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"copy_", "fp16-cast", *DEFAULT_COMPRESSORS}
    assert all(r["roundtrip_gbps"] > 0 for r in rows.values())
    assert rows["signsgd"]["bits_per_value"] == 1                    # 4096 bits, no scale
    assert rows["qsgd:16"]["bits_per_value"] == 6 + 32 / 4096         # codes + the norm
    assert rows["powersgd:2"]["bits_per_value"] == 32 * 2 * 128 / 4096  # 64 x 64, rank 2
    assert rows["topk:0.01"]["bits_per_value"] == 64 * 40 / 4096


def test_bench_shape_is_the_squarest_matrix() -> None:
    assert bench_shape(16 << 20) == (4096, 4096)
    assert bench_shape(4096 * 2) == (64, 128) and bench_shape(7) == (1, 7)
