"""`approxdist bench tp`: our tensor parallelism vs `torch.distributed.tensor.parallel` (seed 003).

    approxdist bench tp --model gpt-tiny --tp 2 --codecs fp32,bf16,fp8-e5m2 \
        --wire fwd,bwd,both --link none --link bw=1gbit --link bw=100mbit --json tp.json

Both engines split the same model by the same plan (the model's own, or `--tp-plan`:
gpt by heads and MLP pairs, mlp in column-row pairs) over `--tp` local gloo ranks
started by `run_on_ranks`, one torch thread each, and step on the same batch; their
first-step losses must agree (else the run is refused), then every engine takes its
turn in each round (method: `approxdist.benchmarks.tp`). The table gives the median
samples/s, the ratio to torch (of the medians, and paired per round), the paired ratio to
our fp32 wire, each engine's first-step loss and our bytes per step, for our fp32 wire
and each `--codecs` entry on each `--wire` (`+ef`: with error feedback), once per
`--link` (repeat it; `none` for no emulation). `--link` shapes our wires only: torch's
collectives bypass the link layer, so its row stays an unshaped baseline. A plan with
convolution styles (the ResNets) has no torch counterpart: its rows compare with our
fp32 wire only.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_round_flags, check_counts, finish, ratio, render, scaled
from approxdist.bench.timing import Timing
from approxdist.benchmarks.dp import codec_label, split_label
from approxdist.benchmarks.tp import WIRES, TPBenchCase, case_model, measure_rank, summarize
from approxdist.benchmarks.tp import variants as wire_variants
from approxdist.benchmarks.tp_torch import missing_styles
from approxdist.cli.bench_pipeline import INPUTS
from approxdist.cli.groups import command
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import tp_plan_of
from approxdist.models.bench_inputs import bench_input
from approxdist.tensor_parallel import check_plan, default_plan, tp_plan_from
from approxdist.text import comma_list, name_list


def register(sub: Any) -> None:
    p = command(sub, "tp", help="tensor parallelism vs torch.distributed.tensor.parallel", doc=__doc__)
    p.add_argument("--model", default="gpt-tiny",
                   help="a model with a tensor-parallel plan: gpt-tiny (the default; byte "
                        "tokens, 64 positions, next-token loss), gpt-mini, gpt-small, mlp "
                        "(8 blocks of --hidden), a CIFAR ResNet (ours only); or any model "
                        "with --tp-plan")
    p.add_argument("--tp", type=int, default=2, help="ranks splitting each layer (default 2)")
    p.add_argument("--tp-plan", default="",
                   help="layer.path=style pairs (0=colwise,2=rowwise) or a plan file "
                        "(default: the model's own plan)")
    p.add_argument("--hidden", type=int, default=1024, help="mlp width (default 1024)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="mini-batch, the same on every rank (default 16)")
    p.add_argument("--codecs", default="fp32,bf16,fp8-e5m2",
                   help="comma list of our wires' codecs, each timed against our fp32 wire; "
                        "append +ef for error feedback (default %(default)s)")
    p.add_argument("--wire", default="fwd,bwd,both",
                   help="comma list: which wire carries each codec, the forward "
                        "all-reduces (fwd), the backward ones (bwd) or both (default "
                        "%(default)s)")
    p.add_argument("--link", action="append", default=None,
                   help="emulated link of our wires, e.g. bw=1gbit,lat=100us; repeat it for "
                        "several (none: no emulation, the default)")
    add_round_flags(p, rounds=5, steps=5)
    p.set_defaults(func=run)


def plan_cases(args: argparse.Namespace) -> list[TPBenchCase]:
    """One case per link; the model, plan, tp size, codecs and links are checked here,
    before any rank starts."""
    check_counts(rounds=args.rounds, steps=args.steps, batch_size=args.batch_size,
                 hidden=args.hidden)
    if args.tp < 2:
        raise ConfigError(f"--tp {args.tp}: tensor parallelism needs 2 or more ranks; e.g. --tp 2")
    inputs = bench_input(args.model, INPUTS.get(args.model, (3, 32, 32)))
    case = TPBenchCase(args.model, inputs.shape, (), tp=args.tp, batch_size=args.batch_size,
                       hidden=args.hidden, classes=inputs.classes, tokens=inputs.tokens)
    model = case_model(case)  # ModelError naming an unknown model
    plan = tp_plan_from(args.tp_plan) if args.tp_plan else \
        default_plan(model, tp_plan_of(args.model), args.model)
    check_plan(model, plan, args.tp)
    codecs = [split_label(codec_label(c)) for c in name_list(args.codecs)]
    wires = comma_list(args.wire, _wire, ConfigError(
        f"--wire {args.wire!r}: each entry must be one of {', '.join(WIRES)}; e.g. fwd,both"))
    links = [_link(text) for text in (args.link or ["none"])]
    case = replace(case, plan=tuple(plan.items()), variants=wire_variants(codecs, wires))
    return [replace(case, link=link) for link in links]


def _wire(text: str) -> str:
    if text.strip() not in WIRES:
        raise ValueError(text)
    return text.strip()


def _link(text: str) -> str:
    spec = parse_link(text)  # SpecError naming the bad field
    return spec.spec if spec is not None else ""


COLUMNS = (Column("model", 9, "model", left=True), Column("tp", 2, "tp"),
           Column("link", 10, "link", left=True), Column("engine", 10, "engine", left=True),
           Column("fwd", 14, "fwd_codec", left=True), Column("bwd", 14, "bwd_codec", left=True),
           Column("ef", 2, show=lambda r: "y" if r.get("error_feedback") else "-"),
           Column("samples/s", 10, "samples_per_s", ".1f"),
           Column("step ms", 8, show=scaled("median_step_s", 1e3, ".1f")),
           Column("vs torch", 8, show=ratio("ratio_vs_torch", ".3f")),
           Column("paired", 7, show=ratio("paired_ratio", ".3f")),
           Column("vs fp32", 7, show=ratio("vs_fp32", ".3f")),
           Column("loss0", 9, "first_loss", ".6f"),
           Column("bytes/step", 10, show=scaled("bytes_per_step", 1e-3, ".1f")))


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    cases = plan_cases(args)
    timing = Timing(rounds=args.rounds, steps=args.steps)
    with HostWatch() as host:
        per_rank = run_on_ranks(measure_rank, args.tp, cases, timing, timeout_s=3600,
                                comm_timeout_s=300)
    rows = summarize(cases, per_rank, args.steps)  # BaselineMismatch: a refused case
    print(table(rows))
    print(f"(medians of {args.rounds} rounds of {args.steps} mini-batches; paired = median over "
          "rounds of torch's round time / ours in the same round, vs fp32 the same against "
          "our fp32 wire; loss0 = first-step loss on the same batch; bytes/step in kB sent by "
          "rank 0; --link shapes our wires only)")
    missing = missing_styles(dict(cases[0].plan))
    print(f"no torch rows: torch.distributed.tensor.parallel has no counterpart of the plan's "
          f"{', '.join(missing)} style(s)" if missing else
          "torch's first-step loss equals our fp32 wire's (checked before timing)")
    finish(host, rows, args.json, "approxdist bench tp " + " ".join(_argv(args)))
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    out = [f"--model {args.model}", f"--tp {args.tp}", f"--batch-size {args.batch_size}",
           f"--codecs {args.codecs}", f"--wire {args.wire}", f"--rounds {args.rounds}",
           f"--steps {args.steps}"]
    if args.tp_plan:
        out.append(f"--tp-plan {args.tp_plan}")
    if args.model == "mlp":
        out.append(f"--hidden {args.hidden}")
    out += [f"--link {link}" for link in args.link or []]
    return out
