"""`approxdist cluster check`: the rate each host's link really carries (TCP, one stream).

Host 0 listens; every other host in turn sends `nbytes` to it over its own link (host 0's
inbound link is shared, so hosts are measured one after the other). The receiver times
from the first byte to the last, so connection set-up is not counted.

    python -m approxdist.cluster.probe serve ADDRESS PORT COUNT   # prints one line per sender
    python -m approxdist.cluster.probe send ADDRESS PORT NBYTES
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from approxdist.cluster.layout import ClusterLayout
from approxdist.errors import ClusterError

PORT = 29399
CHUNK = 1 << 16


@dataclass(frozen=True)
class LinkRate:
    host: int
    nbytes: int
    seconds: float

    @property
    def mbit_s(self) -> float:
        return 8 * self.nbytes / self.seconds / 1e6


def measure(layout: ClusterLayout, nbytes: int = 8 << 20, port: int = PORT,
            timeout_s: float = 120.0) -> list[LinkRate]:
    """Host h -> host 0 for every h >= 1, one at a time."""
    if layout.hosts < 2:
        raise ClusterError(f"cluster {layout.name!r} has one host: no link to measure")
    ns0, addr0 = layout.host_ns(0), layout.address(0)
    server = subprocess.Popen(["ip", "netns", "exec", ns0, sys.executable, "-m",
                               "approxdist.cluster.probe", "serve", addr0, str(port),
                               str(layout.hosts - 1)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "listening":
            raise ClusterError(f"the probe server on {ns0} did not start")
        rates = []
        for h in range(1, layout.hosts):
            subprocess.run(["ip", "netns", "exec", layout.host_ns(h), sys.executable, "-m",
                            "approxdist.cluster.probe", "send", addr0, str(port), str(nbytes)],
                           check=True, timeout=timeout_s, capture_output=True)
            got = json.loads(server.stdout.readline())
            rates.append(LinkRate(h, int(got["nbytes"]), float(got["seconds"])))
        return rates
    except subprocess.SubprocessError as exc:
        raise ClusterError(f"link probe of cluster {layout.name!r} failed: {exc}") from exc
    finally:
        server.kill()
        server.wait()


def _serve(address: str, port: int, count: int) -> None:
    with socket.create_server((address, port)) as srv:
        print("listening", flush=True)
        for _ in range(count):
            conn, _ = srv.accept()
            with conn:
                first, total = None, 0
                while chunk := conn.recv(CHUNK):
                    first = time.perf_counter() if first is None else first
                    total += len(chunk)
                end = time.perf_counter()
                print(json.dumps({"nbytes": total, "seconds": end - (first or end)}), flush=True)


def _send(address: str, port: int, nbytes: int) -> None:
    data = bytes(CHUNK)
    with socket.create_connection((address, port)) as conn:
        left = nbytes
        while left > 0:
            conn.sendall(data[:min(left, CHUNK)])
            left -= CHUNK


if __name__ == "__main__":
    mode, addr, port_text, amount = sys.argv[1:5]
    if mode == "serve":
        _serve(addr, int(port_text), int(amount))
    else:
        _send(addr, int(port_text), int(amount))
