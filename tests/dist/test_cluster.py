"""Real multi-host runs: namespaced hosts, tc-shaped links, torchrun across (needs root).

One 2-host cluster serves every check (making one takes ~0.2 s, the runs take the time):
its link measures within 10 % of the shaped rate; data-parallel training on 2 hosts x 2
processes ends with the same parameters as 4 processes on one host; a pipeline across
the hosts reaches the same accuracy as on one host; killing every process of one host
ends the run with the host named; `down` leaves no namespace or interface behind.
Skipped, with the reason, where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from approxdist.cli.main import main
from approxdist.cluster import (
    ClusterLayout,
    cluster_down,
    cluster_status,
    cluster_up,
    run_on_cluster,
    state,
)
from approxdist.cluster.probe import measure
from approxdist.cluster.system import namespaces
from tests.helpers.waiting import wait_for_file

TRAIN = ["train", "--model", "mlp", "--epochs", "1"]


def _why_not() -> str:
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"ad-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return "" if made.returncode == 0 else f"ip netns add failed: {made.stderr.strip()}"


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterLayout]:
    mp = pytest.MonkeyPatch()
    mp.setenv(state.DIR_ENV, str(tmp_path_factory.mktemp("clusters")))
    name = f"ci{os.getpid() % 100000}"
    try:
        yield cluster_up(name, 2, "bw=200mbit")
    finally:
        with contextlib.suppress(Exception):
            cluster_down(name)
        mp.undo()


def _single_host(argv: list[str], world: int) -> None:
    """The same command on this host, run in this process (its ranks fork from the suite's
    fork server: no interpreter to start)."""
    assert main([*argv, "--world-size", str(world)]) == 0


def test_hosts_route_only_inside_the_cluster(cluster: ClusterLayout) -> None:
    for h in range(cluster.hosts):
        routes = subprocess.run(["ip", "-n", cluster.host_ns(h), "route"], capture_output=True,
                                text=True, check=True).stdout.strip().splitlines()
        assert len(routes) == 1 and routes[0].startswith(f"198.18.{cluster.subnet}.0/24 dev eth0")
    qdiscs = subprocess.run(["tc", "-n", cluster.switch_ns, "qdisc"], capture_output=True,
                            text=True, check=True).stdout
    assert qdiscs.count("tbf") == cluster.hosts and "rate 200Mbit" in qdiscs


def test_segmentation_offload_is_off_so_the_bucket_is_small(cluster: ClusterLayout) -> None:
    (status,) = [s for s in cluster_status() if s.layout.name == cluster.name]
    if not status.shaping.startswith("GSO off"):  # the kernel refused: the reason is stated
        assert "failed" in status.shaping and "10 ms" in status.shaping, status.shaping
        return
    for ns, dev in [(cluster.host_ns(0), "eth0"), (cluster.switch_ns, cluster.switch_veth(0))]:
        link = subprocess.run(["ip", "-n", ns, "-d", "link", "show", dev], capture_output=True,
                              text=True, check=True).stdout
        assert "gso_max_segs 1 " in link, link
    qdiscs = subprocess.run(["tc", "-n", cluster.host_ns(0), "qdisc"], capture_output=True,
                            text=True, check=True).stdout
    assert "burst 25000b" in qdiscs, qdiscs  # 1 ms of 200 Mbit/s


def test_the_shaped_link_caps_its_rate(cluster: ClusterLayout) -> None:
    """Every byte arrives, never faster than the shaped 200 Mbit/s (plus its 1 ms burst);
    an unshaped veth pair carries gigabits. How close to the rate a transfer comes depends
    on the CPU the machine has free, so no lower bound is asserted (`cluster check`
    reports the rate; docs/cluster.md)."""
    (rate,) = measure(cluster, 8 << 20)
    assert rate.host == 1 and rate.nbytes == 8 << 20
    assert rate.mbit_s <= 1.1 * 200, rate


def test_data_parallel_across_hosts_equals_one_host(cluster: ClusterLayout,
                                                    tmp_path: Path) -> None:
    args = [*TRAIN, "--parallel", "dp", "--batch-size", "64"]
    out = io.StringIO()
    assert run_on_cluster(cluster.name, [*args, "--world-size", "4", "--out",
                                         str(tmp_path / "two")], nproc_per_host=2,
                          out=out) == 0, out.getvalue()
    _single_host([*args, "--out", str(tmp_path / "one")], 4)
    two = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)["model"]
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=False)["model"]
    assert two.keys() == one.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=1e-5, rtol=0, msg=key)
    assert "[host 0] done: test accuracy" in out.getvalue()


def test_pipeline_across_hosts_trains_as_on_one_host(cluster: ClusterLayout,
                                                     tmp_path: Path) -> None:
    args = [*TRAIN, "--parallel", "pipeline", "--stages", "2", "--microbatches", "4"]
    out = io.StringIO()
    assert run_on_cluster(cluster.name, [*args, "--out", str(tmp_path / "two")],
                          out=out) == 0, out.getvalue()
    _single_host([*args, "--out", str(tmp_path / "one")], 2)
    two = (tmp_path / "two" / "summary.json").read_text()
    one = (tmp_path / "one" / "summary.json").read_text()
    assert _accuracy(two) == _accuracy(one) > 0.1


def _accuracy(summary: str) -> float:
    import json

    return float(json.loads(summary)["test_accuracy"])


def test_a_lost_host_ends_the_run_naming_it(cluster: ClusterLayout, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Every process of host 1 killed mid-run: host 0's rank fails naming rank 1 (or its
    host's address) and its host ends on its own, not stopped after the grace period; the
    report names host 1 as the first to fail. The rank learns it from the dropped
    connection, or, where no reset reaches it (a host that vanishes sends none; one lost in
    the shaped link's full queue), from the run's collective timeout, set below the grace
    period. The grace period and the test's joins only bound a hang."""
    argv = [*TRAIN, "--parallel", "dp", "--world-size", "2", "--epochs", "200",
            "--set", "train.timeout_s=30", "--out", str(tmp_path / "run")]
    result: list[int] = []
    log = io.StringIO()
    runner = threading.Thread(target=lambda: result.append(
        run_on_cluster(cluster.name, argv, grace_s=60.0, out=log)))
    runner.start()
    # training has started on both hosts
    wait_for_file(tmp_path / "run" / "metrics.jsonl", 120)
    pids = subprocess.run(["ip", "netns", "pids", cluster.host_ns(1)], capture_output=True,
                          text=True, check=True).stdout.split()
    assert pids, "host 1 runs no process"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), 9)
    runner.join(timeout=120)
    assert not runner.is_alive() and result and result[0] != 0
    err = capsys.readouterr().err
    assert f"host 1 ({cluster.host_ns(1)}, {cluster.address(1)}) was killed by signal SIGKILL " \
           "(first to fail)" in err
    assert f"host 0 ({cluster.host_ns(0)}, {cluster.address(0)}) exited with status" in err, \
        err + log.getvalue()
    errors = [line for line in log.getvalue().splitlines()
              if line.startswith("[host 0] approxdist: error: ")]
    assert len(errors) == 1, log.getvalue()
    assert re.search(r"closed by peer|reset by peer|Broken pipe|Timed out waiting 30000ms",
                     errors[0]), errors[0]
    assert "rank 1" in errors[0] or cluster.address(1) in errors[0], errors[0]


def test_down_leaves_nothing_behind(cluster: ClusterLayout) -> None:
    # last in this module: the fixture's own `down` then finds nothing to do
    gone = cluster_down(cluster.name)
    assert sorted(gone) == sorted(cluster.namespaces)
    assert not set(cluster.namespaces) & namespaces()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"ad{cluster.subnet}h" not in links and f"ad{cluster.subnet}p" not in links
    assert state.load(cluster.name) is None


def test_a_link_preset_runs_on_tc_shaped_hosts(cluster: ClusterLayout, tmp_path: Path) -> None:
    """`experiment seed000-bandwidth --link-shaper kernel`: every run on a fresh 2-host
    cluster shaped to its rate, removed afterwards; the report says who shaped the link."""
    from approxdist.experiments import Settings, run_experiment
    from approxdist.experiments.csvio import read_csv
    from approxdist.experiments.seed000_bandwidth import COLUMNS

    before = set(namespaces())
    report = run_experiment("seed000-bandwidth",
                            Settings(tmp_path, size="smoke", link_shaper="kernel"))
    rows = read_csv(tmp_path / "bandwidth.csv", COLUMNS)
    assert [r["config"] for r in rows] == ["fp32", "4-bit fwd"]
    assert all(float(r["epoch_time_s"]) > 0 for r in rows)
    assert all((p / "cluster.log").is_file() for p in (tmp_path / "runs").iterdir())
    text = report.read_text()
    assert "tc-shaped links between namespaced hosts" in text and "emulated per" not in text
    assert set(namespaces()) == before


def test_the_allreduce_preset_runs_on_tc_shaped_hosts(cluster: ClusterLayout,
                                                      tmp_path: Path) -> None:
    """`experiment seed001-allreduce --smoke --link bw=1gbit --link-shaper kernel`: per world
    size (the smoke size has one, 2) a fresh cluster, one rank per host, `bench allreduce`
    run there; rows for every algorithm, and no namespace of it left afterwards."""
    from approxdist.experiments import Settings, run_experiment
    from approxdist.experiments.csvio import read_csv
    from approxdist.experiments.seed001_allreduce import COLUMNS
    from approxdist.experiments.shaping import cluster_name

    before = set(namespaces())
    report = run_experiment("seed001-allreduce", Settings(tmp_path, size="smoke",
                                                          link="bw=1gbit", link_shaper="kernel"))
    rows = read_csv(tmp_path / "allreduce.csv", COLUMNS)
    algorithms = {"native", "brb", "brd", "vhd", "ring", "auto"}
    assert {(r["world_size"], r["algorithm"]) for r in rows} == {
        (2, a) for a in algorithms}
    assert all(float(r["median_s"]) > 0 and int(r["repeats"]) >= 2 for r in rows)
    log = (tmp_path / "kernel-N2-measure.log").read_text()  # the hosts' output, one rank each
    assert "[host 0] reproduce: approxdist bench allreduce --world-size 2 " in log
    assert "shaped by the kernel (`--link-shaper kernel`)" in report.read_text()
    assert set(namespaces()) == before
    assert not [ns for ns in namespaces() if ns.startswith(f"ad-{cluster_name()}-")]
    assert state.load(cluster_name()) is None
