"""Tracing on 2 gloo ranks: a real Link transfer, clock alignment, the merged trace.json."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from approxdist.analysis.bottleneck import analyze
from approxdist.cli import analyze_cmd
from approxdist.comm.link import Link
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.trace import (
    RECEIVE_FOR,
    RUN_FOR,
    SEND_FOR,
    STEP,
    SYNC,
    WAIT,
    Recorder,
    align_clock,
    check_trace,
    finish_trace,
    merge_rank_files,
    open_recorder,
    read_trace,
    save_rank_trace,
)
from tests.helpers.trace_demo import run_demo


def _exchange(ctx: DistContext, run_dir: str) -> dict[str, Any]:
    """Rank 0 computes and sends 1000 floats to rank 1, which sends them back doubled."""
    off = open_recorder(ctx, enabled=False)
    assert finish_trace(off, ctx, run_dir + "/off") is None
    rec = open_recorder(ctx, enabled=True)
    link = Link(ctx, hook=rec.transfer_hook())
    peer = 1 - ctx.rank
    with rec.span(STEP, step=0):
        if ctx.rank == 0:
            with rec.span(RUN_FOR, mb=0):
                x = torch.arange(1000, dtype=torch.float32)
            rec.instant("before send")
            with rec.span(SEND_FOR, mb=0):
                link.send(x, peer)
            with rec.span(RECEIVE_FOR, mb=0), rec.span(WAIT):
                back = link.recv(peer)
            _comm_thread(rec)
        else:
            with rec.span(RECEIVE_FOR, mb=0), rec.span(WAIT):
                got = link.recv(peer)
            rec.instant("after recv")
            with rec.span(RUN_FOR, mb=0):
                back = got * 2
            link.send(back, peer)
    link.close()
    save_rank_trace(rec, run_dir)
    finish_trace(rec, ctx, run_dir)
    apart = Recorder(ctx.rank)  # as if the ranks ran on different hosts
    with mock.patch("approxdist.trace.clock.socket.gethostname", return_value=f"h{ctx.rank}"):
        align_clock(apart, ctx)
    return {"bytes": link.stats.as_dict(ctx.rank), "clock": rec.clock, "sum": float(back.sum()),
            "apart": apart.clock}


def _comm_thread(rec: Any) -> None:
    def body() -> None:
        rec.name_thread("comm 0")
        with rec.span(SYNC):
            torch.ones(8).sum()
    t = threading.Thread(target=body)
    t.start()
    t.join()


def test_two_ranks_write_one_valid_trace_with_transfers(tmp_path: Path) -> None:
    outs = run_on_ranks(_exchange, 2, str(tmp_path), timeout_s=60)
    assert outs[0]["sum"] == 2 * sum(range(1000))
    trace = read_trace(tmp_path / "trace.json")
    assert check_trace(trace) == []
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] in ("process_name",
                                                                              "thread_name")}
    assert {(0, "rank 0"), (1, "rank 1"), (0, "comm 0")} <= names
    # bytes on transfer events are what the link handed to torch.distributed
    for rank, out in enumerate(outs):
        traced: dict[str, int] = {}
        for e in events:
            if e.get("cat") == "transfer" and e["pid"] == rank:
                key = f"{e['args']['src']}->{e['args']['dst']}"
                traced[key] = traced.get(key, 0) + e["args"]["bytes"]
        assert traced == out["bytes"]
    # aligned clocks keep causality: rank 1 got the data after rank 0 sent it
    bound_us = max(out["clock"]["error_bound_us"] for out in outs)
    sent = next(e["ts"] for e in events if e["name"] == "before send")
    received = next(e["ts"] for e in events if e["name"] == "after recv")
    assert received >= sent - bound_us
    assert {out["clock"]["method"] for out in outs} == {"same-host wall clock"}
    assert {out["apart"]["method"] for out in outs} == {"barrier"}
    assert all(out["apart"]["error_bound_us"] > 0 for out in outs)
    assert not (tmp_path / "off").exists()
    # the per-rank files merge into the same events
    assert _sorted(merge_rank_files(tmp_path, write=False)) == _sorted(trace)
    result = analyze(trace)
    for r in result.ranks:
        assert r.compute + r.comm + r.waiting + r.bubble == pytest.approx(1.0)
    links = {(k.src, k.dst): k for k in result.links}
    assert links[(0, 1)].matched and links[(0, 1)].nbytes == outs[0]["bytes"]["0->1"]


def _sorted(trace: dict[str, Any]) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


def test_demo_pipeline_trace_analyzes_with_a_bubble(tmp_path: Path, capsys) -> None:
    stats = run_demo(tmp_path, microbatches=2, steps=2, link_spec="bw=1gbit", width=32)
    parser = argparse.ArgumentParser()
    analyze_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", str(tmp_path), "--no-png", "--json",
                              str(tmp_path / "a.json")])
    assert args.func(args) == 0
    assert "(gpipe, P=2, M=2): theory (P-1)/(M+P-1) = 1/3" in capsys.readouterr().out
    figures = json.loads((tmp_path / "a.json").read_text())
    assert [r["steps"] for r in figures["ranks"]] == [2, 2]
    for r in figures["ranks"]:
        assert r["compute"] + r["comm"] + r["waiting"] + r["bubble"] == pytest.approx(1.0)
    sent = {f"{k['src']}->{k['dst']}": k["nbytes"] for k in figures["links"]}
    assert sent == {"0->1": stats[0]["0->1"], "1->0": stats[1]["1->0"]}
