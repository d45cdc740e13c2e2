"""Codec throughput: encode/decode of every wire format against memory copy and the fp16 cast.

Every repeat times, in turn, the baselines `copy_` (the memory-copy limit: one
`Tensor.copy_` out, one back) and `fp16-cast` (`Tensor.copy_` into an fp16 buffer and
back) and each codec's `encode` and `decode`; medians are reported. By default everything
writes into preallocated buffers (`encode(x, out=...)`, `decode(p, out=...)`: the steady
state of a link that reuses its buffers); `alloc=True` makes baselines and codecs allocate
their results instead.
GB/s are of fp32 input (4 bytes per value). `break_even_gbit` is the link speed below
which sending the codec's bytes plus its round trip beats sending fp32:
L < 8 * (4n - wire_bytes) / t_roundtrip (no overlap of coding and transfer assumed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from approxdist.bench.report import Column, render
from approxdist.bench.stats import median
from approxdist.bench.timing import interleave
from approxdist.comm.codecs import DEFAULT_SPECS, Codec, get_codec
from approxdist.comm.codecs.framed import FramedCodec

Op = Callable[[], object]


@dataclass
class Row:
    """One line of the table / one JSON object (key names are part of the interface)."""

    codec: str
    encode_gbps: float
    decode_gbps: float
    roundtrip_gbps: float
    bits_per_value: float
    ratio_vs_fp16_roundtrip: float
    break_even_gbit: float


def parse_codecs(text: str) -> list[Codec]:
    """`all` (every default format) or a comma list of codec specs -> codecs."""
    specs = DEFAULT_SPECS if text.strip() == "all" else [s for s in text.split(",") if s.strip()]
    return [get_codec(s) for s in specs]


def _ops_baselines(x: torch.Tensor, alloc: bool) -> dict[str, tuple[Op, Op, int]]:
    """name -> (encode, decode, wire bytes) of the baselines."""
    y, z = torch.empty_like(x), torch.empty_like(x)
    h = torch.empty_like(x, dtype=torch.float16)
    if alloc:
        state = {"h": x.half(), "y": x.clone()}
        return {"copy_": (lambda: state.update(y=x.clone()), lambda: state["y"].clone(),
                          4 * x.numel()),
                "fp16-cast": (lambda: state.update(h=x.half()), lambda: state["h"].float(),
                              2 * x.numel())}
    return {"copy_": (lambda: y.copy_(x), lambda: z.copy_(y), 4 * x.numel()),
            "fp16-cast": (lambda: h.copy_(x), lambda: y.copy_(h), 2 * x.numel())}


def _ops_codec(codec: Codec, x: torch.Tensor, alloc: bool) -> tuple[Op, Op, int]:
    n = x.numel()
    if alloc or not isinstance(codec, FramedCodec):
        state = {"p": codec.encode(x)}
        return (lambda: state.update(p=codec.encode(x)), lambda: codec.decode(state["p"]),
                codec.payload_nbytes(n))
    buf = torch.empty(codec.payload_nbytes(n), dtype=torch.uint8, device=x.device)
    y = torch.empty_like(x)
    payload = codec.encode(x, out=buf)
    return (lambda: codec.encode(x, out=buf), lambda: codec.decode(payload, out=y),
            codec.payload_nbytes(n))


def measure(x: torch.Tensor, codecs: list[Codec], repeats: int, alloc: bool) -> list[Row]:
    """Interleave every baseline and codec `repeats` times (after one warm-up round);
    rows of medians."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else None
    ops = _ops_baselines(x, alloc)
    ops.update({c.spec: _ops_codec(c, x, alloc) for c in codecs})
    calls = {f"{name} {half}": op for name, (enc, dec, _) in ops.items()
             for half, op in (("enc", enc), ("dec", dec))}
    t = interleave(calls, repeats, warmup=1, sync=sync)
    times = {name: list(zip(t[f"{name} enc"], t[f"{name} dec"])) for name in ops}
    bits = {c.spec: c.bits_per_value for c in codecs} | {"copy_": 32.0, "fp16-cast": 16.0}
    return rows(x.numel(), times, {k: v[2] for k, v in ops.items()}, bits)


def rows(n: int, times: dict[str, list[tuple[float, float]]], wire: dict[str, int],
         bits: dict[str, float]) -> list[Row]:
    """One row per name from its (encode, decode) seconds per repeat, wire bytes and bits."""
    gb = 4 * n / 1e9
    med = {k: (median([e for e, _ in v]), median([d for _, d in v]), median([e + d for e, d in v]))
           for k, v in times.items()}
    fp16_rt = gb / med["fp16-cast"][2]
    rows = []
    for name, (enc, dec, rt) in med.items():
        saved_bits = 8 * (4 * n - wire[name])
        rows.append(Row(name, _gbps(gb, enc), _gbps(gb, dec), _gbps(gb, rt), bits[name],
                        _gbps(gb, rt) / fp16_rt, max(saved_bits, 0) / rt / 1e9))
    return rows


def _gbps(gb: float, seconds: float) -> float:
    return gb / seconds if seconds > 0 else float("inf")


COLUMNS = (Column("codec", 16, "codec", left=True), Column("bits", 6, "bits_per_value", "g"),
           Column("enc GB/s", 10, "encode_gbps", ".2f"), Column("dec GB/s", 10, "decode_gbps", ".2f"),
           Column("rt GB/s", 9, "roundtrip_gbps", ".2f"),
           Column("x fp16 rt", 11, "ratio_vs_fp16_roundtrip", ".3f"),
           Column("break-even Gbit/s", 19, "break_even_gbit", ".2f"))


def table(rows: list[Row]) -> str:
    return render(COLUMNS, [asdict(r) for r in rows], sep="", rule=True)


