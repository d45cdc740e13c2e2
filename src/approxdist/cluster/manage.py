"""`approxdist cluster up | status | down`: make, list and remove namespaced clusters."""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.cluster import state
from approxdist.cluster.commands import (
    build_commands,
    gso_commands,
    remove_commands,
    shape_commands,
    wants_gso_off,
)
from approxdist.cluster.layout import PREFIX, ClusterLayout, check_name
from approxdist.cluster.system import has_netem, namespaces, require_net_admin, run
from approxdist.errors import ClusterError


def cluster_up(name: str, hosts: int, link: str = "") -> ClusterLayout:
    """Make cluster `name`: `hosts` namespaces on one bridge, links shaped to `link`.

    Everything is checked before anything is made; if a step fails, what was made is
    removed again and the error names the failed command."""
    ClusterLayout(name, hosts, 0, link)  # name, host count, link spec: fail before anything
    require_net_admin()
    if state.load(name) is not None:
        raise ClusterError(f"cluster {name!r} exists already; remove it with `approxdist "
                           f"cluster down --name {name}` or pick another --name")
    taken = sorted(ns for ns in namespaces() if ns.startswith(f"{PREFIX}{name}-"))
    if taken:
        raise ClusterError(f"network namespace(s) {', '.join(taken)} exist without a state "
                           f"file; remove them with `approxdist cluster down --name {name}`")
    layout = ClusterLayout(name, hosts, state.free_subnet(), link)
    state.save(layout, "creating")
    try:
        for cmd in build_commands(layout):
            run(cmd)
        spec = layout.link_spec()
        if spec is not None and spec.latency_s > 0 and not has_netem(layout.switch_ns):
            raise ClusterError(f"link {link!r} has a latency, but this kernel has no netem "
                               f"qdisc, so the kernel cannot add latency here; shape "
                               f"bandwidth only (--link bw=...) or use the in-process "
                               f"emulator (`approxdist train --link {link}`)")
        shaping = "" if spec is None else _segmentation_off(layout) if wants_gso_off(spec) \
            else "GSO on (1 ms of the rate exceeds a GSO packet), bucket 10 ms"
        for cmd in shape_commands(layout, gso_off=shaping == GSO_OFF):
            run(cmd)
    except BaseException:
        _remove(layout.namespaces, name)
        raise
    state.save(layout, "up", shaping)
    return layout


GSO_OFF = "GSO off, bucket 1 ms"


def _segmentation_off(layout: ClusterLayout) -> str:
    """Turn GSO off on every veth end: `GSO_OFF`, or why the bucket stays at 10 ms."""
    for cmd in gso_commands(layout):
        done = run(cmd, check=False)
        if done.returncode != 0:
            why = (done.stderr.strip() or f"exit {done.returncode}").splitlines()[0]
            return (f"GSO on (`{' '.join(cmd)}` failed: {why}), so the bucket holds 10 ms "
                    f"and small messages leave at the veth's speed")
    return GSO_OFF


def cluster_down(name: str) -> list[str]:
    """Remove cluster `name` (also one whose `up` died half-way); the namespaces removed."""
    check_name(name)
    require_net_admin()
    found = state.load(name)
    present = namespaces()
    ours = {ns for ns in present if ns.startswith(f"{PREFIX}{name}-")}
    if found is not None:
        ours |= set(found[0].namespaces) & present
    if found is None and not ours:
        known = ", ".join(state.names()) or "none"
        raise ClusterError(f"no cluster named {name!r} (clusters: {known}); `approxdist "
                           f"cluster status` lists them")
    return _remove(sorted(ours), name)


def _remove(candidates: list[str], name: str) -> list[str]:
    present = namespaces()
    gone = [ns for ns in candidates if ns in present]
    for cmd in remove_commands(gone):
        run(cmd)
    left = sorted(set(gone) & namespaces())
    if left:
        raise ClusterError(f"namespaces {', '.join(left)} are still there after `ip netns "
                           f"delete`; a process may hold them (`ip netns pids NS`)")
    state.remove(name)
    return gone


@dataclass(frozen=True)
class ClusterStatus:
    layout: ClusterLayout
    status: str            # "up", or "creating" for an `up` that did not finish
    missing: list[str]     # namespaces of the layout that do not exist (any: broken)
    shaping: str = ""      # how the bucket was set up (GSO off, or why not); "" unshaped

    def line(self) -> str:
        health = "ok" if not self.missing else f"BROKEN: missing {', '.join(self.missing)}"
        shaping = f"; {self.shaping}" if self.shaping else ""
        return f"{self.layout.describe()} [{self.status}, {health}{shaping}]"


def cluster_status() -> list[ClusterStatus]:
    """Every cluster with a state file, and whether its namespaces exist."""
    present = namespaces()
    out = []
    for name in state.names():
        found = state.load(name)
        if found is not None:
            layout, status = found
            out.append(ClusterStatus(layout, status,
                                     [ns for ns in layout.namespaces if ns not in present],
                                     state.shaping(name)))
    return out
