"""The `ip` and `tc` commands that build, shape and remove a cluster (pure: lists of argv).

Shaping: a token bucket (`tbf`) on both ends of every host's veth pair: the host's `eth0`
shapes what it sends, the switch end what it receives, each to the link's rate, the
queue up to 100 ms. The bucket is what lets a burst leave at the veth's speed, so it is
kept small: 1 ms of the rate, at least two frames (`burst_bytes`). That needs
segmentation offload off on the veths (`gso_commands`: `gso_max_segs 1`, so TCP hands
the qdisc one MSS per packet instead of GSO packets of up to 64 KiB); where the kernel
refuses that, or where 1 ms of the rate exceeds a GSO packet anyway (above ~500 Mbit/s,
where GSO stays on to spare the CPU), the bucket holds 10 ms, at least 32 KiB. A
latency needs `netem` under the bucket; kernels without it (this development machine's)
get a clear refusal from `manage.cluster_up`.
"""

from __future__ import annotations

from approxdist.cluster.layout import HOST_IFACE, ClusterLayout
from approxdist.comm.netem import LinkSpec

Command = list[str]

QUEUE_MS = 100
#: the largest frame a veth hands the qdisc with segmentation offload off (MTU + Ethernet)
FRAME_BYTES = 1514
#: the largest packet it may hand it with GSO on
GSO_BYTES = 64 * 1024


def build_commands(layout: ClusterLayout) -> list[Command]:
    """Namespaces, the switch's bridge, one veth pair per host with its address, up."""
    sw = layout.switch_ns
    cmds: list[Command] = [["ip", "netns", "add", ns] for ns in layout.namespaces]
    cmds += [["ip", "-n", sw, "link", "add", "br0", "type", "bridge"],
             ["ip", "-n", sw, "link", "set", "br0", "up"],
             ["ip", "-n", sw, "link", "set", "lo", "up"]]
    for h in range(layout.hosts):
        ns, hv, sv = layout.host_ns(h), layout.host_veth(h), layout.switch_veth(h)
        cmds += [["ip", "link", "add", hv, "type", "veth", "peer", "name", sv],
                 ["ip", "link", "set", hv, "netns", ns],
                 ["ip", "link", "set", sv, "netns", sw],
                 ["ip", "-n", ns, "link", "set", hv, "name", HOST_IFACE],
                 ["ip", "-n", ns, "addr", "add", f"{layout.address(h)}/24", "dev", HOST_IFACE],
                 ["ip", "-n", ns, "link", "set", HOST_IFACE, "up"],
                 ["ip", "-n", ns, "link", "set", "lo", "up"],
                 ["ip", "-n", sw, "link", "set", sv, "master", "br0"],
                 ["ip", "-n", sw, "link", "set", sv, "up"]]
    return cmds


def wants_gso_off(spec: LinkSpec) -> bool:
    """Whether the small bucket (1 ms of the rate) is below a GSO packet, so GSO must go."""
    return spec.bandwidth_bps / 8 / 1000 < GSO_BYTES


def gso_commands(layout: ClusterLayout) -> list[Command]:
    """Segmentation offload off on both ends of every host's veth: one MSS per packet."""
    ends = [(layout.host_ns(h), HOST_IFACE) for h in range(layout.hosts)] + \
        [(layout.switch_ns, layout.switch_veth(h)) for h in range(layout.hosts)]
    return [["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"] for ns, dev in ends]


def shape_commands(layout: ClusterLayout, gso_off: bool = False) -> list[Command]:
    """Both directions of every host's link shaped to `layout.link` (none if unshaped);
    `gso_off`: `gso_commands` ran, so the small bucket works."""
    spec = layout.link_spec()
    if spec is None:
        return []
    cmds: list[Command] = []
    for h in range(layout.hosts):
        cmds += qdisc_commands(layout.host_ns(h), HOST_IFACE, spec, gso_off)
        cmds += qdisc_commands(layout.switch_ns, layout.switch_veth(h), spec, gso_off)
    return cmds


def qdisc_commands(ns: str, dev: str, spec: LinkSpec, gso_off: bool = False) -> list[Command]:
    """A token bucket at `spec`'s rate on `dev`'s egress; netem first when it has latency."""
    tc = ["tc", "-n", ns, "qdisc", "add", "dev", dev]
    bucket = ["tbf", "rate", f"{int(spec.bandwidth_bps)}bit", "burst",
              str(burst_bytes(spec, gso_off)), "latency", f"{QUEUE_MS}ms"]
    if spec.latency_s <= 0:
        return [[*tc, "root", *bucket]]
    delay = ["netem", "delay", f"{int(round(spec.latency_s * 1e6))}us"]
    return [[*tc, "root", "handle", "1:", *delay], [*tc, "parent", "1:", "handle", "2:", *bucket]]


def burst_bytes(spec: LinkSpec, gso_off: bool = False) -> int:
    """With GSO off: 1 ms of the rate, at least two frames. With GSO on (it could not be
    turned off, or the rate is high enough not to need it): 10 ms, at least 32 KiB."""
    if gso_off:
        return max(2 * FRAME_BYTES, int(spec.bandwidth_bps / 8 / 1000))
    return max(32 * 1024, int(spec.bandwidth_bps / 8 / 100))


def remove_commands(namespaces: list[str]) -> list[Command]:
    """Deleting a namespace removes its interfaces (both ends of every veth), its bridge
    and its qdiscs: nothing is made outside the namespaces."""
    return [["ip", "netns", "delete", ns] for ns in namespaces]
