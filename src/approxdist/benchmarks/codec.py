"""Codec throughput: encode/decode of every wire format against memory copy and the fp16 cast.

Every repeat times, in turn, the baselines `copy_` (the memory-copy limit: one
`Tensor.copy_` out, one back) and `fp16-cast` (`Tensor.copy_` into an fp16 buffer and
back) and each codec's `encode` and `decode`; medians are reported. By default everything
writes into preallocated buffers (`encode(x, out=...)`, `decode(p, out=...)`: the steady
state of a link that reuses its buffers); `alloc=True` makes baselines and codecs allocate
their results instead.
Compressors (docs/compressors.md) are timed as one worker's exchange in a world of one on
the values viewed as a near-square matrix: `encode` up to the first message, `decode` the
rest (for PowerSGD its second round too), the result written into a preallocated tensor
(as the data-parallel engine has it written into its bucket) or, with `alloc=True`, a new
one; their messages are new tensors either way, and their wire bytes are the messages'.
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
from approxdist.comm.compressors import (
    COMPRESSORS,
    DEFAULT_COMPRESSORS,
    Compressor,
    Where,
    get_compressor,
    is_compressor,
)
from approxdist.comm.compressors.base import finish_alone, start_alone
from approxdist.errors import SpecError
from approxdist.text import name_list

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


Format = Codec | Compressor


def parse_codecs(text: str, numel: int) -> list[Format]:
    """A comma list of codec and compressor specs and the words `all` (every default codec
    and compressor) and `compressors` -> codecs and compressors for `numel` values."""
    words = {"all": DEFAULT_SPECS + DEFAULT_COMPRESSORS, "compressors": DEFAULT_COMPRESSORS}
    specs = [w for item in name_list(text) for w in words.get(item, (item,))]
    shape = bench_shape(numel)
    return [get_compressor(s, Where(shape)) if is_compressor(s) else _codec(s) for s in specs]


def _codec(spec: str) -> Codec:
    try:
        return get_codec(spec)
    except SpecError as err:
        forms = " | ".join(COMPRESSORS.get(n).form for n in COMPRESSORS)
        raise SpecError(f"{err}; or a compressor: {forms}") from None


def bench_shape(numel: int) -> tuple[int, int]:
    """The most nearly square (rows, cols) with rows * cols = numel (PowerSGD needs a matrix)."""
    rows = max(r for r in range(1, int(numel**0.5) + 1) if numel % r == 0)
    return rows, numel // rows


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


def _ops_compressor(comp: Compressor, x: torch.Tensor, alloc: bool) -> tuple[Op, Op, int]:
    grad = x.view(comp.shape)
    out = None if alloc else torch.empty_like(x)
    state = {"started": start_alone(comp, grad, out)}
    return (lambda: state.update(started=start_alone(comp, grad, out)),
            lambda: finish_alone(*state["started"]), comp.wire_bytes())


def _ops(fmt: Format, x: torch.Tensor, alloc: bool) -> tuple[Op, Op, int]:
    if isinstance(fmt, Compressor):
        return _ops_compressor(fmt, x, alloc)
    return _ops_codec(fmt, x, alloc)


def _bits(fmt: Format) -> float:
    return 8 * fmt.bytes_per_value() if isinstance(fmt, Compressor) else fmt.bits_per_value


def measure(x: torch.Tensor, codecs: list[Format], repeats: int, alloc: bool) -> list[Row]:
    """Interleave every baseline and codec `repeats` times (after one warm-up round);
    rows of medians."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else None
    ops = _ops_baselines(x, alloc)
    ops.update({c.spec: _ops(c, x, alloc) for c in codecs})
    calls = {f"{name} {half}": op for name, (enc, dec, _) in ops.items()
             for half, op in (("enc", enc), ("dec", dec))}
    t = interleave(calls, repeats, warmup=1, sync=sync)
    times = {name: list(zip(t[f"{name} enc"], t[f"{name} dec"])) for name in ops}
    bits = {c.spec: _bits(c) for c in codecs} | {"copy_": 32.0, "fp16-cast": 16.0}
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


