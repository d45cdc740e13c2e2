"""The cost model's link levels and codec costs against hand-computed values."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from approxdist.benchmarks.codec import rows as bench_codec_rows
from approxdist.comm.netem import LinkSpec
from approxdist.errors import ConfigError, DataError, SpecError
from approxdist.planner.cost import (
    CodecCost,
    LinkLevel,
    Network,
    codec_costs_from_bench,
    read_bench_codec,
)
from approxdist.planner.cost.codecs import DEFAULT_S_PER_BYTE

DATA = Path(__file__).parent.parent / "data" / "cost"
MIB = 1 << 20


def test_a_link_spec_gives_alpha_its_latency_and_beta_its_byte_time() -> None:
    level = LinkLevel.from_link("inter", "bw=1gbit,lat=100us")
    assert level.alpha_s == pytest.approx(1e-4) and level.beta_s_per_byte == pytest.approx(8e-9)
    assert level.gamma_s_per_byte == 0.0
    assert level.p2p_s(1_000_000) == pytest.approx(1e-4 + 8e-3)  # alpha + n beta
    assert level.bandwidth_bytes_per_s == pytest.approx(125e6)
    assert LinkLevel.from_link("intra", LinkSpec(20e9)).beta_s_per_byte == pytest.approx(4e-10)


def test_an_emulated_link_adds_to_the_machine_costs() -> None:
    machine = LinkLevel("loopback", 1e-4, 1e-9, 5e-10, cores=2)
    shaped = machine.with_link("bw=1gbit,lat=1ms")
    assert (shaped.alpha_s, shaped.beta_s_per_byte) == (1e-4, 1e-9)  # the machine's, as were
    assert shaped.link_alpha_s == pytest.approx(1e-3)
    assert shaped.link_beta_s_per_byte == pytest.approx(8e-9)
    assert shaped.bandwidth_bytes_per_s == pytest.approx(1 / 9e-9)
    assert (shaped.gamma_s_per_byte, shaped.cores, shaped.name) == (5e-10, 2, "loopback")
    assert machine.with_link(None) is machine
    # the load of shared cores stretches the machine's terms, not the link's wait
    assert shaped.p2p_s(MIB, ranks=4) == pytest.approx(2 * (1e-4 + MIB * 1e-9) + 1e-3
                                                       + MIB * 8e-9)


def test_loopback_slows_every_term_by_busy_ranks_over_cores() -> None:
    loop = LinkLevel("loopback", 1e-4, 1e-9, 0.0, cores=2)
    assert [loop.load(r) for r in (1, 2, 3, 4, 8)] == [1.0, 1.0, 1.5, 2.0, 4.0]
    assert loop.p2p_s(MIB, ranks=4) == pytest.approx(2 * (1e-4 + MIB * 1e-9))
    assert LinkLevel("intra", 1e-4, 1e-9).load(64) == 1.0


def test_the_network_picks_intra_inside_a_node_and_inter_across() -> None:
    intra, inter = LinkLevel("intra", 1e-6, 1e-11), LinkLevel("inter", 1e-4, 8e-9)
    net = Network(intra, inter, ranks_per_node=4)
    assert net.level([0, 3]) is intra and net.level([3, 4]) is inter
    assert net.level(range(8)) is inter and net.node(7) == 1
    assert net.busy(6) == 4 and net.busy(2) == 2
    one = Network(intra)
    assert one.level(range(64)) is intra and one.busy(64) == 64


@pytest.mark.parametrize("make, match", [
    (lambda: LinkLevel("wan", 0.0, 0.0), r"link level 'wan' is not one of intra, inter, loopback"),
    (lambda: LinkLevel("intra", -1e-6, 0.0), r"alpha_s = -1e-06 must be a finite number >= 0"),
    (lambda: LinkLevel("inter", 0.0, math.nan), r"beta_s_per_byte = nan must be"),
    (lambda: LinkLevel("loopback", 0.0, 0.0), r"give the shared cores for 'loopback'"),
    (lambda: LinkLevel("intra", 0.0, 0.0, cores=2), r"cores = 2: give the shared cores"),
    (lambda: LinkLevel("loopback", 0.0, 0.0, cores=0), r"loopback cores = 0 must be an integer"),
    (lambda: Network(LinkLevel("intra", 0, 0), LinkLevel("inter", 0, 0)),
     r"needs both inter and ranks_per_node"),
    (lambda: LinkLevel.from_link("inter", "none"), r"link 'none' names no link"),
])
def test_bad_levels_and_networks_are_refused_with_the_value(make: Callable[[], object],
                                                           match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make()


def test_wire_bytes_are_the_link_layers_exact_bytes() -> None:
    fp32, bf16 = CodecCost.of("fp32"), CodecCost.of("bf16")
    assert fp32.wire_bytes(1000) == 4000 and fp32.wire_ratio(1000) == 1.0  # raw: no header
    assert bf16.wire_bytes(1000) == 2 * 1000 + 16  # 16-byte codec header
    assert bf16.wire_ratio(1000) == pytest.approx(2016 / 4000)
    assert CodecCost.of("bits:s0e2+2m0").wire_bytes(1000) == 500 + 16
    assert bf16.wire_bytes(0) == 0
    assert (fp32.encode_s_per_byte, fp32.decode_s_per_byte) == (0.0, 0.0)
    assert bf16.encode_s_per_byte == bf16.decode_s_per_byte == DEFAULT_S_PER_BYTE
    assert CodecCost.of("bf16", 1e-10).decode_s_per_byte == DEFAULT_S_PER_BYTE


def test_break_even_bandwidth_by_hand() -> None:
    bf16 = CodecCost("bf16", 1e-10, 1e-10)
    # r = (2 * 2^20 + 16) / (4 * 2^20) = 0.5 + 4 / 2^20; B* = (1 - r) / (e + d)
    expected = (0.5 - 4 / MIB) / 2e-10
    assert bf16.break_even_bytes_per_s() == pytest.approx(expected)
    assert expected * 8 / 1e9 == pytest.approx(19.99985, rel=1e-6)  # ~20 Gbit/s
    assert CodecCost.of("fp32").break_even_bytes_per_s() == 0.0  # nothing saved: never pays
    assert CodecCost("bf16", 0.0, 0.0).break_even_bytes_per_s() == math.inf


def test_compressing_pays_below_the_break_even_and_not_above() -> None:
    bf16 = CodecCost("bf16", 1e-10, 1e-10)
    slow = LinkLevel.from_link("inter", "bw=1gbit")  # 125 MB/s << 2.5 GB/s
    fast = LinkLevel("intra", 0.0, 1e-11)  # 100 GB/s >> 2.5 GB/s
    assert bf16.pays_on(slow) and not bf16.pays_on(fast)
    # by hand at 1 Gbit/s: 8e-9 (2 MiB + 16) + 2e-10 * 4 MiB < 8e-9 * 4 MiB
    assert 8e-9 * (2 * MIB + 16) + 2e-10 * 4 * MIB < 8e-9 * 4 * MIB
    just_below = LinkLevel("intra", 0.0, 1.0 / (0.99 * bf16.break_even_bytes_per_s()))
    just_above = LinkLevel("intra", 0.0, 1.0 / (1.01 * bf16.break_even_bytes_per_s()))
    assert bf16.pays_on(just_below) and not bf16.pays_on(just_above)


def test_break_even_agrees_with_what_bench_codec_prints() -> None:
    n = MIB
    times = {"copy_": [(1e-3, 1e-3)], "fp16-cast": [(5e-4, 5e-4)],
             "bf16": [(4 * n * 3e-10, 4 * n * 1e-10)], "bits:s0e2+2m0": [(2e-3, 1e-3)]}
    wire = {"copy_": 4 * n, "fp16-cast": 2 * n, "bf16": CodecCost.of("bf16").wire_bytes(n),
            "bits:s0e2+2m0": CodecCost.of("bits:s0e2+2m0").wire_bytes(n)}
    bits = {"copy_": 32.0, "fp16-cast": 16.0, "bf16": 16.0, "bits:s0e2+2m0": 4.0}
    rows = [vars(r) for r in bench_codec_rows(n, times, wire, bits)]
    costs = codec_costs_from_bench(rows)
    assert sorted(costs) == ["bf16", "bits:s0e2+2m0"]  # the baselines are not codecs
    assert costs["bf16"].encode_s_per_byte == pytest.approx(3e-10)
    assert costs["bf16"].decode_s_per_byte == pytest.approx(1e-10)
    for row in rows[2:]:
        ours = costs[row["codec"]].break_even_bytes_per_s(n) * 8 / 1e9
        assert ours == pytest.approx(row["break_even_gbit"])


def test_a_real_bench_codec_file_reads() -> None:
    costs = read_bench_codec(DATA / "bench-codec-tiny.json")
    assert sorted(costs) == ["bf16", "bits:s0e2+2m0", "fp32", "fp8-e5m2", "table4"]
    assert costs["fp32"] == CodecCost.of("fp32")  # raw on our links: measured coding unpaid
    assert costs["table4"].encode_s_per_byte == pytest.approx(1e-9 / 1.2799, rel=1e-3)


def test_bad_codec_rows_and_files_say_what_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"rows\[0\] \('bf16'\) encode_gbps, decode_gbps = 0, "
                                        r"1.0 must be GB/s > 0"):
        codec_costs_from_bench([{"codec": "bf16", "encode_gbps": 0, "decode_gbps": 1.0}])
    with pytest.raises(DataError, match=r"is not a bench codec row \(no 'codec'\)"):
        codec_costs_from_bench([{"algorithm": "ring"}])
    with pytest.raises(DataError, match=r"rows\[0\]: .*bits:q9"):
        codec_costs_from_bench([{"codec": "bits:q9", "encode_gbps": 1.0, "decode_gbps": 1.0}])
    with pytest.raises(DataError, match=r"does not exist; write it with approxdist bench codec"):
        read_bench_codec(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match=r"is not JSON"):
        read_bench_codec(tmp_path / "bad.json")
    (tmp_path / "obj.json").write_text('{"codec": "bf16"}')
    with pytest.raises(DataError, match=r"holds a JSON dict, not the list of rows"):
        read_bench_codec(tmp_path / "obj.json")


def test_bad_codec_costs_are_refused() -> None:
    with pytest.raises(SpecError):
        CodecCost.of("bits:q9")
    with pytest.raises(ConfigError, match=r"'bf16' encode_s_per_byte = -1.0 must be"):
        CodecCost("bf16", -1.0, 0.0)
    with pytest.raises(ConfigError, match=r"'fp32' travels raw .* use CodecCost.of\('fp32'\)"):
        CodecCost("fp32", 1e-10, 0.0)
