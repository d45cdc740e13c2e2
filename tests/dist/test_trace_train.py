"""`approxdist train --trace` end to end: single, dp and pipeline runs write a merged trace.json
that `approxdist analyze` reads; without the flag nothing is recorded or written."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from approxdist.cli.main import main
from approxdist.config.loader import to_dict
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.schema import Config, TrainConfig
from approxdist.launch.context import DistContext
from approxdist.models.mlp import mlp
from approxdist.pipeline.runtime import build_runtime
from approxdist.trace import (
    DATA,
    ENCODE,
    OPTIMIZER,
    RECEIVE_BACK,
    RECEIVE_FOR,
    RUN_BACK,
    RUN_FOR,
    SEND_BACK,
    SEND_FOR,
    STEP,
    SYNC,
    WAIT,
    Recorder,
    check_trace,
    read_trace,
)
from approxdist.train import worker

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false",
        "--epochs", "1"]
MODES = {"dp": ["--parallel", "dp", "--world-size", "2"],
         "pipeline": ["--parallel", "pipeline", "--stages", "2", "--microbatches", "4",
                      "--fwd-codec", "bf16"]}


def _spans(trace: dict[str, Any]) -> Counter[tuple[int, str]]:
    """(rank, name) -> number of complete events."""
    return Counter((e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X")


def _epoch(run_dir: Path) -> dict[str, Any]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"][-1]


def _analyze(run_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    out = run_dir / "analysis.json"
    assert main(["analyze", str(run_dir), "--json", str(out), *extra]) == 0
    assert "per rank" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    for rank in figures["ranks"]:
        total = rank["compute"] + rank["comm"] + rank["waiting"] + rank["bubble"]
        assert total == pytest.approx(1.0, abs=1e-6), rank
    return figures


def _sent_in_steps(trace: dict[str, Any], src: int, dst: int) -> int:
    """Bytes the trace says `src` sent to `dst` while `src` was inside a training step."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e["ph"] == "X" and e["pid"] == src and e["name"] == STEP]
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    return sum(e["args"]["bytes"] for e in trace["traceEvents"]
               if e["ph"] == "X" and e.get("cat") == "transfer" and e["pid"] == src
               and e["args"]["direction"] == "send" and e["args"]["dst"] == dst
               and lo <= e["ts"] <= hi)


# -- single process, in process ---------------------------------------------------------
def test_single_trace_and_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on, off = tmp_path / "on", tmp_path / "off"
    assert main(["train", "--parallel", "single", "--out", str(on), "--trace", *FAST]) == 0
    printed = capsys.readouterr().out
    assert f"trace: {on / 'trace.json'}" in printed and f"approxdist analyze {on}" in printed
    trace = read_trace(on / "trace.json")
    check_trace(trace)
    spans = _spans(trace)
    steps = json.loads((on / "summary.json").read_text())["steps"]
    for phase in (STEP, DATA, RUN_FOR, RUN_BACK):
        assert spans[(0, phase)] == steps, phase
    assert spans[(0, OPTIMIZER)] == 2 * steps  # zero_grad and step
    figures = _analyze(on, capsys, "--no-png")
    assert figures["ranks"][0]["steps"] == steps and figures["ranks"][0]["compute"] > 0.5

    assert main(["train", "--parallel", "single", "--out", str(off), *FAST]) == 0
    assert "trace:" not in capsys.readouterr().out
    assert not list(off.glob("trace*.json"))


def test_failing_rank_writes_its_own_file_and_raises(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No collective after a failure: the rank saves trace.rank<N>.json, the error propagates."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(worker, "build_trainer", broken)
    cfg = Config(train=TrainConfig(parallel="single", world_size=1, trace=True))
    with pytest.raises(RuntimeError, match="boom"):
        worker.run_worker(to_dict(cfg), str(tmp_path), False)
    assert (tmp_path / "trace.rank0.json").is_file() and not (tmp_path / "trace.json").exists()


def test_pipeline_executor_phases_in_one_process() -> None:
    """One stage, 3 micro-batches: the executor records its phases and computes the same
    gradients as untraced; off, the link takes no hook."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    model, pcfg, rec = mlp((8,), 4, hidden=16, depth=1), PipelineConfig(stages=1, microbatches=3), \
        Recorder(0)
    off = build_runtime(pcfg, model, DistContext(), x[:2])
    on = build_runtime(pcfg, copy.deepcopy(model), DistContext(), x[:2], rec=rec)
    assert off.link.hook is None and on.link.hook is not None
    assert off.executor.train_step(x, y, 6).loss == on.executor.train_step(x, y, 6).loss
    for a, b in zip(off.module.parameters(), on.module.parameters()):
        assert a.grad is not None and torch.equal(a.grad, b.grad)
    names = Counter(e[0] for e in rec.events)
    assert names[RUN_FOR] == 3 and names[RUN_BACK] == 3 and names[WAIT] == 1
    assert rec.meta["pipeline"] == {"stages": 1, "microbatches": 3, "schedule": "gpipe",
                                    "replicas": [1]}


# -- dp and pipeline, two ranks each, one run each ------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each mode's traced run, in this process (its ranks fork from the suite's fork server:
    no interpreter to start)."""
    root = tmp_path_factory.mktemp("traced")
    for mode, args in MODES.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = main(["train", *args, *FAST, "--trace", "--out", str(root / mode)])
        assert code == 0, f"{mode}: {printed.getvalue()}"
        assert f"trace: {root / mode / 'trace.json'}" in printed.getvalue()
    return {mode: root / mode for mode in MODES}


def test_dp_trace(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run = runs["dp"]
    trace = read_trace(run / "trace.json")
    check_trace(trace)
    spans = _spans(trace)
    steps = _epoch(run)["step"]
    for rank in (0, 1):
        for phase in (STEP, RUN_FOR, RUN_BACK):
            assert spans[(rank, phase)] == steps, (rank, phase)
        assert spans[(rank, SYNC)] >= steps  # at least one bucket per step, on a comm thread
        threads = {e["args"]["name"] for e in trace["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == rank}
        assert "comm0" in threads and "send to rank " + str(1 - rank) + " [comm0]" in threads
    sent = _epoch(run)["bytes_sent"]
    for src, dst in ((0, 1), (1, 0)):  # oracle: the link layer's own byte count
        assert _sent_in_steps(trace, src, dst) == sent[f"{src}->{dst}"] > 0
    figures = _analyze(run, capsys, "--no-png")
    assert [r["rank"] for r in figures["ranks"]] == [0, 1]
    assert {f"{k['src']}->{k['dst']}": k["nbytes"] for k in figures["links"]} == sent


def test_pipeline_trace(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run = runs["pipeline"]
    trace = read_trace(run / "trace.json")
    check_trace(trace)
    spans = _spans(trace)
    steps, m = _epoch(run)["step"], 4
    assert spans[(0, STEP)] == spans[(1, STEP)] == steps
    for rank in (0, 1):  # training and the evaluation's forwards
        assert spans[(rank, RUN_FOR)] >= steps * m and spans[(rank, RUN_BACK)] == steps * m
    assert spans[(0, SEND_FOR)] >= steps * m and spans[(1, RECEIVE_FOR)] >= steps * m
    assert spans[(1, SEND_BACK)] >= steps * m
    assert spans[(0, RECEIVE_BACK)] == 2 * steps * m  # posting, then waiting inside it
    assert spans[(0, ENCODE)] >= steps * m
    sent = _epoch(run)["bytes_sent"]
    for src, dst in ((0, 1), (1, 0)):  # oracle: the link layer's own byte count
        assert _sent_in_steps(trace, src, dst) == sent[f"{src}->{dst}"] > 0
    png = run / "chart.png"
    figures = _analyze(run, capsys, "--png", str(png))
    assert png.stat().st_size > 0
    assert figures["pipeline"] == {"stages": 2, "microbatches": 4, "schedule": "gpipe"}
    assert figures["bubble"]["theory"] == pytest.approx(1 / 5)
    assert all(k["matched"] and k["messages"] == steps * m for k in figures["links"])
    assert {f"{k['src']}->{k['dst']}": k["nbytes"] for k in figures["links"]} == sent
