"""seed001-allreduce on a link: `--link`, `--link-shaper kernel` with the cluster faked (no
namespaces: the hosts' `bench allreduce` is answered from a cost model), and `bench
allreduce --min-repeats`; the commands the kernel path runs parse back to its plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.benchmarks.allreduce import Row, measurements, summarize
from approxdist.cli.bench_allreduce import combos_for, parse_algorithms, parse_sizes
from approxdist.cli.main import build_parser, main
from approxdist.comm.collectives import Calibration, fit
from approxdist.errors import ClusterError
from approxdist.experiments import Settings, run_experiment, runner, shaping
from approxdist.experiments import seed001_allreduce as ar
from approxdist.experiments.csvio import read_csv

K, M = 1 << 10, 1 << 20
#: seconds per all-reduce of `size` bytes: brd fastest small, ring fastest large
COST = {"native": (2e-4, 3e-8), "brb": (3e-4, 4e-8), "brd": (1e-4, 2e-8),
        "vhd": (3e-4, 1.2e-8), "ring": (4e-4, 1e-8), "auto": (1.2e-4, 1.1e-8)}


@pytest.mark.parametrize(("argv", "line"), [
    (["--min-repeats", "0"], "--min-repeats 0 must be from 1 to --repeats (100); "
                             "e.g. --min-repeats 5"),
    (["--min-repeats", "7", "--repeats", "3"], "--min-repeats 7 must be from 1 to --repeats "
                                               "(3); e.g. --min-repeats 3"),
    (["--repeats", "0"], "--repeats 0 must be >= 1; e.g. --repeats 100"),
])
def test_bench_allreduce_refuses_bad_round_counts(argv: list[str], line: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allreduce", "--world-size", "2", *argv]) == 2
    assert capsys.readouterr().err == f"approxdist: error: {line}\n"


def test_the_hosts_command_parses_back_to_the_plan(tmp_path: Path) -> None:
    plan = ar.plan_for(Settings(tmp_path, size="quick"))
    plan = plan.__class__(**{**vars(plan), "calibration": str(tmp_path / "cal.json")})
    args = build_parser().parse_args(ar.bench_argv(plan, tmp_path / "rows.json"))
    assert parse_sizes(args.sizes) == plan.sizes
    codecs = args.codec.split(",")
    assert combos_for(parse_algorithms(args.algorithms), codecs) == plan.combos
    assert (args.repeats, args.min_repeats, args.budget) == (plan.max_repeats,
                                                             plan.min_repeats, plan.budget_s)
    assert str(args.calibration) == plan.calibration and args.link is None
    assert args.json == tmp_path / "rows.json"


def test_rows_read_back_from_bench_json_equal_the_measured_ones() -> None:
    rows = _rows(["native", "brd", "ring"], (4 * K, 64 * K), 2)
    back = [Row.from_json({**r.as_json(), "host_steal_fraction": 0.0}) for r in rows]
    assert [b.as_json() for b in back] == [{**r.as_json(), "host_steal_fraction": 0.0}
                                           for r in rows]
    assert measurements(back, "fp32") == measurements(rows, "fp32")


def _rows(algorithms: list[str], sizes: tuple[int, ...], world: int) -> list[Row]:
    """What `bench allreduce` measures when every op takes COST's time."""
    per_rank = {(a, "fp32", s): [COST[a][0] + COST[a][1] * s] * 3
                for s in sizes for a in algorithms}
    return summarize([per_rank] * world, world, None)


class FakeCluster:
    """Stands in for `cluster up/down` and `cluster run -- bench allreduce`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int = -1) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.hosts = 0
        self.fail_at = fail_at
        monkeypatch.setattr(shaping, "cluster_up", self.up)
        monkeypatch.setattr(shaping, "cluster_down", lambda name: self.calls.append(("down",)))
        monkeypatch.setattr(ar, "on_cluster", self.run)

    def up(self, name: str, hosts: int, link: str) -> None:
        self.hosts = hosts
        self.calls.append(("up", hosts, link))

    def run(self, name: str, argv: list[str], log: Path | None = None) -> None:
        self.calls.append(("run", argv))
        if len([c for c in self.calls if c[0] == "run"]) == self.fail_at:
            raise ClusterError("`approxdist cluster run -- bench allreduce` failed (exit 1)")
        args = build_parser().parse_args(argv)
        rows = _rows(parse_algorithms(args.algorithms), parse_sizes(args.sizes), self.hosts)
        args.json.write_text(json.dumps([{**r.as_json(), "host_steal_fraction": 0.0}
                                         for r in rows]))


def test_the_kernel_shaper_measures_on_a_fresh_cluster_per_world(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster(monkeypatch)
    monkeypatch.setattr(runner, "check_shaper", lambda shaper: None)  # no root needed here
    # the quick size: two worlds (the smoke size measures one)
    report = run_experiment("seed001-allreduce", Settings(tmp_path, size="quick",
                                                          link="bw=1gbit", link_shaper="kernel"))
    assert [c[0] for c in fake.calls] == ["up", "run", "run", "down"] * 2
    assert [c[1:] for c in fake.calls if c[0] == "up"] == [(2, "bw=1gbit"), (4, "bw=1gbit")]
    for world, first, second in ((2, fake.calls[1][1], fake.calls[2][1]),
                                 (4, fake.calls[5][1], fake.calls[6][1])):
        assert "auto" not in first[first.index("--algorithms") + 1]
        assert "--calibration" not in first and "--link" not in first  # tc shapes the link
        cal = second[second.index("--calibration") + 1]
        expected = fit(measurements(_rows(["native", "brb", "brd", "ring", "vhd"],
                                          (4 * K, 64 * K, M, 16 * M), world), "fp32"), world,
                           "bw=1gbit")
        assert Calibration.load(cal).thresholds == expected.thresholds
        assert "auto" in second[second.index("--algorithms") + 1]
    rows = read_csv(tmp_path / "allreduce.csv", ar.COLUMNS)
    assert {(r["world_size"], r["algorithm"]) for r in rows} == {
        (w, a) for w in (2, 4) for a in COST}
    brd = next(r for r in rows if r["algorithm"] == "brd" and r["size_bytes"] == 4 * K)
    assert brd["median_s"] == pytest.approx(COST["brd"][0] + COST["brd"][1] * 4 * K)
    text = report.read_text()
    assert "Link: `bw=1gbit`, shaped by the kernel (`--link-shaper kernel`)" in text
    assert "--link bw=1gbit --link-shaper kernel" in text


def test_a_failing_host_run_still_removes_the_cluster(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster(monkeypatch, fail_at=2)
    with pytest.raises(ClusterError, match="failed"):
        ar.collect(Settings(tmp_path, size="smoke", link="bw=1gbit", link_shaper="kernel"))
    assert [c[0] for c in fake.calls] == ["up", "run", "run", "down"]


@pytest.mark.parametrize(("meta", "said"), [
    ({}, "Link: none, local ranks over loopback TCP (gloo), unshaped."),
    ({"link": "bw=100mbit", "link_shaper": "inproc"},
     "Link: `bw=100mbit`, shaped by approxdist's in-process emulator (`comm.netem`"),
    ({"link": "bw=100mbit", "link_shaper": "kernel"},
     "Link: `bw=100mbit`, shaped by the kernel (`--link-shaper kernel`): one rank per host"),
])
def test_the_report_says_who_shaped_the_link(meta: dict[str, str], said: str) -> None:
    assert ar.link_of(meta)[1].startswith(said)
