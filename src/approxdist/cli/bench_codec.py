"""`approxdist bench codec`: encode/decode throughput of every wire format (seeds 000, 004).

    approxdist bench codec --size 16M --repeats 7 --json codec.json

Every repeat times, in turn, the baselines `copy_` (the memory-copy limit: one
`Tensor.copy_` out, one back) and `fp16-cast` (`Tensor.copy_` into an fp16 buffer and
back) and each codec's `encode` and `decode`; medians are reported. By default everything
writes into preallocated buffers (`encode(x, out=...)`, `decode(p, out=...)`: the steady
state of a link that reuses its buffers); `--alloc` makes baselines and codecs allocate
their results instead.
GB/s are of fp32 input (4 bytes per value). `break_even_gbit` is the link speed below
which sending the codec's bytes plus its round trip beats sending fp32:
L < 8 * (4n - wire_bytes) / t_roundtrip (no overlap of coding and transfer assumed).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, finish, render
from approxdist.bench.stats import median
from approxdist.bench.timing import interleave
from approxdist.comm.codecs import DEFAULT_SPECS, Codec, get_codec
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.errors import ConfigError

_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
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


def register(sub: Any) -> None:
    p = sub.add_parser("codec", help="codec throughput vs memory copy and the fp16 cast",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--size", default="16M",
                   help="values per tensor, K/M/G = 2^10/2^20/2^30 (default %(default)s)")
    p.add_argument("--codecs", default="all",
                   help="all or a comma list of codec specs (default all formats)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--alloc", action="store_true",
                   help="let baselines and codecs allocate their outputs each call")
    p.add_argument("--json", type=Path, help="write the rows to this JSON file")
    p.set_defaults(func=run)


def parse_size(text: str) -> int:
    """`16M` -> 16 * 2**20 values."""
    m = _SIZE.fullmatch(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"--size {text!r} is not a positive <number>[K|M|G]; e.g. 16M or 4096")
    return int(m.group(1)) * _SCALE[m.group(2).upper()]


def parse_codecs(text: str) -> list[Codec]:
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
    return _rows(x.numel(), times, {k: v[2] for k, v in ops.items()}, bits)


def _rows(n: int, times: dict[str, list[tuple[float, float]]], wire: dict[str, int],
          bits: dict[str, float]) -> list[Row]:
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


def run(args: argparse.Namespace) -> int:
    n = parse_size(args.size)
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats} must be >= 1; e.g. --repeats 7")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    codecs = parse_codecs(args.codecs)
    try:
        device = torch.device(args.device)
        x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--device {args.device!r} is not usable here ({exc}); "
                          f"e.g. --device cpu") from None
    with HostWatch() as host:
        rows = measure(x, codecs, args.repeats, args.alloc)
    mode = "allocating" if args.alloc else "preallocated buffers"
    print(f"codec throughput: {n} fp32 values on {device}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}, {mode}; baseline fp16-cast round trip")
    print(table(rows))
    finish(host, [asdict(r) for r in rows], args.json,
           f"approxdist bench codec --size {args.size} --codecs {args.codecs} "
           f"--repeats {args.repeats} --device {args.device}"
           + (f" --threads {args.threads}" if args.threads else "") + (" --alloc" if args.alloc else ""))
    return 0
