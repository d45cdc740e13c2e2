"""`approxdist cluster up | status | down | run`: real multi-host runs on one machine.

    approxdist cluster up --hosts 2 --link bw=100mbit        # namespaces, bridge, tc
    approxdist cluster run --nproc-per-host 2 -- train --parallel dp --world-size 4
    approxdist cluster check                                  # each link's real rate
    approxdist cluster status
    approxdist cluster down

Needs root or CAP_NET_ADMIN. Hosts get addresses in 198.18.0.0/15 inside namespaces
approxdist makes; nothing routes out of the machine (docs/cluster.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.cli.groups import command_group
from approxdist.cluster import cluster_down, cluster_status, cluster_up, run_on_cluster
from approxdist.cluster.probe import measure
from approxdist.cluster.run import DEFAULT_PORT, GRACE_S, cluster_layout

DEFAULT_NAME = "ad"


def register(sub: Any) -> None:
    kinds = command_group(sub, "cluster", "hosts as network namespaces with tc-shaped links",
                          "Make a cluster of hosts on this machine (one network namespace "
                          "each, on one bridge, links shaped by the kernel) and run any "
                          "approxdist command across them with torchrun.")
    up = kinds.add_parser("up", help="make the hosts and their links")
    up.add_argument("--hosts", type=int, required=True, help="number of hosts (namespaces)")
    up.add_argument("--link", default="", help="each host's link, both ways, shaped by tc "
                                               "(e.g. bw=100mbit; default unshaped)")
    _name(up)
    up.set_defaults(func=run_up)
    check = kinds.add_parser("check", help="measure each host's link (TCP) against its shaping")
    _name(check)
    check.add_argument("--mbytes", type=float, default=8.0, help="MiB each host sends")
    check.set_defaults(func=run_check)
    status = kinds.add_parser("status", help="list the clusters and whether they are whole")
    status.set_defaults(func=run_status)
    down = kinds.add_parser("down", help="remove a cluster (also one whose up failed)")
    _name(down)
    down.set_defaults(func=run_down)
    run = kinds.add_parser("run", help="run an approxdist command on every host (torchrun)",
                           description="Everything after `--` is the approxdist command, "
                                       "e.g. `approxdist cluster run -- train --epochs 1`.")
    _name(run)
    run.add_argument("--nproc-per-host", type=int, default=1, help="processes per host")
    run.add_argument("--port", type=int, default=DEFAULT_PORT, help="rendezvous port on host 0")
    run.add_argument("--grace", type=float, default=GRACE_S,
                     help="seconds the other hosts get to end after one fails (its peers "
                          "notice a host that vanishes only at train.timeout_s, 120 s by "
                          "default; a host stopped before names the lost one)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- <approxdist command>")
    run.set_defaults(func=run_run)


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")


def run_up(args: argparse.Namespace) -> int:
    layout = cluster_up(args.name, args.hosts, args.link)
    print(layout.describe())
    return 0


def run_status(args: argparse.Namespace) -> int:
    found = cluster_status()
    for status in found:
        print(status.line())
    if not found:
        print("no clusters (make one with `approxdist cluster up --hosts 2`)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    layout = cluster_layout(args.name)
    spec = layout.link_spec()
    for rate in measure(layout, int(args.mbytes * (1 << 20))):
        vs = "" if spec is None else f" ({rate.mbit_s / (spec.bandwidth_bps / 1e6):.2f}x {layout.link})"
        print(f"host {rate.host} -> host 0: {rate.nbytes / (1 << 20):.1f} MiB in "
              f"{rate.seconds:.3f} s, {rate.mbit_s:.1f} Mbit/s{vs}")
    return 0


def run_down(args: argparse.Namespace) -> int:
    gone = cluster_down(args.name)
    print(f"removed cluster {args.name!r}: {', '.join(gone) or 'no namespaces were left'}")
    return 0


def run_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return run_on_cluster(args.name, command, args.nproc_per_host, args.port, args.grace)
