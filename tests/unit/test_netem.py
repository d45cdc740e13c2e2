"""Link spec parsing and the pure timing math of emulated links (docs/links.md)."""

from __future__ import annotations

import threading

import pytest

from approxdist.comm.netem import LinkClock, LinkSpec, Shaper, parse_link
from approxdist.errors import SpecError

MIB = 1 << 20


@pytest.mark.parametrize(("spec", "bps", "lat"), [
    ("bw=100mbit", 1e8, 0.0),
    ("bw=100mbit,lat=1ms", 1e8, 1e-3),
    ("bw=20gbit", 2e10, 0.0),
    ("bw=1Gbit,lat=250us", 1e9, 250e-6),
    ("lat=2s,bw=512kbit", 512e3, 2.0),
    ("bw=10MB", 8e7, 0.0),
    ("bw=1.5GB/s", 1.2e10, 0.0),
    ("bw=3e6bit", 3e6, 0.0),
])
def test_parse_units(spec: str, bps: float, lat: float) -> None:
    link = parse_link(spec)
    assert link is not None
    assert link.bandwidth_bps == pytest.approx(bps)
    assert link.latency_s == pytest.approx(lat)


@pytest.mark.parametrize("spec", [None, "", "none", " NONE "])
def test_no_emulation(spec: str | None) -> None:
    assert parse_link(spec) is None


@pytest.mark.parametrize(("spec", "fragment"), [
    ("bw=100", "not <number><unit>"),
    ("bw=100mbps", "unknown bandwidth unit 'mbps'"),
    ("bw=100mb", "unknown bandwidth unit 'mb'"),  # megabytes are MB, megabits mbit
    ("lat=1ms", "no bandwidth"),
    ("bw=1gbit,lat=3min", "unknown latency unit"),
    ("bw=1gbit,loss=1%", "bad field 'loss=1%'"),
    ("bw=1gbit,bw=2gbit", "given twice"),
    ("bw=0gbit", "must be > 0"),
    ("100mbit", "bad field"),
])
def test_bad_specs_say_what_is_wrong(spec: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment.replace("(", r"\(")):
        parse_link(spec)


def test_spec_round_trips() -> None:
    link = parse_link("bw=100mbit,lat=1ms")
    assert link is not None and parse_link(link.spec) == link


def test_16_mib_at_100mbit_takes_1_34_s() -> None:
    """The issue's figure: 16 MB fp32 at bw=100mbit must take 1.34 s within 10 %."""
    clock = LinkClock(LinkSpec(1e8))
    assert clock.reserve(0.0, 16 * MIB) == pytest.approx(1.342, rel=0.01)


def test_messages_on_one_link_share_it_and_pay_latency_once_each() -> None:
    clock = LinkClock(LinkSpec(8e6, latency_s=0.01))  # 1 MB/s, 10 ms
    first = clock.reserve(0.0, 1_000_000)   # busy 0..1 s, delivered at 1.01
    second = clock.reserve(0.5, 500_000)    # queued behind: busy 1..1.5, delivered 1.51
    assert first == pytest.approx(1.01)
    assert second == pytest.approx(1.51)
    # throughput never exceeds the bandwidth: 1.5 MB took 1.5 s of link time
    assert clock.busy_until == pytest.approx(1.5)


def test_idle_link_starts_at_post_time() -> None:
    clock = LinkClock(LinkSpec(8e6))
    clock.reserve(0.0, 1000)
    assert clock.reserve(10.0, 1000) == pytest.approx(10.001)


class _FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_shaper_releases_per_peer_in_order_and_links_are_independent() -> None:
    fake = _FakeTime()
    shaper = Shaper(LinkSpec(8e6, latency_s=0.5), clock=fake)
    posted: list[str] = []
    done = threading.Event()

    def post(name: str):
        def run() -> None:
            posted.append(name)
            if len(posted) == 3:
                done.set()
        return run

    a1 = shaper.submit(1, 1_000_000, post("a1"))
    a2 = shaper.submit(1, 1_000_000, post("a2"))
    b1 = shaper.submit(2, 1_000_000, post("b1"))
    assert (a1, a2, b1) == pytest.approx((101.5, 102.5, 101.5))
    fake.now = 1000.0  # every release time has passed: all are posted
    shaper.close()
    assert done.is_set()
    assert posted.index("a1") < posted.index("a2")


def test_links_of_one_rank_can_share_one_wire() -> None:
    """Comm-thread streams pass the first link's shaper; only its owner stops it."""
    from approxdist.comm.link import Link
    from approxdist.errors import CommError
    from approxdist.launch.context import DistContext

    ctx = DistContext()
    owner = Link(ctx, "bw=1gbit")
    other = Link(ctx, "bw=1gbit", shaper=owner.shaper)
    assert other.shaper is owner.shaper and owner.shaper is not None
    with pytest.raises(CommError, match="shared emulated wire must have this link's spec"):
        Link(ctx, "bw=100mbit", shaper=owner.shaper)
    with pytest.raises(CommError, match="none"):
        Link(ctx, None, shaper=owner.shaper)
    done: list[int] = []
    other.close()  # not the owner: the wire keeps working
    owner.shaper.submit(1, 10, lambda: done.append(1))
    owner.close()  # posts what it holds, then stops
    assert done == [1]
    assert Link(ctx).shaper is None


def test_a_backend_ring_books_its_hops_on_the_shared_wire() -> None:
    """`native` all-reduces (gloo's ring) book the rank's wire like shaped messages: two
    calls at once queue, and a message posted meanwhile waits behind them."""
    clock = LinkClock(LinkSpec(8e6, latency_s=0.01))  # 1 MB/s, 10 ms
    first = clock.reserve_chain(0.0, 100_000, hops=2)  # 2 x (0.1 s + 10 ms)
    assert first == pytest.approx(0.22)
    second = clock.reserve_chain(0.0, 100_000, hops=2)  # starts when the wire is free
    assert second == pytest.approx(0.21 + 0.22)
    assert clock.reserve(0.05, 1_000) == pytest.approx(0.42 + 0.001 + 0.01)
    shaper = Shaper(LinkSpec(8e6), clock=lambda: 5.0)
    assert shaper.book_chain(1, 1_000_000, hops=1, since=1.0) == pytest.approx(2.0)
    assert shaper.book_chain(1, 1_000_000, hops=1) == pytest.approx(6.0)  # now = 5.0
    assert shaper.book_chain(2, 1_000_000, hops=1, since=1.0) == pytest.approx(2.0)  # own link
    shaper.close()


def test_links_sharing_a_wire_book_native_calls_on_it() -> None:
    """Two comm threads' links share one wire: their native calls queue on it."""
    from approxdist.comm.link import Link
    from approxdist.launch.context import DistContext

    ctx = DistContext(rank=0, world_size=2)  # a world of two; no process group is needed
    assert Link(ctx).book_chain(1, 1000, 2, since=0.0) is None  # no emulation
    owner = Link(ctx, "bw=8mbit")  # 1 MB/s
    other = Link(ctx, "bw=8mbit", shaper=owner.shaper)
    first = owner.book_chain(1, 500_000, 1, since=0.0)
    second = other.book_chain(1, 500_000, 1, since=0.0)
    assert first == pytest.approx(0.5) and second == pytest.approx(1.0)
    other.close()
    owner.close()
