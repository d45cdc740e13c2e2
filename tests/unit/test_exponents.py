"""Exponent histograms and scheme coverage (seed 000 Figure 5), and `approxdist inspect`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from approxdist.cli import inspect_cmd
from approxdist.comm.exponents import (
    best_fields,
    exponent_histogram,
    exponent_report,
    field_histogram,
    scheme_coverage,
)
from approxdist.errors import DataError


def seed_like(n: int = 10_000) -> torch.Tensor:
    """~18 % zeros, the rest in [2, 32): what seed 000's 4-bit scheme covers."""
    gen = torch.Generator().manual_seed(0)
    x = 2.0 ** (1 + 4 * torch.rand(n, generator=gen))
    x[torch.rand(n, generator=gen) < 0.18] = 0.0
    return x


def test_histogram_counts_the_exponent_field() -> None:
    x = torch.tensor([0.0, -0.0, 1e-40, 1.0, 1.5, -1.0, 2.0, float("inf"), float("nan")])
    hist = exponent_histogram(x)
    assert hist.shape == (256,) and int(hist.sum()) == 9
    assert hist[0] == 3 and hist[127] == 3 and hist[128] == 1 and hist[255] == 2
    assert field_histogram(x, 9)[256 + 127] == 1  # -1.0: sign bit set


def test_scheme_coverage_with_zero_fill() -> None:
    hist = exponent_histogram(seed_like())
    assert scheme_coverage(hist, 2, 2) == 1.0  # exponents 0 and 128..131
    assert scheme_coverage(hist, 8, 0) == 1.0
    ones = exponent_histogram(torch.ones(10))
    assert scheme_coverage(ones, 2, 2) == 0.0  # 127 = 0111_1111 needs the middle bits


def test_report_finds_seed_000_scheme() -> None:
    report = exponent_report(seed_like())
    assert report.zero_fraction == pytest.approx(0.18, abs=0.02)
    assert report.suggest_bits() in ("bits:s0e2+2m0", "bits:s0e1+2m0")
    assert report.coverage["bits:s0e2+2m0"] == 1.0
    assert report.auto_coverage[3] == 1.0 and report.suggest_auto() == "bits:auto3"
    data = report.to_dict()
    assert data["suggest_bits"] == report.suggest_bits() and len(data["histogram"]) == 256


def test_best_fields_prefers_the_bits_that_vary() -> None:
    x = torch.tensor([2.0, 4.0, 8.0, 16.0] * 100)  # exponents 128..131: the low 2 bits vary
    sent, const, cover = best_fields(field_histogram(x, 9), 2)
    assert cover == 1.0 and sent == 0b11
    fields = (x.view(torch.int32) >> 23) & 0x1FF
    assert bool(((fields & ~sent) == const).all())
    assert best_fields(torch.zeros(512, dtype=torch.int64), 3) == (0b111, 0, 1.0)


def run_inspect(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    inspect_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_inspect_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "act.pt"
    torch.save({"a": seed_like(), "b": [seed_like(100)], "ids": torch.arange(4)}, path)
    out = tmp_path / "report.json"
    assert run_inspect(["inspect", "exponents", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "exact zeros" in text and "bits:s0e2+2m0" in text and "2 tensors" in text
    report = json.loads(out.read_text())
    assert report["total"] == 10_100 and report["coverage"]["bits:s0e2+2m0"] == 1.0


def test_inspect_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        run_inspect(["inspect", "exponents", str(tmp_path / "missing.pt")])
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(DataError, match="cannot load"):
        run_inspect(["inspect", "exponents", str(junk)])
    ints = tmp_path / "ints.pt"
    torch.save(torch.arange(5), ints)
    with pytest.raises(DataError, match="no floating-point tensor"):
        run_inspect(["inspect", "exponents", str(ints)])
