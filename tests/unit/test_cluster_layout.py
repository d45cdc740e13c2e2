"""Namespaced clusters without making any: names, addresses, commands, state, bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.cluster import manage, state
from approxdist.cluster.commands import (
    build_commands,
    burst_bytes,
    gso_commands,
    remove_commands,
    shape_commands,
    wants_gso_off,
)
from approxdist.cluster.layout import ClusterLayout
from approxdist.cluster.run import _report, _wait, run_on_cluster, torchrun_argv
from approxdist.cluster.system import _has_cap
from approxdist.comm.netem import LinkSpec
from approxdist.errors import ClusterError, SpecError


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(state.DIR_ENV, str(tmp_path / "clusters"))
    return tmp_path / "clusters"


def test_layout_names_addresses_in_the_benchmarking_range() -> None:
    layout = ClusterLayout("ad", 3, 7, "bw=100mbit")
    assert layout.namespaces == ["ad-ad-sw", "ad-ad-h0", "ad-ad-h1", "ad-ad-h2"]
    assert [layout.address(h) for h in range(3)] == ["198.18.7.1", "198.18.7.2", "198.18.7.3"]
    assert all(len(n) <= 15 for n in (layout.host_veth(2), layout.switch_veth(2)))
    assert "ad-ad-h2 198.18.7.3" in layout.describe()


def test_commands_build_a_bridge_and_shape_both_ends_of_every_link() -> None:
    layout = ClusterLayout("ad", 2, 7, "bw=100mbit")
    cmds = [" ".join(c) for c in build_commands(layout)]
    assert cmds[:3] == ["ip netns add ad-ad-sw", "ip netns add ad-ad-h0", "ip netns add ad-ad-h1"]
    assert "ip -n ad-ad-h1 addr add 198.18.7.2/24 dev eth0" in cmds
    assert "ip -n ad-ad-sw link set ad7p1 master br0" in cmds
    assert not any(c.startswith("ip route") for c in cmds)  # nothing routes out
    shaped = [" ".join(c) for c in shape_commands(layout)]
    assert shaped == [
        "tc -n ad-ad-h0 qdisc add dev eth0 root tbf rate 100000000bit burst 125000 latency 100ms",
        "tc -n ad-ad-sw qdisc add dev ad7p0 root tbf rate 100000000bit burst 125000 latency 100ms",
        "tc -n ad-ad-h1 qdisc add dev eth0 root tbf rate 100000000bit burst 125000 latency 100ms",
        "tc -n ad-ad-sw qdisc add dev ad7p1 root tbf rate 100000000bit burst 125000 latency 100ms"]
    assert shape_commands(ClusterLayout("ad", 2, 7)) == []
    with_lat = [" ".join(c) for c in shape_commands(ClusterLayout("ad", 1, 0, "bw=1gbit,lat=2ms"))]
    assert with_lat[0] == "tc -n ad-ad-h0 qdisc add dev eth0 root handle 1: netem delay 2000us"
    assert with_lat[1].startswith("tc -n ad-ad-h0 qdisc add dev eth0 parent 1: handle 2: tbf")
    assert burst_bytes(LinkSpec(10e6)) == 32 * 1024 and burst_bytes(LinkSpec(1e9)) == 1_250_000
    # with segmentation offload off, 1 ms of the rate, at least two frames
    assert burst_bytes(LinkSpec(1e8), gso_off=True) == 12_500
    assert burst_bytes(LinkSpec(2e6), gso_off=True) == 2 * 1514
    small = [" ".join(c) for c in shape_commands(layout, gso_off=True)]
    assert small[0] == ("tc -n ad-ad-h0 qdisc add dev eth0 root tbf rate 100000000bit "
                        "burst 12500 latency 100ms")
    assert [" ".join(c) for c in gso_commands(layout)] == [
        "ip -n ad-ad-h0 link set dev eth0 gso_max_segs 1",
        "ip -n ad-ad-h1 link set dev eth0 gso_max_segs 1",
        "ip -n ad-ad-sw link set dev ad7p0 gso_max_segs 1",
        "ip -n ad-ad-sw link set dev ad7p1 gso_max_segs 1"]
    assert wants_gso_off(LinkSpec(1e8)) and not wants_gso_off(LinkSpec(1e9))
    assert remove_commands(["ad-ad-h0"]) == [["ip", "netns", "delete", "ad-ad-h0"]]


def test_bad_names_counts_and_links_are_refused() -> None:
    with pytest.raises(ClusterError, match="cluster name 'Big-Name' must be 1-8 lower-case"):
        ClusterLayout("Big-Name", 2, 0)
    with pytest.raises(ClusterError, match=r"--hosts 0 must be an integer from 1 to 64"):
        ClusterLayout("ad", 0, 0)
    with pytest.raises(SpecError, match="bad field 'rate=1'"):
        ClusterLayout("ad", 2, 0, "rate=1")


def test_state_round_trip_and_free_subnets() -> None:
    assert state.names() == [] and state.free_subnet() == 0
    state.save(ClusterLayout("one", 2, 0, "bw=10mbit"), "up")
    state.save(ClusterLayout("two", 3, 1), "creating")
    assert state.names() == ["one", "two"] and state.free_subnet() == 2
    layout, status = state.load("one") or (None, "")
    assert layout == ClusterLayout("one", 2, 0, "bw=10mbit") and status == "up"
    state.remove("one")
    assert state.free_subnet() == 0 and state.load("one") is None
    (state.state_dir() / "bad.json").write_text("{}")
    with pytest.raises(ClusterError, match="bad.json is not an approxdist cluster state file"):
        state.load("bad")


def test_a_kernel_that_refuses_gso_off_keeps_the_old_bucket_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    layout = ClusterLayout("ad", 2, 7, "bw=100mbit")
    ran: list[list[str]] = []

    def refuse(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 2, "", "Error: unknown attribute gso_max_segs\n")

    monkeypatch.setattr(manage, "run", refuse)
    why = manage._segmentation_off(layout)
    assert len(ran) == 1 and why.startswith("GSO on (`ip -n ad-ad-h0 link set dev eth0")
    assert "unknown attribute gso_max_segs" in why and "10 ms" in why
    monkeypatch.setattr(manage, "run", lambda cmd, check=True: subprocess.CompletedProcess(
        cmd, 0, "", ""))
    assert manage._segmentation_off(layout) == manage.GSO_OFF
    state.save(layout, "up", why)
    assert state.shaping("ad") == why and state.shaping("none") == ""
    line = manage.ClusterStatus(layout, "up", [], manage.GSO_OFF).line()
    assert line.endswith("[up, ok; GSO off, bucket 1 ms]")


def test_run_needs_a_cluster_that_is_up_and_a_command() -> None:
    with pytest.raises(ClusterError, match="no cluster named 'x'; make one with"):
        run_on_cluster("x", ["train"])
    with pytest.raises(ClusterError, match="nothing to run: put an approxdist command after"):
        run_on_cluster("x", ["approxdist"])
    state.save(ClusterLayout("half", 2, 0), "creating")
    with pytest.raises(ClusterError, match="cluster 'half' is 'creating', not up"):
        run_on_cluster("half", ["train"])


def test_torchrun_command_binds_gloo_and_names_the_store_host() -> None:
    layout = ClusterLayout("ad", 2, 3)
    argv = torchrun_argv(layout, 1, 2, 29400, ["train", "--epochs", "1"], python="py")
    text = " ".join(argv)
    # 2 hosts x 2 processes share one machine's cores: each rank takes a quarter of them
    assert text.startswith("ip netns exec ad-ad-h1 env GLOO_SOCKET_IFNAME=eth0 "
                           "APPROXDIST_RANKS_PER_MACHINE=4 py -m "
                           "torch.distributed.run --nnodes 2 --nproc-per-node 2")
    assert "--rdzv-endpoint 198.18.3.1:29400" in text and "is_host=false" in text
    assert text.endswith("--local-addr 198.18.3.2 -m approxdist train --epochs 1")
    assert "is_host=true" in " ".join(torchrun_argv(layout, 0, 1, 29400, ["train"]))


def test_report_names_the_host_that_failed_first(capsys: pytest.CaptureFixture[str]) -> None:
    layout = ClusterLayout("ad", 3, 0)
    assert _report(layout, [0, 0, 0], [2, 0, 1]) == 0
    assert _report(layout, [None, -9, 1], [1, 2], grace_s=60.0) == 1
    err = capsys.readouterr().err
    assert "host 1 (ad-ad-h1, 198.18.0.2) was killed by signal SIGKILL (first to fail)" in err
    assert "host 2 (ad-ad-h2, 198.18.0.3) exited with status 1\n" in err
    # host 0 still waited for host 1 (a vanished host resets no connection): the line names
    # the lost host, where it was, and why its peers had not ended by themselves
    (stopped,) = [line for line in err.splitlines() if "host 0 " in line]
    assert stopped.startswith("approxdist cluster: host 0 (ad-ad-h0, 198.18.0.1) was stopped "
                              "60 s after host 1 (ad-ad-h1, 198.18.0.2) failed"), stopped
    assert "host 1 is lost" in stopped and "train.timeout_s" in stopped and "--grace" in stopped


def test_a_host_still_running_after_the_grace_period_is_stopped_naming_the_lost_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`_wait` on real processes: host 1 ends with status 3, host 0 would wait for ever (as
    a rank whose peer vanished without a reset waits for its collective timeout); with no
    grace it is stopped, and the report names host 1 as the first to fail and the lost one."""
    layout = ClusterLayout("ad", 2, 0)
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, text=True, start_new_session=True)
             for argv in (["cat"], ["sh", "-c", "exit 3"])]
    try:
        codes, order = _wait(procs, grace_s=0.0)
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
    assert codes == [None, 3] and order == [1] and procs[0].poll() is not None
    assert _report(layout, codes, order, grace_s=0.0) == 3
    err = capsys.readouterr().err
    assert "host 1 (ad-ad-h1, 198.18.0.2) exited with status 3 (first to fail)" in err
    assert "host 0 (ad-ad-h0, 198.18.0.1) was stopped 0 s after host 1 " in err


def test_capability_is_read_from_proc_status(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000001000\n")
    assert _has_cap(status, 12)
    status.write_text("CapEff:\t0000000000000000\n")
    assert not _has_cap(status, 12)


def test_cli_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "run", "--name", "nope", "--", "train"]) == 2
    assert main(["cluster", "up", "--hosts", "0"]) == 2
    assert main(["cluster", "up", "--hosts", "2", "--link", "bw=fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("approxdist: error: no cluster named 'nope'")
    assert err[1] == ("approxdist: error: --hosts 0 must be an integer from 1 to 64; "
                      "e.g. --hosts 2")
    assert err[2].startswith("approxdist: error: bandwidth 'fast' is not <number><unit>")
    assert len(err) == 3
