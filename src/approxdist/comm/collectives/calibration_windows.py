"""How many rounds `auto`'s automatic calibration needs: windows of a long measurement.

`python -m approxdist.comm.collectives.calibration_windows --world-size 4` times every
candidate of `autocal` for many interleaved rounds (each op after a barrier, with the
argument check, the slowest member's time: as the calibration and `bench allreduce`
do), then asks, for each window of W consecutive rounds, which algorithm a calibration
that saw only those rounds would pick (by the median, and by other estimators for
comparison) and whether that pick's median over *all* rounds is within `--tolerance` of
the best one (the target: 1.15x). It prints, per estimator and W, the share of
windows whose pick meets the tolerance, per size, and the worst ratio. `autocal.MAX_ROUNDS`
is chosen from this table (docs/collectives.md, "Why 80 rounds").
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping, Sequence

import torch

from approxdist.comm.collectives import autocal
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks

Times = Mapping[str, Sequence[float]]  # algorithm -> seconds per round
Estimator = Callable[[Sequence[float]], float]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile `q` in [0, 1]."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


ESTIMATORS: dict[str, Estimator] = {
    "median": statistics.median,
    "mean": statistics.mean,
    "p25": lambda v: quantile(v, 0.25),
    "p40": lambda v: quantile(v, 0.40),
    "p75": lambda v: quantile(v, 0.75),
}


def window_picks(times: Times, window: int, estimator: Estimator,
                 stride: int = 5) -> list[float]:
    """For each window of `window` rounds (every `stride`), the full-run median of the
    algorithm `estimator` picks in it, over the best full-run median (1.0: the best)."""
    full = {a: statistics.median(v) for a, v in times.items()}
    best = min(full.values())
    rounds = min(len(v) for v in times.values())
    out = []
    for start in range(0, rounds - window + 1, stride):
        seen = {a: estimator(v[start:start + window]) for a, v in times.items()}
        out.append(full[min(seen, key=lambda a: seen[a])] / best)
    return out


def _measure(ctx: DistContext, sizes: Sequence[int], rounds: int) -> dict[int, dict[str, list[float]]]:
    from approxdist.comm.collectives.allreduce import AllReduce
    from approxdist.comm.link import Link

    link = Link(ctx)
    try:
        reducers = {a: AllReduce(link, a, "fp32") for a in autocal.CANDIDATES}
        out = {}
        for size in sizes:
            x = torch.randn(size // 4, generator=torch.Generator().manual_seed(size))
            work = torch.empty_like(x)
            took = [autocal.time_round(link, reducers, work, x, r) for r in range(rounds + 1)]
            mine = {a: [t[a] for t in took[1:]] for a in autocal.CANDIDATES}  # round 0 warms up
            out[size] = autocal._slowest(link, mine)
        return out
    finally:
        link.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m approxdist.comm.collectives.calibration_windows",
        description="share of W-round windows whose calibration pick is within a tolerance "
                    "of the best all-reduce")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes", default="4096,65536,1048576", help="bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3, help="fresh sets of processes")
    parser.add_argument("--windows", default="20,40,80")
    parser.add_argument("--tolerance", type=float, default=1.15)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    if args.world_size < 2 or args.rounds < max(windows):
        parser.error(f"need --world-size >= 2 and --rounds >= the largest window "
                     f"({max(windows)}); got {args.world_size} and {args.rounds}")
    runs = [run_on_ranks(_measure, args.world_size, sizes, args.rounds, timeout_s=3600)[0]
            for _ in range(args.repeats)]
    print(f"world size {args.world_size}, {args.rounds} rounds x {args.repeats} runs; share "
          f"of windows whose pick is within {args.tolerance}x of the best median (worst)")
    for run in runs:
        print("  medians ms:", {s: {a: round(statistics.median(v) * 1e3, 3) for a, v in t.items()}
                                for s, t in run.items()})
    for w in windows:
        for name, est in ESTIMATORS.items():
            cells = []
            for size in sizes:
                ratios = [r for run in runs for r in window_picks(run[size], w, est)]
                ok = sum(r <= args.tolerance for r in ratios) / len(ratios)
                cells.append(f"{size}: {ok:.2f} ({max(ratios):.2f}x)")
            print(f"W={w:4d} {name:7s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
