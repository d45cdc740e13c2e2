"""`approxdist inspect exponents FILE`: the exponent histogram of saved tensors (seed 000 Fig. 5).

    approxdist inspect exponents activations.pt --json exponents.json

FILE holds a tensor saved with `torch.save`, or a dict / list / tuple of tensors (loaded
with `weights_only=True`); all floating-point values together are analysed. Prints the
share of exact zeros, the histogram of the 8-bit exponent field, the best exponent-only
`bits:s0e...m0` scheme of each width with the share of values whose exponent it keeps
exactly, and a suggested `bits:` and `bits:auto<K>` codec.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from approxdist.cli.groups import command, command_group
from approxdist.comm.exponents import TARGET_COVERAGE, ExponentReport, exponent_report
from approxdist.errors import DataError
from approxdist.train.snapshot import tensors_in


def register(sub: Any) -> None:
    kinds = command_group(sub, "inspect", "look inside saved tensors",
                          "Analyses of saved tensors.", metavar="WHAT")
    e = command(kinds, "exponents", help="8-bit exponent histogram and a bit-scheme suggestion", doc=__doc__)
    e.add_argument("file", type=Path, help="file written by torch.save")
    e.add_argument("--json", type=Path, help="write the report to this JSON file")
    e.set_defaults(func=run)


def load_values(path: Path) -> tuple[torch.Tensor, int]:
    """All floating values in `path` as one flat fp32 tensor, and how many tensors held them."""
    if not path.is_file():
        raise DataError(f"tensor file {str(path)!r} not found; pass a file written by torch.save")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise DataError(f"cannot load {str(path)!r} with torch.load(weights_only=True): "
                        f"{str(exc).splitlines()[0]}; save plain tensors, dicts or lists") from None
    tensors = [t for t in tensors_in(obj) if t.is_floating_point()]
    if not tensors:
        raise DataError(f"{str(path)!r} holds no floating-point tensor; save e.g. "
                        f"torch.save(activations, {str(path)!r})")
    return torch.cat([t.detach().reshape(-1).float() for t in tensors]), len(tensors)


def render(report: ExponentReport, source: str) -> str:
    """Seed 000 Figure 5 as text."""
    lines = [f"exponent field of {report.total:,} values from {source}",
             f"exact zeros: {100 * report.zero_fraction:.3f} %", "",
             f"{'exponent':>8}  {'binary':>8}  {'range':<16}{'count':>12}{'share':>10}"]
    total = max(report.total, 1)
    for exp, count in enumerate(report.histogram):
        if count:
            share = count / total
            bar = "#" * max(1, round(40 * share))
            lines.append(f"{exp:>8}  {exp:08b}  {_range(exp):<16}{count:>12,}"
                         f"{100 * share:>9.3f}%  {bar}")
    lines += ["", "exponents kept exactly (unsent bits 0), best scheme per width:"]
    for width in range(1, 9):
        spec, cover = _best_of_width(report, width)
        lines.append(f"  {width} bit(s)  {spec:<16} {100 * cover:9.4f} %")
    lines += ["", "bits:auto<K> (sign and exponent bits chosen from the data):"]
    lines += [f"  bits:auto{k:<6} {100 * c:9.4f} % exact" for k, c in report.auto_coverage.items()]
    lines += ["", f"suggested (>= {100 * TARGET_COVERAGE:g} % kept): {report.suggest_bits()} "
                  f"or {report.suggest_auto()}"]
    return "\n".join(lines)


def _range(exp: int) -> str:
    if exp == 0:
        return "0 / subnormal"
    if exp == 255:
        return "inf / nan"
    return f"[2^{exp - 127}, 2^{exp - 126})"


def _best_of_width(report: ExponentReport, width: int) -> tuple[str, float]:
    items = [(c, s) for s, c in report.coverage.items()
             if sum(int(p) for p in s.split("e")[1].split("m")[0].split("+")) == width]
    cover, spec = max(items)
    return spec, cover


def run(args: argparse.Namespace) -> int:
    values, count = load_values(args.file)
    report = exponent_report(values)
    print(render(report, f"{args.file} ({count} tensor{'s' if count != 1 else ''})"))
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        print(f"report written to {args.json}")
    return 0
