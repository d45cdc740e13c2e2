"""Binding ranks to cores (`launch/affinity.py`, `--bind-cores`): the pure plan, the
binding of every thread, the worker's machine ranks and bad input."""

from __future__ import annotations

import os
import threading

import pytest

from approxdist.benchmarks.pipeline import BenchCase
from approxdist.cli.bench_hybrid import hidden
from approxdist.cli.main import main
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.launch.affinity import bind_rank, bind_threads, check_policy, plan_cores
from approxdist.launch.context import DistContext
from approxdist.topology import Mesh
from approxdist.train.worker import machine_ranks

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


def test_rows_share_cores_and_a_stages_replicas_get_different_ones() -> None:
    grid = Mesh.stages(2, 2)  # ranks 0, 1: stage 0; 2, 3: stage 1
    rows = [grid.place(r).replica for r in range(4)]
    got = plan_cores(rows, [0, 1])
    assert got == [(0,), (1,), (0,), (1,)]
    for stage in (0, 1):
        a, b = (r for r in range(4) if grid.place(r).stage == stage)
        assert set(got[a]).isdisjoint(got[b])  # the replicas meet at the all-reduce together


def test_slices_are_equal_contiguous_and_cover_the_cores() -> None:
    assert plan_cores([0, 1], [0, 1, 2, 3, 4, 5, 6, 7]) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert plan_cores([0, 1, 2], [0, 1, 2, 3, 4, 5, 6]) == [(0, 1, 2), (3, 4), (5, 6)]
    assert plan_cores([5, 5, 9], [2, 3]) == [(2,), (2,), (3,)]  # first-seen order
    assert plan_cores(list(range(5)), [0, 1]) == [(0,), (1,), (0,), (1,), (0,)]
    with pytest.raises(ConfigError, match="no core"):
        plan_cores([0], [])


def test_data_parallel_rows_are_ranks_and_a_plain_pipeline_is_one_row() -> None:
    dp = Mesh.data_parallel(4)
    assert plan_cores([dp.place(r).replica for r in range(4)], [0, 1, 2, 3]) == \
        [(0,), (1,), (2,), (3,)]
    pipe = Mesh.stages(3, 1)
    assert plan_cores([pipe.place(r).replica for r in range(3)], [0, 1]) == [(0, 1)] * 3


@linux
def test_binding_reaches_every_thread_of_the_process() -> None:
    before = os.sched_getaffinity(0)
    core = min(before)
    started, stop = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def worker() -> None:
        started.set()
        stop.wait()
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    try:
        bind_threads([core])  # a thread started before the binding is bound too
        assert os.sched_getaffinity(0) == {core}
    finally:
        stop.set()
        t.join()
        bind_threads(sorted(before))
    assert seen == [{core}]


@linux
def test_bind_rank_by_policy() -> None:
    before = os.sched_getaffinity(0)
    try:
        assert bind_rank("none", 1, range(4), [0, 1, 0, 1]) is None
        assert os.sched_getaffinity(0) == before
        cores = sorted(before)
        got = bind_rank("row", 2, range(4), [0, 1, 0, 1])
        assert got == plan_cores([0, 1, 0, 1], cores)[2]
        assert os.sched_getaffinity(0) == set(got)
        bind_threads(cores)  # a process binds once: the plan reads its affinity
        got = bind_rank("rank", 3, range(4), [0, 0, 0, 0])
        assert got == plan_cores([0, 1, 2, 3], cores)[3]
    finally:
        bind_threads(sorted(before))


def test_machine_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = DistContext(rank=5, world_size=8, local_rank=1, backend="gloo",
                      device=__import__("torch").device("cpu"))
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "APPROXDIST_RANKS_PER_MACHINE"):
        monkeypatch.delenv(name, raising=False)
    assert machine_ranks(ctx) == range(8)  # the local launcher: one machine
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert machine_ranks(ctx) == range(4, 8)  # torchrun's node
    monkeypatch.setenv("APPROXDIST_RANKS_PER_MACHINE", "8")
    assert machine_ranks(ctx) == range(8)  # cluster run: every host on this machine


def test_bad_policy_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="train.bind_cores = 'cores' is not one of"):
        build_config({"train": {"bind_cores": "cores"}})
    with pytest.raises(ConfigError, match="--bind-cores 'x' is not one of: none, rank, row"):
        check_policy("x")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--bind-cores", "cores"])
    assert exc.value.code == 2
    assert "--bind-cores: invalid choice: 'cores'" in capsys.readouterr().err


def test_no_binding_where_the_platform_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    check_policy("none")  # nothing to bind
    with pytest.raises(ConfigError, match="--bind-cores needs Linux"):
        check_policy("row")


def test_hidden_share_weighs_each_stage_by_its_all_reduce() -> None:
    case = BenchCase("resnet20", (3, 32, 32), 2, 4, "gpipe", replicas=2)
    ranks = [{"stage": 0, "blocked_s": 0.002, "comm_only_s": 0.001},   # 0 % hidden
             {"stage": 0, "blocked_s": 0.003, "comm_only_s": 0.001},
             {"stage": 1, "blocked_s": 0.001, "comm_only_s": 0.020},   # 95 % hidden
             {"stage": 1, "blocked_s": 0.004, "comm_only_s": 0.020}]
    got = hidden(case, ranks)
    assert [s["hidden_comm_fraction"] for s in got["by_stage"]] == pytest.approx([0.0, 0.95])
    assert got["hidden_comm_fraction_stage_mean"] == pytest.approx(0.475)
    # 1 - (2 + 1 ms blocked) / (1 + 20 ms alone): the 20-ms all-reduce weighs 20 times more
    assert got["hidden_comm_fraction"] == pytest.approx(1 - 3 / 21)
