"""`approxdist bench collective`: the summary rows from per-rank times, its bad flags, and the
`--sizes` flag it shares with `bench allreduce` and `bench p2p`."""

from __future__ import annotations

import pytest

from approxdist.benchmarks.collective import CollectivePlan, rows, table, values
from approxdist.cli.bench_collective import parse_algorithms
from approxdist.cli.main import main
from approxdist.errors import SpecError


def test_rows_take_the_slowest_rank_and_compare_with_native() -> None:
    plan = CollectivePlan("allgather", (4096,), ("ring",))
    per_rank = [{("native", 4096): [1.0, 2.0, 3.0], ("ring", 4096): [0.5, 1.0, 6.0]},
                {("native", 4096): [2.0, 1.0, 1.0], ("ring", 4096): [1.0, 0.5, 1.0]}]
    out = {r["engine"]: r for r in rows(per_rank, plan, 2)}
    # per round the slowest rank: native 2, 2, 3; ring 1, 1, 6
    assert out["native"]["median_s"] == 2.0 and "ratio_vs_native" not in out["native"]
    assert out["ring"]["median_s"] == 1.0 and out["ring"]["ratio_vs_native"] == 0.5
    assert out["ring"]["paired_ratio"] == 0.5  # 1/2, 1/2, 6/3
    assert out["ring"]["busbw_gbps"] == pytest.approx(4096 / 1.0 * 0.5 / 1e9)
    assert out["native"]["codec"] == "fp32" and out["ring"]["rounds"] == 3
    bcast = rows(per_rank, CollectivePlan("broadcast", (4096,)), 2)
    assert bcast[0]["busbw_gbps"] == pytest.approx(4096 / 2.0 / 1e9)  # no (n-1)/n
    lines = table(list(out.values())).splitlines()
    assert "x native" in lines[0] and lines[2].split()[1] == "native"


def test_sizes_round_down_to_the_world() -> None:
    assert values(4096, 4) == 1024 and values(4096, 3) == 1023 and values(4, 4) == 4


@pytest.mark.parametrize(("kind", "text"), [
    ("allreduce", "message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default 4K,64K,1M,16M,64M)"),
    ("p2p", "message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default 4K,64K,1M,4M,16M)"),
    ("collective", "whole tensor in fp32 bytes (all-gather result, reduce-scatter input), "
                   "K/M/G = 2^10/2^20/2^30 (default 4K,64K,1M,16M)"),
])
def test_each_bench_of_sizes_says_what_it_sizes_and_the_one_syntax(
        kind: str, text: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one help line a flag: no break inside a word
    with pytest.raises(SystemExit):
        main(["bench", kind, "--help"])
    assert text in " ".join(capsys.readouterr().out.split())


def test_algorithms_are_checked_per_op() -> None:
    assert parse_algorithms("allgather", "auto, ring,direct") == ("auto", "ring", "direct")
    assert parse_algorithms("broadcast", "auto,direct,tree") == ("auto", "direct", "tree")
    with pytest.raises(SpecError, match="unknown reduce-scatter algorithm 'brd'; valid: direct"):
        parse_algorithms("reducescatter", "ring,brd")


@pytest.mark.parametrize(("argv", "message"), [
    (["--op", "allgather", "--world-size", "1"], "--world-size 1 must be >= 2"),
    (["--op", "allgather", "--rounds", "0"], "--rounds 0 must be >= 1"),
    (["--op", "reducescatter", "--sizes", "4K,6"], "multiple of 4"),
    (["--op", "reducescatter", "--codec", "fp7"], "unknown codec spec 'fp7'"),
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "collective", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
