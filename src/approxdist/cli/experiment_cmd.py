"""`approxdist experiment NAME`: run a preset that reproduces a seed study, write CSVs, plots, report.

    approxdist experiment list
    approxdist experiment seed000-bits --quick --out exp/bits
    approxdist experiment seed000-bits --out exp/bits --data-dir ~/data/cifar-10-batches-py --seeds 3
    approxdist experiment all --quick --out exp          # every preset into exp/<name>/
    approxdist experiment seed001-allreduce --quick --link bw=100mbit --link-shaper kernel --out exp/ar-tc

Presets and their run times: docs/experiments.md. `approxdist report DIR` regenerates
the plots and report.md of a finished experiment from its CSVs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from approxdist.cli.groups import command
from approxdist.errors import ConfigError
from approxdist.experiments import Settings, get_preset, preset_names, run_experiment
from approxdist.experiments.base import expected_s
from approxdist.experiments.catalog import listing
from approxdist.experiments.runner import mismatch
from approxdist.experiments.studies import get_study

ALL = "all"


def register(sub: Any) -> None:
    p = command(sub, "experiment", help="run a preset reproducing a seed study (CSV, PNG, report)",
                doc=__doc__)
    p.add_argument("name", metavar="NAME", help="a preset, 'all', or 'list' to show the presets")
    p.add_argument("--out", type=Path, help="output directory (required unless NAME is list)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="CI-size runs (one seed, few epochs); `experiment list` gives each "
                           "preset's expected time on 2 cores, and their sum")
    size.add_argument("--smoke", action="store_true",
                      help="tiny runs on the digits that only check the machinery (tests)")
    p.add_argument("--data-dir", default="",
                   help="CIFAR-10 directory: the accuracy presets then train the seed's ResNet "
                        "on CIFAR-10 instead of MNIST-1D")
    p.add_argument("--seeds", type=int, default=0,
                   help="training seeds per configuration (default 3; 1 with --quick)")
    p.add_argument("--link", default="",
                   help="presets that measure over one link (seed001-allreduce): its spec, "
                        "e.g. bw=100mbit (default: none, loopback)")
    p.add_argument("--link-shaper", default="inproc", choices=["inproc", "kernel"],
                   help="presets that vary the link rate or take --link: shape it with our "
                        "in-process emulator (default) or with tc on namespaced hosts (root)")
    p.set_defaults(func=run)


def list_presets() -> str:
    """One entry per preset with its study and expected times, then the sum per size."""
    lines, totals = [], {"quick": 0.0, "full": 0.0}
    for name in preset_names():  # from the catalog: no preset module is imported
        entry = listing(name)
        times = ", ".join(f"{k} {v}" for k, v in entry.run_time.items())
        lines.append(f"{name:<20} {entry.summary}\n{'':<20} ({get_study(entry.study).number}, "
                     f"{entry.reproduces}; {times})")
        for size in totals:
            totals[size] += expected_s(entry.run_time[size])
    lines.append(f"{'all':<20} quick ~{totals['quick'] / 60:.0f} min, full ~"
                 f"{totals['full'] / 60:.0f} min (the sums of the estimates above, on 2 cores)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        print(list_presets())
        return 0
    names = preset_names() if args.name == ALL else [get_preset(args.name).name]
    if args.out is None:
        raise ConfigError(f"experiment {args.name!r} needs --out DIR, the directory for its CSVs, "
                          f"plots and report.md")
    size = "quick" if args.quick else "smoke" if args.smoke else "full"
    start = time.perf_counter()
    for name in names:
        preset = get_preset(name)
        out = args.out / name if args.name == ALL else args.out
        settings = Settings(out=out, size=size, data_dir=args.data_dir, seeds=args.seeds,
                            link_shaper=args.link_shaper, link=args.link)
        why_not = (preset.unavailable() or mismatch(preset, settings)) if args.name == ALL else ""
        if why_not:
            print(f"{name}: skipped: {why_not}", flush=True)
            continue
        t0 = time.perf_counter()
        report = run_experiment(name, settings)
        print(f"{name}: {time.perf_counter() - t0:.0f} s, report {report}", flush=True)
    if len(names) > 1:
        print(f"all {len(names)} presets: {time.perf_counter() - start:.0f} s")
    return 0
