"""Network emulation: a `bw=<rate>[,lat=<time>]` link model and sender-side shaping (seed 000).

Seed 000 studies pipeline transfers over slow links; seed 001's all-reduce costs are
`alpha + M * beta` per message. This module turns a link spec (docs/collectives.md) into that
model and enforces it on real sends:

* `parse_link("bw=100mbit,lat=1ms")` -> `LinkSpec(bandwidth_bps=1e8, latency_s=1e-3)`.
  Rates: `bit`, `kbit`, `mbit`, `gbit` (bits per second, decimal like Linux tc; any
  case) or `B`, `kB`, `MB`, `GB`, also written `kB/s` ... (bytes per second, decimal;
  case-sensitive so that `MB` is never read as megabits).
  Times: `us`, `ms`, `s`. `lat` defaults to 0. `none` / empty means no emulation.
* `LinkClock` is the pure timing math of one directed link: a "busy until" clock.
  A message of B bytes posted at `now` starts at `max(now, busy_until)`, occupies the
  link for `8 B / bw` seconds and is delivered `lat` later. Messages on one link are
  serialised (FIFO), so concurrent transfers share the bandwidth and throughput never
  exceeds it; latency overlaps with the next message's transmission.
  16 MiB at `bw=100mbit`: 8 * 16 * 2**20 / 1e8 = 1.342 s.
* `Shaper` does the sleeping: it holds each send until the clock releases it, on one
  background thread per rank, so the caller never blocks and links to different
  peers run in parallel.
"""

from __future__ import annotations

import heapq
import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from approxdist.errors import SpecError

LINK_FORMS = "none | bw=<rate>[,lat=<time>] (e.g. bw=100mbit,lat=1ms; bw=20gbit)"

_RATE_UNITS = {
    "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
    "B": 8.0, "kB": 8e3, "MB": 8e6, "GB": 8e9,
}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_QUANTITY = re.compile(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)")


@dataclass(frozen=True)
class LinkSpec:
    """One directed link: bandwidth in bits per second and one-way latency in seconds."""

    bandwidth_bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0:
            raise SpecError(f"link bandwidth {self.bandwidth_bps} bit/s must be > 0; "
                            f"e.g. bw=100mbit")
        if not self.latency_s >= 0:
            raise SpecError(f"link latency {self.latency_s} s must be >= 0; e.g. lat=1ms")

    def transfer_s(self, nbytes: int) -> float:
        """Time one message of `nbytes` takes on an idle link (transmission + latency)."""
        return self.serialize_s(nbytes) + self.latency_s

    def serialize_s(self, nbytes: int) -> float:
        """Time the link is busy transmitting `nbytes`."""
        return 8.0 * nbytes / self.bandwidth_bps

    @property
    def spec(self) -> str:
        """The canonical spec string (bits per second, microseconds)."""
        text = f"bw={_fmt_rate(self.bandwidth_bps)}"
        return text + (f",lat={self.latency_s * 1e6:g}us" if self.latency_s else "")


def _fmt_rate(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def _quantity(text: str, units: dict[str, float], what: str, example: str) -> float:
    match = _QUANTITY.fullmatch(text.strip())
    if not match:
        raise SpecError(f"{what} {text!r} is not <number><unit>; e.g. {example}")
    unit = match.group(2).removesuffix("/s")
    unit = unit.lower() if unit.lower().endswith("bit") or unit.lower() in _TIME_UNITS else unit
    if unit not in units:
        raise SpecError(f"unknown {what} unit {unit!r} in {text!r}; valid: "
                        f"{', '.join(units)}")
    return float(match.group(1)) * units[unit]


def parse_link(spec: str | None) -> LinkSpec | None:
    """The `LinkSpec` for `spec`; None, "" or "none" means no emulation (returns None)."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return None
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("bw", "lat"):
            raise SpecError(f"bad field {part.strip()!r} in link spec {spec!r}; valid: "
                            f"{LINK_FORMS}")
        if key in fields:
            raise SpecError(f"field {key!r} given twice in link spec {spec!r}")
        fields[key] = value
    if "bw" not in fields:
        raise SpecError(f"link spec {spec!r} has no bandwidth; valid: {LINK_FORMS}")
    bw = _quantity(fields["bw"], _RATE_UNITS, "bandwidth", "bw=100mbit")
    lat = _quantity(fields["lat"], _TIME_UNITS, "latency", "lat=1ms") if "lat" in fields else 0.0
    return LinkSpec(bw, lat)


class LinkClock:
    """Pure timing of one directed link: when does a message posted at `now` arrive?"""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.busy_until = float("-inf")

    def reserve(self, now: float, nbytes: int) -> float:
        """Book the link for `nbytes` posted at `now`; return the delivery time."""
        start = max(now, self.busy_until)
        self.busy_until = start + self.spec.serialize_s(nbytes)
        return self.busy_until + self.spec.latency_s

    def reserve_chain(self, now: float, nbytes: int, hops: int) -> float:
        """Book `hops` dependent messages of `nbytes` (each sent when the previous one has
        arrived, as in a ring); return the last one's delivery time."""
        start = max(now, self.busy_until)
        done = start + hops * self.spec.transfer_s(nbytes)
        self.busy_until = done - self.spec.latency_s
        return done


@dataclass(order=True)
class _Held:
    release: float
    seq: int
    post: Callable[[], None]


class Shaper:
    """Holds sends until their link clock releases them, then calls `post` on a worker thread.

    One clock per destination peer (the directed link rank -> peer). Sends to one peer
    are released in the order they were submitted. `clock` is injectable for tests.
    """

    def __init__(self, spec: LinkSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._now = clock
        self._links: dict[int, LinkClock] = {}
        self._heap: list[_Held] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def release_time(self, peer: int, nbytes: int) -> float:
        """Reserve the link to `peer` for `nbytes` now; the time the message may leave."""
        link = self._links.setdefault(peer, LinkClock(self.spec))
        return link.reserve(self._now(), nbytes)

    def book_chain(self, peer: int, nbytes: int, hops: int, since: float | None = None) -> float:
        """Book the link to `peer` for `hops` dependent messages of `nbytes` posted at
        `since` (default now): a backend collective that cannot be shaped message by
        message. Returns the time the last one arrives."""
        with self._cv:
            link = self._links.setdefault(peer, LinkClock(self.spec))
            return link.reserve_chain(self._now() if since is None else since, nbytes, hops)

    def submit(self, peer: int, nbytes: int, post: Callable[[], None]) -> float:
        """Schedule `post()` for when `nbytes` to `peer` have crossed the emulated link."""
        with self._cv:
            release = self.release_time(peer, nbytes)
            head = self._heap[0].release if self._heap else None
            heapq.heappush(self._heap, _Held(release, next(self._seq), post))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="approxdist-netem",
                                                daemon=True)
                self._thread.start()
            if head is None or release < head:
                # the worker sleeps until the earliest release; wake it only if this one is
                # earlier (each needless wake-up is a context switch on a busy machine)
                self._cv.notify()
        return release

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._closed:
                    self._cv.wait()
                if not self._heap:
                    return
                wait = self._heap[0].release - self._now()
                if wait > 0:
                    self._cv.wait(timeout=wait)
                    continue
                held = heapq.heappop(self._heap)
            held.post()

    def close(self) -> None:
        """Post what is still held (at its time) and stop the worker thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
