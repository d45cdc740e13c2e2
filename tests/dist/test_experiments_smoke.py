"""Every multi-rank preset at smoke size: real runs (2-4 gloo ranks), CSVs, PNGs, report.

The smoke size trains a small MLP on the digits for one epoch (or times a few tiny
steps): it checks the machinery end to end, not the seeds' figures (docs/experiments.md
has those). `report` must then rebuild the plots and the page from the CSVs alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from approxdist.cli import report_cmd
from approxdist.experiments import Settings, get_preset, run_experiment
from approxdist.experiments.studies import get_study

MULTI_RANK = ["seed000-bits", "seed000-ber", "seed000-bandwidth", "seed001-allreduce",
              "seed001-scaling", "seed002-hybrid", "seed002-async", "seed003-ps",
              "seed004-adaprec", "transformer-wire",
              "seed003-largebatch"]


def _report(path: Path) -> None:
    parser = argparse.ArgumentParser(prog="approxdist")
    report_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["report", str(path)])
    assert args.func(args) == 0


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """Run a preset at smoke size once in this module: (its directory, its report)."""
    done: dict[str, tuple[Path, Path]] = {}

    def run(name: str) -> tuple[Path, Path]:
        if name not in done:
            out = tmp_path_factory.mktemp("smoke") / name
            done[name] = out, run_experiment(name, Settings(out, size="smoke"))
        return done[name]

    return run


@pytest.mark.parametrize("name", MULTI_RANK)
def test_smoke_run_writes_csvs_plots_and_report(
        name: str, smoke_run: Callable[[str], tuple[Path, Path]]) -> None:
    out, report = smoke_run(name)
    preset = get_preset(name)
    for file in preset.files:
        rows = file.read(out)
        assert rows and list(rows[0]) == list(file.columns)
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.stat().st_size > 10_000 for p in pngs)
    text = report.read_text()
    assert text.startswith(f"# {name}: ") and "## Trends of the seed" in text
    study = get_study(preset.listing.study)  # the report names its study and links it
    assert f"Reproduces {preset.listing.reproduces} of {study.cite()}" in text and study.link in text
    for png in pngs:
        assert f"]({png.name})" in text
        png.unlink()
    report.unlink()
    _report(out)
    assert all(p.stat().st_size > 10_000 for p in pngs) and report.read_text() == text


def test_finished_runs_are_reused(smoke_run: Callable[[str], tuple[Path, Path]]) -> None:
    """Re-running a preset into the same directory skips training runs already done (the
    first run is the smoke test's above, or made here when this test runs alone)."""
    out, _ = smoke_run("seed000-bits")
    summaries = sorted(out.glob("runs/*/summary.json"))
    stamps = [p.stat().st_mtime_ns for p in summaries]
    assert len(summaries) == 2
    run_experiment("seed000-bits", Settings(out, size="smoke"))
    assert [p.stat().st_mtime_ns for p in summaries] == stamps
