"""The hints the CLI prints name what a user can run: `analyze` when a trace has no
transfer events, `plan` when its profile names no data set (one process, no run)."""

from __future__ import annotations

from approxdist.analysis.report import RunInfo, no_links
from approxdist.cli.plan_solve import next_step
from approxdist.planner import read_pipedream_profile
from tests.helpers.pipedream import PROFILES


def test_a_trace_without_transfers_names_the_flag_for_each_mode() -> None:
    auto = no_links(RunInfo(parallel="dp", algorithm="auto"))
    assert "(`native`, which --algorithm auto chose for these sizes)" in auto
    assert "train again with --algorithm ring" in auto
    assert "(`native`, --algorithm native)" in no_links(RunInfo(parallel="hybrid",
                                                                algorithm="native"))
    assert no_links(RunInfo(parallel="single")).endswith("a single process sends nothing")
    assert no_links(RunInfo()) == "per link: no transfer events in this trace"


def test_a_plan_of_a_profile_without_data_asks_for_samples_of_its_shape() -> None:
    profile = read_pipedream_profile(PROFILES / "alexnet.txt")
    assert profile.planned_for is None
    line = next_step("p.json", profile)
    assert "approxdist train --plan p.json --dataset synthetic --set " \
           "'data.synthetic_shape=[3,224,224]'" in line
