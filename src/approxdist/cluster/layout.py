"""Names and addresses of a namespaced cluster: one "host" per network namespace (pure).

    layout = ClusterLayout("ad", hosts=2, subnet=7, link="bw=100mbit")
    layout.host_ns(1), layout.address(1)        # 'ad-ad-h1', '198.18.7.2'

Every host is a namespace with one interface (`eth0`, address 198.18.<subnet>.<i+1>/24)
whose veth peer sits on a bridge in the cluster's own switch namespace, so nothing is
attached to the machine's own namespace and no route leads out of it. 198.18.0.0/15 is
the range reserved for benchmarking networks (RFC 2544); clusters use 198.18.0-255.x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from approxdist.comm.netem import LinkSpec, parse_link
from approxdist.errors import ClusterError

NAME = re.compile(r"[a-z][a-z0-9]{0,7}")
MAX_HOSTS = 64
SUBNETS = 256
HOST_IFACE = "eth0"
PREFIX = "ad-"  # every namespace approxdist makes starts with it


@dataclass(frozen=True)
class ClusterLayout:
    """`hosts` namespaces named after the cluster, on subnet 198.18.`subnet`.0/24; `link`
    is the spec every host's link is shaped to in each direction ("" for unshaped)."""

    name: str
    hosts: int
    subnet: int
    link: str = ""

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.hosts, bool) or not isinstance(self.hosts, int) or not (
                1 <= self.hosts <= MAX_HOSTS):
            raise ClusterError(f"--hosts {self.hosts!r} must be an integer from 1 to "
                               f"{MAX_HOSTS}; e.g. --hosts 2")
        if not 0 <= self.subnet < SUBNETS:
            raise ClusterError(f"subnet {self.subnet} is outside 198.18.0-255.0/24")
        self.link_spec()  # a bad spec fails here, before anything is made

    def link_spec(self) -> LinkSpec | None:
        return parse_link(self.link) if self.link else None

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}{self.name}-sw"

    def host_ns(self, host: int) -> str:
        return f"{PREFIX}{self.name}-h{host}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns, *(self.host_ns(h) for h in range(self.hosts))]

    def address(self, host: int) -> str:
        return f"198.18.{self.subnet}.{host + 1}"

    def host_veth(self, host: int) -> str:
        """The host end's name until it moves into its namespace (then `eth0`)."""
        return f"ad{self.subnet}h{host}"

    def switch_veth(self, host: int) -> str:
        return f"ad{self.subnet}p{host}"

    def describe(self) -> str:
        link = self.link or "unshaped"
        hosts = ", ".join(f"{self.host_ns(h)} {self.address(h)}" for h in range(self.hosts))
        return f"cluster {self.name!r}: {self.hosts} host(s) on 198.18.{self.subnet}.0/24, " \
               f"link {link} each way: {hosts}"


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ClusterError(f"cluster name {name!r} must be 1-8 lower-case letters or digits, "
                           f"starting with a letter (it becomes part of namespace and "
                           f"interface names); e.g. --name ad")
