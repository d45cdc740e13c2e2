"""Experiment presets: registry, settings, CSV files, CLI parsing, pure helpers (one process)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from approxdist.cli import experiment_cmd, report_cmd
from approxdist.comm.codecs import get_codec
from approxdist.errors import ConfigError, DataError
from approxdist.experiments import Settings, get_preset, preset_names, render_report, run_experiment
from approxdist.experiments.base import expected_s
from approxdist.experiments.csvio import read_csv, spread, write_csv
from approxdist.experiments.runner import LOCK_FILE, exclusive
from approxdist.experiments.seed000_histogram import COVER_COLUMNS, HIST_COLUMNS, representable
from approxdist.experiments.seed001_scaling import speedup
from approxdist.experiments.studies import STUDIES, get_study
from approxdist.experiments.task import task_for

NAMES = ["compressors", "link-emulation-check", "seed000-bandwidth", "seed000-ber", "seed000-bits",
         "seed000-histogram", "seed001-allreduce", "seed001-scaling", "seed002-async",
         "seed002-hybrid",
         "seed003-largebatch",
         "seed003-ps", "seed003-tp", "seed004-adaprec", "transformer-wire"]


def _cli(module: object, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="approxdist")
    module.register(parser.add_subparsers())  # type: ignore[attr-defined]
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_registry_lists_the_presets() -> None:
    assert preset_names() == NAMES
    for name in NAMES:
        preset = get_preset(name)
        listed = preset.listing
        assert preset.name == name and preset.files and listed.reproduces
        assert get_study(listed.study).link == f"docs/studies.md#{listed.study}"
        assert all(expected_s(text) > 0 for text in listed.run_time.values()), name


def test_experiment_list_imports_no_preset_module() -> None:
    """The list comes from the catalog: none of the torch-heavy preset modules is loaded."""
    code = ("import sys; from approxdist.cli.experiment_cmd import list_presets; list_presets(); "
            "print(sorted(m for m in sys.modules if m.startswith('approxdist.experiments.seed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_study_has_its_section_in_the_docs() -> None:
    page = " ".join((Path(__file__).parents[2] / "docs" / "studies.md").read_text().split())
    for key, study in STUDIES.items():
        assert f'<a id="{key}"></a>' in page, key
        assert study.title in page and study.number in page
    with pytest.raises(ConfigError, match="unknown study 'seed9'; valid: seed000, seed001"):
        get_study("seed9")


@pytest.mark.parametrize(("text", "seconds"), [
    ("~20 s (4 epochs, one process)", 20.0), ("~1.5 min (5 runs)", 90.0), ("~2 h", 7200.0)])
def test_expected_time_is_the_duration_a_run_time_starts_with(text: str, seconds: float) -> None:
    assert expected_s(text) == seconds


def test_a_run_time_without_a_duration_is_refused() -> None:
    with pytest.raises(ConfigError, match="run time 'a while' must start with a duration"):
        expected_s("a while")


def test_unknown_preset_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown experiment 'seed009'; valid: compressors, "
                                          "link-emulation-check, seed000-bandwidth,"):
        get_preset("seed009")
    with pytest.raises(ConfigError, match="valid: .*seed001-scaling"):
        _cli(experiment_cmd, ["experiment", "seed009", "--out", str(tmp_path)])


def test_cli_list_and_missing_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(experiment_cmd, ["experiment", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMES) and "quick" in out
    presets = [get_preset(name) for name in NAMES]
    quick = sum(expected_s(p.listing.quick) for p in presets) / 60
    full = sum(expected_s(p.listing.full) for p in presets) / 60
    assert out.strip().splitlines()[-1].startswith(
        f"all                  quick ~{quick:.0f} min, full ~{full:.0f} min")
    with pytest.raises(ConfigError, match="needs --out DIR"):
        _cli(experiment_cmd, ["experiment", "seed000-bits", "--quick"])


def test_report_of_a_directory_without_experiment_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="holds no experiment.json"):
        _cli(report_cmd, ["report", str(tmp_path)])
    with pytest.raises(DataError, match="not an experiment directory"):
        render_report(tmp_path)


def test_one_experiment_per_directory_at_a_time(tmp_path: Path) -> None:
    """A second writer into the same directory is refused; a stale lock is taken over."""
    outer = exclusive(tmp_path)
    outer.__enter__()
    with pytest.raises(ConfigError, match=r"another experiment \(pid \d+\) is writing"):
        exclusive(tmp_path).__enter__()
    outer.__exit__(None, None, None)
    (tmp_path / LOCK_FILE).write_text("0")  # left by a killed run
    with exclusive(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() != "0"
    assert not (tmp_path / LOCK_FILE).exists()


def test_settings_validate_and_pick_seeds(tmp_path: Path) -> None:
    assert Settings(tmp_path).seed_list() == [0, 1, 2]
    assert Settings(tmp_path, size="quick").seed_list() == [0]
    assert Settings(tmp_path, size="quick", seeds=2).seed_list() == [0, 1]
    with pytest.raises(ConfigError, match="not one of: smoke, quick, full"):
        Settings(tmp_path, size="huge")
    with pytest.raises(ConfigError, match="--seeds -1"):
        Settings(tmp_path, seeds=-1)


def test_task_choice() -> None:
    assert task_for(Settings(Path("x"))).dataset == "mnist1d"
    assert task_for(Settings(Path("x"), size="smoke")).dataset == "digits"
    cifar = task_for(Settings(Path("x"), data_dir="/data/cifar"))
    assert cifar.dataset == "cifar10" and cifar.model["name"] == "resnet56"
    sections = cifar.sections(1, fwd_codec="bits:s0e2+2m0", link="bw=1gbit")
    assert sections["pipeline"]["microbatches"] == 4 and sections["data"]["batch_size"] == 256
    assert sections["comm"]["link"] == "bw=1gbit" and sections["train"]["seed"] == 1


def test_csv_round_trip_and_missing_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "a.csv", ("name", "x"), [{"name": "fp32", "x": 0.5}])
    assert read_csv(path, ("name", "x")) == [{"name": "fp32", "x": 0.5}]
    with pytest.raises(DataError, match="lacks column"):
        read_csv(path, ("name", "x", "y"))
    with pytest.raises(DataError, match="row lacks column"):
        write_csv(tmp_path / "b.csv", ("name", "x"), [{"name": "fp32"}])
    with pytest.raises(DataError, match="not found"):
        read_csv(tmp_path / "none.csv", ("x",))


def test_spread_is_sample_std() -> None:
    s = spread([0.9, 0.92, 0.94])
    assert s["n"] == 3 and math.isclose(s["mean"], 0.92) and math.isclose(s["std"], 0.02)
    assert spread([0.5])["std"] == 0.0 and spread([])["n"] == 0


def test_speedup_is_seed001_equation_1() -> None:
    assert speedup(1.0, 1.0, 4, 256, 256) == 4.0
    assert speedup(1.0, 0.5, 64, 64, 256) == 32.0  # 1/0.5 * 64/256 * 64


def test_representable_exponents_match_the_codec() -> None:
    """The green bars of the histogram are exactly the exponents bits:s0e2+2m0 reproduces."""
    exps = torch.arange(1, 255)
    x = torch.exp2(exps.double() - 127).float()
    y = get_codec("bits:s0e2+2m0").decode(get_codec("bits:s0e2+2m0").encode(x))
    kept = {int(e) for e, a, b in zip(exps, x, y) if a == b}
    assert kept == set(representable(2, 2)) - {0, 255}
    assert representable(8, 0) == list(range(256))


def test_histogram_preset_smoke_writes_csvs_plot_and_report(tmp_path: Path) -> None:
    """The one single-process preset, end to end at smoke size; then `report` redoes it."""
    out = tmp_path / "hist"
    report = run_experiment("seed000-histogram", Settings(out, size="smoke"))
    hist = read_csv(out / "histogram.csv", HIST_COLUMNS)
    cover = read_csv(out / "coverage.csv", COVER_COLUMNS)
    assert len(hist) == 256 and sum(r["count"] for r in hist) == cover[0]["total_values"] > 0
    assert {"bits:s0e2+2m0", "bits:s0e8m0", "bits:auto4"} <= {r["scheme"] for r in cover}
    png = out / "exponent_histogram.png"
    assert png.stat().st_size > 10_000
    text = report.read_text()
    assert "| seed 000, epoch 1 | 1,000,000 | ~18 %" in text and "## Trends of the seed" in text
    png.unlink()
    report.unlink()
    assert _cli(report_cmd, ["report", str(tmp_path)]) == 0  # a folder of experiments
    assert png.stat().st_size > 10_000 and report.read_text() == text


# -- seed002-async's verdicts come from its CSV ------------------------------------------------

def _async_rows() -> list[dict[str, object]]:
    from approxdist.experiments.seed002_async import SCHEDULES

    rate = {"gpipe": 900.0, "1f1b": 1000.0, "zbh1": 1100.0, "zbh2": 1050.0, "zbv": 950.0,
            "pipedream": 800.0, "2bw": 1200.0}
    acc = {"gpipe": 0.80, "1f1b": 0.80, "zbh1": 0.80, "zbh2": 0.78, "zbv": 0.80,
           "pipedream": 0.83, "2bw": 0.70}
    loss = {"gpipe": 1.0, "1f1b": 1.0, "zbh1": 1.0, "zbh2": 1.0, "zbv": 1.0, "pipedream": 0.9,
            "2bw": 1.2}
    versions = {"pipedream": "200;100", "2bw": "200;200"}
    compute = {"1f1b": 0.020, "zbh1": 0.021, "pipedream": 0.030}
    bubble = {"1f1b": 0.30, "zbh1": 0.20}
    rows = []
    for name in SCHEDULES:
        for epoch in (1, 2):
            rows.append({"schedule": name, "seed": 0, "epoch": epoch, "train_accuracy": 0.5,
                         "test_accuracy": acc[name] - 0.1 * (2 - epoch),
                         "train_loss": loss[name] + (2 - epoch) * 0.5, "test_loss": 1.0,
                         "epoch_time_s": 1.0, "bytes_fwd": 0, "elapsed_s": float(epoch),
                         "samples_per_s": rate[name],
                         "weight_version_bytes": versions.get(name, "0;0"), "step_s": 0.05,
                         "compute_s": compute.get(name, 0.02), "bubble": bubble.get(name, 0.25)})
    return rows


def test_seed002_async_verdicts_follow_the_measurements() -> None:
    from approxdist.experiments.seed002_async import SCHEDULES, _rate, result_table
    from approxdist.experiments.seed002_async import trend_rows as async_trends
    from approxdist.experiments.seed002_async_time import time_table

    rows = _async_rows()
    meta = {"cores": 2, "ranks": 2, "steps_per_epoch": 10, "stage_param_bytes": [100, 100],
            "task": {"lr": 0.1}, "momentum": 0.9}
    by_start = {}
    for claim, ours, ok, why in async_trends(rows, meta):
        kind = ("rate" if "samples per second" in claim else
                "acc" if "accuracy" in claim else "mem")
        by_start[f"{claim.split(':')[0].split(' ')[0]} {kind}"] = (ours, ok, why)
    assert by_start["pipedream rate"][1] is False and "0.800x" in by_start["pipedream rate"][0]
    assert by_start["2bw rate"][1] is True and "1.200x" in by_start["2bw rate"][0]
    assert by_start["pipedream acc"][1] is True and "+3.0 pts" in by_start["pipedream acc"][0]
    assert by_start["2bw acc"][1] is False and "-10.0 pts" in by_start["2bw acc"][0]
    assert "+0.200 after epoch 1, +0.200 after epoch 2" in by_start["2bw acc"][2]
    assert by_start["2bw mem"][1] is True and "2 / 2" in by_start["2bw mem"][0]
    assert by_start["pipedream mem"][1] is True and "2 / 1" in by_start["pipedream mem"][0]
    assert by_start["zbh1 rate"][1] is True and "1.100x" in by_start["zbh1 rate"][0]
    assert "bubble 20.0 % vs 30.0 % (1F1B); compute per step 1.050x" in by_start["zbh1 rate"][2]
    assert by_start["zbv rate"][1] is False and by_start["zbv acc"][1] is True
    assert by_start["zbh2 acc"][1] is False and "-2.0 pts" in by_start["zbh2 acc"][0]
    assert "compute per step 1.500x 1F1B's" in by_start["pipedream rate"][2]
    table = result_table(rows, 0.7)
    assert "| 2bw | 70.0 % (n=1) | 1200 | 1.200x |" in table
    times = time_table(rows, SCHEDULES, "1f1b", _rate)
    assert "| zbh1 | 50.00 | 21.00 | 1.050x | 20.0 % | 1.100x |" in times


def test_largebatch_refuses_a_data_dir_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="seed003-largebatch trains MNIST-1D .*--data-dir "
                                          "'/data/cifar' does not apply"):
        run_experiment("seed003-largebatch", Settings(tmp_path, size="smoke",
                                                      data_dir="/data/cifar"))
    assert not (tmp_path / "runs").exists()


def test_link_shaper_applies_only_to_presets_that_vary_the_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from approxdist.cli.main import main

    assert main(["experiment", "seed002-async", "--smoke", "--link-shaper", "kernel",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ("approxdist: error: --link-shaper kernel does not apply to seed002-async, "
                   "which has no link to shape; presets that take it: "
                   "seed000-bandwidth, seed001-allreduce\n")
    with pytest.raises(ConfigError, match="--link-shaper 'tc' is not one of: inproc, kernel"):
        Settings(tmp_path, link_shaper="tc")
    assert get_preset("seed000-bandwidth").shapers == ("inproc", "kernel")
    assert get_preset("seed001-allreduce").shapers == ("inproc", "kernel")


@pytest.mark.parametrize(("argv", "line"), [
    (["seed001-allreduce", "--link-shaper", "kernel"],
     "--link-shaper kernel on seed001-allreduce needs --link bw=RATE, the rate tc shapes the "
     "hosts' links to; e.g. --link bw=100mbit"),
    (["seed000-bandwidth", "--link", "bw=1gbit"],
     "--link bw=1gbit does not apply to seed000-bandwidth (it varies the link's rate itself); "
     "drop --link, or run a preset that takes it: seed001-allreduce"),
    (["seed002-async", "--link", "bw=1gbit"],
     "--link bw=1gbit does not apply to seed002-async (it has no link to shape); drop --link, "
     "or run a preset that takes it: seed001-allreduce"),
    (["seed001-allreduce", "--link", "bw=fast"],
     "bandwidth 'fast' is not"),
])
def test_link_options_that_do_not_fit_are_refused_in_one_line(
        argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything runs (nothing written into --out), exit 2, one line."""
    from approxdist.cli.main import main

    assert main(["experiment", *argv, "--smoke", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"approxdist: error: {line}") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_experiment_all_skips_presets_the_link_options_do_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`all --link-shaper kernel` without --link skips seed001-allreduce with the reason and
    runs seed000-bandwidth; `all --link X` runs only the presets that take one."""
    ran: list[tuple[str, str, str]] = []
    monkeypatch.setattr(experiment_cmd, "run_experiment", lambda name, s: ran.append(
        (name, s.link_shaper, s.link)) or s.out / "report.md")
    assert _cli(experiment_cmd, ["experiment", "all", "--smoke", "--link-shaper", "kernel",
                                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seed001-allreduce: skipped: --link-shaper kernel on seed001-allreduce needs " \
           "--link bw=RATE" in out
    assert [r[0] for r in ran] == ["seed000-bandwidth"]
    ran.clear()
    assert _cli(experiment_cmd, ["experiment", "all", "--smoke", "--link", "bw=1gbit",
                                 "--link-shaper", "kernel", "--out", str(tmp_path)]) == 0
    assert ran == [("seed001-allreduce", "kernel", "bw=1gbit")]
    assert "seed000-bandwidth: skipped: --link bw=1gbit does not apply" in capsys.readouterr().out


def test_the_command_line_and_settings_keep_the_link(tmp_path: Path) -> None:
    from approxdist.experiments.runner import command_line

    settings = Settings(tmp_path, size="quick", link="bw=100mbit", link_shaper="kernel")
    assert command_line("seed001-allreduce", settings) == (
        f"approxdist experiment seed001-allreduce --out {tmp_path} --quick --link bw=100mbit "
        f"--link-shaper kernel")
    assert settings.as_dict()["link"] == "bw=100mbit"


# -- seed004-adaprec's verdicts come from its CSV ----------------------------------------------

def _adaprec_rows(acc: float, wall: float, chosen: str, spent: float,
                  seeds: int = 1) -> list[dict[str, object]]:
    from approxdist.experiments.seed004_adaprec import POLICIES

    base = {"float": (0.70, 10.0), "fp8": (0.69, 6.0), "table1": (0.50, 4.0),
            "table4": (0.68, 5.0), "fastest": (0.68, 5.0), "seed004": (0.55, 4.5),
            "adaprec": (acc, wall), "adaprec-layer": (acc, wall)}
    ada = ("adaprec", "adaprec-layer")
    return [{"policy": p, "seed": s, "final_accuracy": base[p][0] + 0.002 * s,
             "wall_time_s": base[p][1], "best_accuracy": base[p][0], "bytes_sent": 1,
             "speculation_s": spent if p in ada else 0.0, "fit_s": 0.0,
             "decision_s": 0.01 if p in ada else 0.0,
             "chosen": chosen if p in ada else "", "blacklist": "",
             "poison_error": 1.4 + 0.1 * s if p in ada else math.nan}
            for s in range(seeds) for p in POLICIES]


def test_seed004_adaprec_verdicts_follow_the_measurements() -> None:
    from approxdist.experiments.seed004_adaprec import POISON, result_table, trend_rows

    mix = "0:fp32;60:mix:0.1.weight=table4,0.1.bias=fp8-e5m2"
    good = trend_rows(_adaprec_rows(0.698, 4.5, mix, 0.5))
    assert [ok for _, _, ok, _ in good] == [True] * 8  # both variants, four figures each
    assert "69.8 % vs 70.0 % (float), -0.2 pts; 0.45x float's time" in good[0][1]
    assert good[1][1] == "none is" and "chosen in 0 phase(s)" in good[2][1]
    assert "its smallest measured error on the update (at least 1.40) against the error " \
           "budget (adaprec.error_budget = 0.25)" in good[2][3]
    assert "11.3 % (0.5 s of 4.5 s a run)" in good[3][1]
    # slower than fp8 and less accurate beyond the spread: dominated; the poison chosen
    bad = trend_rows(_adaprec_rows(0.60, 8.0, f"0:fp32;40:{POISON}", 2.0, seeds=2))
    assert [ok for _, _, ok, _ in bad[:4]] == [False, False, False, False]
    assert bad[1][1] == "dominated by fp8, table4, fastest"  # float is slower
    table = result_table(_adaprec_rows(0.698, 8.0, "0:fp32", 0.1))
    assert "| adaprec | 69.8 % (n=1) | 8.0 | 0.80x | 74.4 % |" in table


def test_seed004_pareto_view_and_choices_per_parameter() -> None:
    from approxdist.experiments.seed004_pareto import Point, choices, dominates, pareto_table, points

    ada = Point("adaprec", 5.0, 0.1, 0.68, 0.01, 3)
    assert dominates(Point("fp8", 4.0, 0.1, 0.70, 0.005, 3), ada)
    assert not dominates(Point("fp8", 4.0, 0.1, 0.69, 0.005, 3), ada)  # within the spread
    assert not dominates(Point("float", 9.0, 0.1, 0.75, 0.005, 3), ada)  # slower
    names, steps, grid = choices([(0, "fp32"), (60, "mix:a.w=table4,a.b=fp8-e5m2")])
    assert names == ["a.w", "a.b"] and steps == [0, 60]
    assert grid == [["fp32", "fp32"], ["table4", "fp8-e5m2"]]
    assert choices([(0, "fp32"), (60, "table4")])[0] == ["all"]
    table = pareto_table(points(_adaprec_rows(0.60, 8.0, "0:fp32", 2.0, seeds=2)),
                         ("adaprec", "adaprec-layer"), ("float", "fp8"))
    assert "| fp8 | 6.0 ± 0.0 | 0.60x | 69.1 ± 0.1 % (n=2) | adaprec, adaprec-layer |" in table


# -- seed003-ps's verdicts come from its CSVs --------------------------------------------------

_STEP_MS = {("none", "allreduce"): 10.0, ("none", "sync"): 12.0, ("none", "sharded"): 11.0,
            ("none", "async"): 10.0, ("none", "ssp"): 10.0,
            ("persistent", "sync"): 112.0, ("persistent", "async"): 20.0,
            ("persistent", "backup"): 60.0}


def _ps_rows(nb_wall: float, lead: int) -> tuple[list[dict[str, object]], ...]:
    """Epoch, run and staleness rows of a fabricated seed003-ps run (W = 3, 2 epochs)."""
    epochs, runs, stale = [], [], []
    for (setting, mode), ms in _STEP_MS.items():
        keys = {"model": "m", "setting": setting, "mode": mode,
                "servers": 3 if mode == "sharded" else 0 if mode == "allreduce" else 1,
                "workers": 3, "seed": 0}
        busiest = 100_000 * {"allreduce": 1, "sync": 6, "sharded": 2}.get(mode, 6)
        for epoch in (1, 2):
            epochs.append({**keys, "epoch": epoch, "test_accuracy": 0.5 + 0.1 * epoch,
                           "train_loss": 1.0, "epoch_time_s": ms / 1e3 * 10,
                           "elapsed_s": epoch * ms / 1e3 * 10, "step_time_s": ms / 1e3,
                           "steps": 10, "bytes_sent": 10 * busiest, "busiest_bytes": 10 * busiest})
        wall = nb_wall if mode == "backup" else 7.0 if setting == "persistent" else 1.0
        runs.append({**keys, "final_accuracy": 0.80 if mode == "async" else 0.85,
                     "wall_time_s": wall, "steps": 62, "updates": 62,
                     "dropped": 62 if mode == "backup" else 0, "max_lead": lead,
                     "straggler_sleep_s": 6.2 if setting == "persistent" else 0.0,
                     "straggler": "3:100ms" if setting == "persistent" else ""})
        if mode in ("async", "ssp"):
            stale += [{**keys, "staleness": s, "count": c} for s, c in ((0, 10), (2, 30))]
    return epochs, runs, stale


def test_seed003_ps_verdicts_follow_the_measurements() -> None:
    from approxdist.experiments.seed003_ps_report import setting_table, staleness_table
    from approxdist.experiments.seed003_ps_trends import trend_rows as ps_trends

    meta = {"task_model": "m", "workers": 3, "delay_ms": 100, "cores": 2}
    epochs, runs, stale = _ps_rows(3.0, 2)
    rows = {claim.split(":")[0]: (ours, ok, why) for claim, ours, ok, why in
            ps_trends(epochs, runs, stale, meta)}
    wait = rows["a synchronous step waits for the slowest worker"]
    assert wait[1] is True and "112.0 ms per step with the straggler (12.0 ms" in wait[0]
    assert "sleeps 6.2 s over the run when it runs each of its 62 steps: 88.6 %" in wait[2]
    assert rows["an asynchronous update does not wait for the slowest worker"][1] is True
    nb = rows["N+b (b = 1), 3 workers, persistent 100 ms straggler"]
    assert nb[1] is True and "3.0 s vs 7.0 s: 57.1 % cut" in nb[0]
    assert "dropped 62 of the 186 gradients" in nb[2] and "ran fewer steps" in nb[2]
    ratio = rows["sync PS, 1 server + 3 workers, m"]
    assert ratio[1] is True and "12.00 ms vs 10.00 ms (medians); paired ratio 1.20x" in ratio[0]
    assert "600.0 kB per step, the busiest all-reduce rank 100.0 kB (6.00x)" in ratio[2]
    sharded = rows["sync PS, m, W = 3"]
    assert sharded[1] is True and "gap closed: 50.0 %" in sharded[0]
    assert rows["SSP never lets a worker run more than s = 2 steps ahead of the slowest (Ho et "
                "al. 2013)"][1] is True
    assert rows["async PS"][1] is True and "80.0 % vs 85.0 % (sync PS): -5.0 pts" in \
        rows["async PS"][0] and "mean staleness 1.50 updates, largest 2" in rows["async PS"][2]
    assert "| N+b, b = 1 | 0.60 | 0.536x |" in setting_table(
        [e for e in epochs if e["setting"] == "persistent"], runs, "persistent", 0.7)
    assert "| SSP, s = 2 | no straggler | 0: 10, 2: 30 | 1.50 | 2 |" in staleness_table(stale, runs)

    epochs, runs, stale = _ps_rows(7.5, 3)
    rows = {claim.split(":")[0]: (ours, ok, why) for claim, ours, ok, why in
            ps_trends(epochs, runs, stale, meta)}
    nb = rows["N+b (b = 1), 3 workers, persistent 100 ms straggler"]
    assert nb[1] is False and "-7.1 % cut" in nb[0]
    assert "7.5 s is at least the 6.2 s its straggler sleeps" in nb[2]
    assert rows["SSP never lets a worker run more than s = 2 steps ahead of the slowest (Ho et "
                "al. 2013)"][1] is False


def test_the_run_times_table_of_the_docs_lists_every_preset_as_registered() -> None:
    """docs/experiments.md "Run times": one row per preset with its `run_time` texts, and
    the sums `experiment list` prints."""
    page = (Path(__file__).parents[2] / "docs" / "experiments.md").read_text()
    table = page.split("## Run times", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0].strip("|` "): cells[1:3] for line in table.splitlines()
            if line.startswith("| ") and len(cells := line.split(" | ")) >= 4}
    for name in NAMES:
        listed = get_preset(name).listing
        assert rows.get(name) == [listed.quick, listed.full], name
    quick = sum(expected_s(get_preset(n).listing.quick) for n in NAMES) / 60
    full = sum(expected_s(get_preset(n).listing.full) for n in NAMES) / 60
    assert rows["all"] == [f"~{quick:.0f} min", f"~{full:.0f} min"]


def test_the_readme_layout_names_every_preset() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1]
    assert [name for name in NAMES if name not in layout] == []
