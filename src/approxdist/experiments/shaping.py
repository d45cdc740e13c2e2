"""Who shapes an experiment's link: our in-process emulator or the kernel (`--link-shaper`).

Presets that vary the link rate (seed 000 throttled its link with Linux `tc`) run each
training either with `--link bw=RATE` on local ranks (`inproc`, the default) or on a
cluster of network namespaces whose veth links `tc` shapes to RATE, one rank per host,
through `approxdist cluster run` (`kernel`, needs root or CAP_NET_ADMIN;
`approxdist.cluster`), with the torch threads per rank the local runs get (under torchrun
each host would otherwise give its one rank every core). Both write the same run
directory, so the report is the same. Presets that run something else on a shaped link
(seed001-allreduce's benchmark) use `shaped_cluster` and `on_cluster` directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from approxdist.cluster import cluster_down, cluster_up, run_on_cluster
from approxdist.cluster.system import require_net_admin
from approxdist.config.loader import build_config, write_config
from approxdist.errors import ClusterError
from approxdist.experiments.runs import train_run

Sections = dict[str, dict[str, Any]]
SHAPERS = ("inproc", "kernel")


def cluster_name() -> str:
    """The cluster the kernel shaper makes and removes again around each run (one per
    process, so two experiments at once do not share it)."""
    return f"exp{os.getpid() % 100000}"


def check_shaper(shaper: str) -> None:
    """A known shaper, and for `kernel` the right to make namespaces (ClusterError if not)."""
    if shaper not in SHAPERS:
        raise ClusterError(f"--link-shaper {shaper!r} is not one of: {', '.join(SHAPERS)}")
    if shaper == "kernel":
        require_net_admin()


def train_on_link(sections: Sections, run_dir: Path, rate: str, shaper: str) -> dict[str, Any]:
    """Train `sections` over a link of `rate` (e.g. "100mbit") shaped by `shaper`; the run's
    summary. A finished run directory with the same config is reused (as `train_run`)."""
    if shaper == "inproc":
        return train_run({**sections, "comm": {**sections.get("comm", {}), "link": f"bw={rate}"}},
                         run_dir)
    check_shaper(shaper)
    plain = {**sections, "comm": {**sections.get("comm", {}), "link": ""}}
    train = dict(plain.get("train", {}))
    if not train.get("threads"):  # as many torch threads per rank as the local runs take
        world = int(train.get("world_size", 1)) or 1
        train["threads"] = max(1, (os.cpu_count() or 1) // world)
        plain["train"] = train
    cfg = build_config(plain)
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    wanted = run_dir / "train.toml"
    probe = run_dir / ".train.new.toml"
    write_config(cfg, probe)
    summary = run_dir / "summary.json"
    if summary.is_file() and wanted.is_file() and wanted.read_text() == probe.read_text():
        probe.unlink()
        return dict(json.loads(summary.read_text()))
    probe.replace(wanted)
    for name in ("metrics.jsonl", "summary.json", "trace.json"):
        (run_dir / name).unlink(missing_ok=True)
    with shaped_cluster(cfg.train.world_size, f"bw={rate}") as name:
        try:
            on_cluster(name, ["train", "--config", str(wanted), "--out", str(run_dir)],
                       log=run_dir / "cluster.log")
        except ClusterError as exc:
            if not summary.is_file():
                raise
            # the run finished and wrote its summary; a host failed while exiting (seen as
            # "terminate called without an active exception" at teardown): keep the run
            print(f"warning: {exc} (after the run had finished and written its summary)",
                  file=sys.stderr, flush=True)
    return dict(json.loads(summary.read_text()))


@contextlib.contextmanager
def shaped_cluster(hosts: int, link: str) -> Iterator[str]:
    """A fresh cluster of `hosts` namespaced hosts whose links tc shapes to `link` (e.g.
    "bw=100mbit"); its name inside the block, removed on leaving it, also on failure."""
    name = cluster_name()
    cluster_up(name, hosts, link)
    try:
        yield name
    finally:
        cluster_down(name)


def on_cluster(name: str, argv: list[str], log: Path | None = None) -> None:
    """Run `approxdist <argv>` on every host of cluster `name`, its output into `log` (or
    nowhere); ClusterError naming the command and the log if any host fails."""
    with open(log if log is not None else os.devnull, "w") as sink:
        code = run_on_cluster(name, argv, out=sink)
    if code != 0:
        where = (f"its output is in {str(log)!r}" if log is not None else
                 f"run it by hand on `approxdist cluster up --name {name} --hosts 2` to see "
                 f"its output")
        raise ClusterError(f"`approxdist cluster run -- {' '.join(argv)}` failed (exit {code}); "
                           f"{where}")
