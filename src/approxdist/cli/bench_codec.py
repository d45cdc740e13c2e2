"""`approxdist bench codec`: encode/decode throughput of every wire format (seeds 000, 004).

    approxdist bench codec --size 16M --repeats 7 --json codec.json

Every repeat times, in turn, the baselines `copy_` (the memory-copy limit: one
`Tensor.copy_` out, one back) and `fp16-cast` (`Tensor.copy_` into an fp16 buffer and
back) and each codec's `encode` and `decode`; medians are reported. By default everything
writes into preallocated buffers; `--alloc` makes baselines and codecs allocate their
results instead (method and columns: `approxdist.benchmarks.codec`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import asdict
from typing import Any

import torch

from approxdist.bench.host import HostWatch
from approxdist.bench.report import add_json_flag, finish
from approxdist.benchmarks.codec import measure, parse_codecs, table
from approxdist.cli.groups import command
from approxdist.errors import ConfigError
from approxdist.kernels import kernel_status

_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def register(sub: Any) -> None:
    p = command(sub, "codec", help="codec throughput vs memory copy and the fp16 cast", doc=__doc__)
    p.add_argument("--size", default="16M",
                   help="values per tensor, K/M/G = 2^10/2^20/2^30 (default %(default)s)")
    p.add_argument("--codecs", default="all",
                   help="all, compressors, or a comma list of codec and compressor specs "
                        "(default all: every codec and compressor)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--alloc", action="store_true",
                   help="let baselines and codecs allocate their outputs each call")
    add_json_flag(p)
    p.set_defaults(func=run)


def parse_size(text: str) -> int:
    """`16M` -> 16 * 2**20 values."""
    m = _SIZE.fullmatch(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"--size {text!r} is not a positive <number>[K|M|G]; e.g. 16M or 4096")
    return int(m.group(1)) * _SCALE[m.group(2).upper()]


def run(args: argparse.Namespace) -> int:
    n = parse_size(args.size)
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats} must be >= 1; e.g. --repeats 7")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    codecs = parse_codecs(args.codecs, n)
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
    kernels = kernel_status()
    print(f"C kernels (bits:, table<N>, bit-packed compressors, top-k on CPU): "
          f"{'on, ' + str(torch.get_num_threads()) + ' threads' if kernels.available else 'off'}"
          f" ({kernels.detail})")
    print(table(rows))
    finish(host, [asdict(r) for r in rows], args.json,
           f"approxdist bench codec --size {args.size} --codecs {args.codecs} "
           f"--repeats {args.repeats} --device {args.device}"
           + (f" --threads {args.threads}" if args.threads else "") + (" --alloc" if args.alloc else ""))
    return 0
