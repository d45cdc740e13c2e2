"""The kernel link shaper's run handling, without namespaces (cluster calls faked): the
command each run gets, threads per rank, reuse of a finished run, and a host that fails
while exiting after the run wrote its summary (kept, with a warning) or before (an error)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.errors import ClusterError
from approxdist.experiments import shaping

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "pipeline", "world_size": 2, "epochs": 1},
    "data": {"dataset": "digits"}, "model": {"name": "mlp"}}


def _fake(monkeypatch: pytest.MonkeyPatch, calls: list[Any], writes: bool, fails: bool) -> None:
    monkeypatch.setattr(shaping, "check_shaper", lambda shaper: None)
    monkeypatch.setattr(shaping, "cluster_up", lambda *a: calls.append(("up", a)))
    monkeypatch.setattr(shaping, "cluster_down", lambda name: calls.append(("down", name)))

    def run(name: str, argv: list[str], log: Path | None = None) -> None:
        calls.append(("run", argv))
        out = Path(argv[argv.index("--out") + 1])
        if writes:
            (out / "summary.json").write_text(json.dumps({"test_accuracy": 0.5}))
        if fails:
            raise ClusterError("`approxdist cluster run -- train` failed (exit 1)")

    monkeypatch.setattr(shaping, "on_cluster", run)


def test_a_run_on_the_kernel_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    _fake(monkeypatch, calls, writes=True, fails=False)
    assert shaping.train_on_link(SECTIONS, tmp_path, "10mbit", "kernel")["test_accuracy"] == 0.5
    kinds = [c[0] for c in calls]
    assert kinds == ["up", "run", "down"] and calls[0][1][1:] == (2, "bw=10mbit")
    toml = (tmp_path / "train.toml").read_text()
    assert 'link = ""' in toml and "threads = " in toml and "threads = 0" not in toml
    calls.clear()  # the same config again: reused, nothing runs
    shaping.train_on_link(SECTIONS, tmp_path, "10mbit", "kernel")
    assert calls == []


def test_a_host_failing_at_exit_after_the_summary_keeps_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[Any] = []
    _fake(monkeypatch, calls, writes=True, fails=True)
    assert shaping.train_on_link(SECTIONS, tmp_path, "2mbit", "kernel")["test_accuracy"] == 0.5
    assert "after the run had finished and written its summary" in capsys.readouterr().err
    assert calls[-1][0] == "down"


def test_a_failure_before_the_summary_is_an_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    _fake(monkeypatch, calls, writes=False, fails=True)
    with pytest.raises(ClusterError, match="failed"):
        shaping.train_on_link(SECTIONS, tmp_path, "2mbit", "kernel")
    assert calls[-1][0] == "down"  # the cluster is removed also on failure
