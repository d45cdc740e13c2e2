"""`approxdist simulate`: seed 001's speed-up s(N,b) at scale, from the cost model, with a band.

    approxdist simulate --model alexnet --profile tests/data/pipedream-profiles/alexnet.txt \\
        --nodes 1,2,4,8,16,32,64,128,256 --per-node-batch 256,64,32 --link bw=32gbit,lat=2us

Data parallelism on N nodes of one rank each (seed 001, eq. 1; `planner.scaling`): the
profile's compute (e.g. PipeDream's AlexNet profile, measured at 256 images on its GPU)
scaled by `--compute-scale` to the seed's GPU and by (b/256)^`--batch-exponent` to the
per-node batch, gradients all-reduced over `--link` (its bandwidth times
`--bandwidth-scale`, `--alpha` seconds per message) with `--gamma` seconds per byte added,
overlapped with backward and, as seed 001 does, with the next forward (overtaking and
early forward; `--no-early-forward` to drop it), every step waiting for the slowest rank
(`--jitter`, `--tail`). Each input is VALUE,LOW,HIGH and labelled measured, calibrated,
fitted or assumed; the table prints s and its band, the inputs with their source, and
which inputs move s most. `--fit` fits the unmeasured inputs to observed points and
`--time-to-accuracy` checks seed 001's Table 4 (`cli/simulate_fit.py`).

    approxdist simulate --profile gpt.json --mesh dp=4 --mesh tp=2,dp=2 --mesh tp=4 \
        --per-node-batch 8 --link bw=1gbit --compute-scale 1 --fwd-codec bf16

`--mesh` (repeatable, instead of `--nodes`) prices meshes of `tp` and `dp` axes, one rank
per node: a `tp` axis splits the model's layers by its own plan or `--tp-plan`, read off
the model a profile of ours records (`approxdist plan profile`), its all-reduces on
`--fwd-codec` / `--bwd-codec` over the same link.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.cli import simulate_fit
from approxdist.cli.groups import command
from approxdist.errors import ConfigError
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.pipedream_format import read_any_profile
from approxdist.planner.scaling import TAILS, Input, ScalingModel, curve
from approxdist.planner.simfit.points import read_points
from approxdist.planner.tp_layout import layout_of, profiled_config
from approxdist.text import comma_list, positive_ints
from approxdist.topology import Mesh, parse_mesh

NODES = "1,2,4,8,16,32,64,128,256"


def register(sub: Any) -> None:
    p = command(sub, "simulate", help="predict seed 001's data-parallel speed-up at scale", doc=__doc__)
    p.add_argument("--model", help="the profile's model, checked against it (e.g. alexnet)")
    p.add_argument("--profile", type=Path, required=True,
                   help="profile file: ours, or a PipeDream graph.txt such as "
                        "tests/data/pipedream-profiles/alexnet.txt")
    p.add_argument("--nodes", help=f"comma list of N (default {NODES})")
    p.add_argument("--mesh", action="append", default=[],
                   help="instead of --nodes: a mesh of tp and dp axes, one rank per node, "
                        "e.g. tp=2,dp=2 (repeat the flag for more)")
    p.add_argument("--tp-plan", default="", help="layers a tp axis splits: a file of "
                   "'layer.path = style' lines or inline (default: the model's own plan)")
    p.add_argument("--fwd-codec", default="fp32", help="tp forward all-reduces' wire format")
    p.add_argument("--bwd-codec", default="fp32", help="tp backward all-reduces' wire format")
    p.add_argument("--per-node-batch", default="256,64,32", help="comma list of b")
    p.add_argument("--link", default="bw=32gbit,lat=2us",
                   help="link between nodes (default bw=32gbit,lat=2us: InfiniBand QDR, assumed)")
    p.add_argument("--compute-scale", default="7,4,12", help="VALUE,LOW,HIGH: seconds on the "
                   "seed's GPU per second of the profile (default 7,4,12, assumed)")
    p.add_argument("--batch-exponent", default="1,0.8,1", help="VALUE,LOW,HIGH: compute grows "
                   "as (b/B)^e (default 1,0.8,1, assumed)")
    p.add_argument("--bandwidth-scale", default="1,0.25,1", help="VALUE,LOW,HIGH: share of the "
                   "link's bandwidth the all-reduce gets (default 1,0.25,1, assumed)")
    p.add_argument("--gamma", default="2.5e-10,1e-10,1e-9", help="VALUE,LOW,HIGH: seconds per "
                   "fp32 byte added (default 2.5e-10,1e-10,1e-9, assumed)")
    p.add_argument("--alpha", help="VALUE,LOW,HIGH: seconds per message (default: --link's "
                   "latency, up to 1 ms of software per message; assumed)")
    p.add_argument("--jitter", default="0,0,0.05", help="VALUE,LOW,HIGH: each rank's compute "
                   "noise as a share of it; the step waits for the slowest (default 0,0,0.05)")
    p.add_argument("--tail", default="exp", choices=TAILS, help="the noise's tail: exp "
                   "(slowest of N: H_N - 1 noises) or gauss (sqrt(2 ln N)); default exp")
    p.add_argument("--no-early-forward", dest="early_forward", action="store_false",
                   help="price dp_time's step instead of seed 001's overtaking and early "
                        "forward (the next forward of a layer once its weights are updated)")
    p.add_argument("--calibration", type=Path, help="cost calibration file: take gamma from "
                   "its level (calibrated) and codec costs from it")
    p.add_argument("--algorithm", default="auto", help="all-reduce (default auto)")
    p.add_argument("--codec", default="fp32", help="gradient wire format (default fp32)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="all-reduce after backward instead of during it")
    p.add_argument("--json", type=Path, help="write the rows here")
    simulate_fit.register(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    meshes = _meshes(args)
    model = build(args, meshes)
    if args.fit:
        model = simulate_fit.fitted(model, args)
    if args.time_to_accuracy:
        tta = simulate_fit.report_time_to_accuracy(model, args)
    if (args.fit or args.time_to_accuracy) and not (args.nodes or meshes):
        _inputs(model)
        if args.json:
            args.json.write_text(json.dumps({"time_to_accuracy": tta} if args.time_to_accuracy
                                            else {}, indent=1) + "\n")
        return 0
    nodes = [m.extent("dp") for m in meshes] or list(positive_ints(args.nodes or NODES, "--nodes", "1,2,4"))
    shards = [m.extent("tp") for m in meshes] or [1] * len(nodes)
    batches = list(positive_ints(args.per_node_batch, "--per-node-batch", "256,64"))
    published = {(p.nodes, p.per_node_batch): p.speedup for p in read_points(args.points)[1]}
    rows: list[dict[str, Any]] = [
        {**r, "mesh": _label(int(r["tp"]), int(r["nodes"])),
         "seed001": published.get((int(r["nodes"]), int(r["per_node_batch"])))
         if r["tp"] == 1 else None}
        for r in curve(model, nodes, batches, shards)]
    where = [Column("mesh", 12, "mesh", left=True)] if meshes else [Column("nodes", 6, "nodes")]
    cols = [*where, Column("b", 5, "per_node_batch"),
            Column("s(N,b)", 8, "speedup", ".1f"), Column("low", 8, "speedup_low", ".1f"),
            Column("high", 8, "speedup_high", ".1f")]
    if not meshes:
        cols.append(Column("seed 001", 9, show=lambda r: "" if r["seed001"] is None
                           else f"{r['seed001']:.1f}"))
    tp_wires = f"; tp wires fwd {model.tp_fwd.spec}, bwd {model.tp_bwd.spec}" \
        if any(t > 1 for t in shards) else ""
    print(f"s(N,b) = t(1,{model.profile.micro_batch_size}) / t(N,b) x b/"
          f"{model.profile.micro_batch_size} x N (N: replicas); {model.profile.model}, "
          f"{args.algorithm}, {model.codec.spec}, overlap {'on' if args.overlap else 'off'}, "
          f"link {args.link}{tp_wires}")
    print(render(cols, rows))
    _inputs(model)
    top = max(range(len(nodes)), key=lambda i: (nodes[i] * shards[i], shards[i]))
    top_n, top_tp, top_b = nodes[top], shards[top], max(batches)
    at = _label(top_tp, top_n) if meshes else f"N={top_n}"
    print(f"band at {at}, b={top_b}, one input at a time:")
    for name, (lo, hi) in sorted(model.sensitivity(top_n, top_b, top_tp).items(),
                                 key=lambda kv: -abs(kv[1][1] - kv[1][0])):
        print(f"  {name}: {min(lo, hi):.1f} .. {max(lo, hi):.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"rows: {args.json}")
    return 0


def _inputs(model: ScalingModel) -> None:
    print("inputs:")
    for i in model.inputs:
        note = f": {i.note}" if i.note else ""
        print(f"  {i.name} = {i.value:g} [{i.low:g}, {i.high:g}] ({i.source}{note})")


def _label(tp: int, replicas: int) -> str:
    """A mesh as the table prints it: `tp=2,dp=2`, `dp=4`."""
    return f"tp={tp},dp={replicas}" if tp > 1 else f"dp={replicas}"


def _meshes(args: argparse.Namespace) -> list[Mesh]:
    """`--mesh` specs: meshes of tp and dp axes only, and not beside `--nodes`."""
    if args.mesh and args.nodes:
        raise ConfigError(f"--nodes {args.nodes} and --mesh {args.mesh[0]} both say the ranks; "
                          f"give one of the two (--mesh dp=N is N nodes)")
    meshes = [parse_mesh(text) for text in args.mesh]
    for text, mesh in zip(args.mesh, meshes):
        other = [a.text() for a in mesh.axes if a.name not in ("tp", "dp") and a.extent > 1]
        if other:
            raise ConfigError(f"--mesh {text}: simulate prices data and tensor parallelism "
                              f"(tp and dp axes), not {', '.join(other)}; for pipelines use "
                              f"approxdist plan")
    return meshes


def build(args: argparse.Namespace, meshes: list[Mesh] | None = None) -> ScalingModel:
    """The scaling model the flags describe (with the model's tp layout where a mesh has a
    tp axis)."""
    profile = read_any_profile(args.profile)
    if args.model and args.model != profile.model:
        raise ConfigError(f"--profile {str(args.profile)!r} is of model {profile.model!r}, not "
                          f"--model {args.model!r}; give that model's profile")
    link = LinkLevel.from_link("inter", args.link)
    cal = CostCalibration.load(args.calibration) if args.calibration else None
    gamma = _input("gamma", args.gamma, "seconds per fp32 byte summed")
    if cal is not None:
        level = next((cal.levels[n] for n in ("inter", "intra", "loopback") if n in cal.levels),
                     None)
        if level is None:
            raise ConfigError(f"cost calibration {str(args.calibration)!r} has no level; fit one")
        fit = cal.fits.get(level.name)
        spread = fit.rms_rel_error if fit is not None else 0.0
        g = level.gamma_s_per_byte
        gamma = Input("gamma", g, g * max(0.0, 1 - spread), g * (1 + spread), "calibrated",
                      f"level {level.name!r} of {args.calibration}, band = its fit's rms error")
    codec = cal.codec(args.codec) if cal else CodecCost.of(args.codec)
    tps = sorted({m.extent("tp") for m in meshes or ()} - {1})
    layout = None
    if tps:
        model_cfg, data_cfg = profiled_config(profile)
        layout = layout_of(model_cfg, data_cfg, profile.micro_batch_size, args.tp_plan, tps)
        for tp in tps:
            layout.check(tp, profile)
    fwd, bwd = (cal.codec(c) if cal else CodecCost.of(c) for c in (args.fwd_codec,
                                                                    args.bwd_codec))
    alpha = args.alpha or f"{link.alpha_s:g},{link.alpha_s:g},{max(link.alpha_s, 1e-3):g}"
    return ScalingModel(
        profile, link,
        _input("compute_scale", args.compute_scale, "seed GPU seconds per profile second"),
        _input("batch_exponent", args.batch_exponent, "compute ~ (b/B)^e"),
        _input("bandwidth_scale", args.bandwidth_scale, "share of --link the all-reduce gets"),
        gamma, _input("alpha", alpha, "seconds per message: the link's latency and the "
                      "software's"),
        _input("jitter", args.jitter, f"compute noise, a share of it ({args.tail} tail)"),
        early_forward=args.early_forward, tail=args.tail, algorithm=args.algorithm,
        codec=codec, overlap=args.overlap, layout=layout, tp_fwd=fwd, tp_bwd=bwd)


def _input(name: str, text: str, note: str) -> Input:
    bad = ConfigError(f"--{name.replace('_', '-')} {text!r} must be VALUE or VALUE,LOW,HIGH "
                      f"numbers, e.g. 7,4,12")
    parts = comma_list(text, float, bad)
    if len(parts) not in (1, 3):
        raise bad
    value, low, high = parts * 3 if len(parts) == 1 else parts
    return Input(name, value, low, high, "assumed", note)


