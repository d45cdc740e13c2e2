"""`approxdist plan --model M --world-size N ...`: choose a plan on the cost model and write the plan file.

    approxdist plan --profile alexnet.txt --world-size 4 --link bw=8gbit --json plan.json
    approxdist plan --model resnet20 --microbatch-size 32 --nodes 2 --per-node 2 \\
        --intra bw=20gbit --inter bw=1gbit,lat=100us --fwd-codec bf16 --json plan.json
    approxdist plan --profile alexnet.txt --world-size 4 --link bw=8gbit --objective pipedream
    approxdist plan --model gpt-tiny --dataset stdlib-text --world-size 4 --link bw=1gbit \
        --tp auto --fwd-codec bf16 --json plan.json
    approxdist plan --model mlp --mesh tp=2,dp=2 --link bw=100mbit

Profiles the model (or reads `--profile`: ours or a PipeDream graph.txt), runs the solver
for each schedule and micro-batch count, re-ranks its best plans by the event simulation,
prices data parallelism by `dp_time` and tensor parallelism on each `tp x dp` mesh by
`tp_time` (the model's layers split by its own plan or `--tp-plan`, measured on one
forward pass: `planner.tp_layout`), prints the best plan, the next ones and why (the best
of each mode and where its step goes), and writes the best as a plan file that
`approxdist train --plan FILE` runs (docs/planner.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.cli.plan_load import load_line, planned_profile, ranked_at_load
from approxdist.cli.plan_profile import add_model_flags, model_config
from approxdist.config.schema import DataConfig
from approxdist.data.registry import load_dataset
from approxdist.errors import ConfigError
from approxdist.pipeline.profiler import REPEAT
from approxdist.planner.choice import explain, label, parts_text
from approxdist.planner.cluster import ClusterSpec
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.kinds import stage_ranges
from approxdist.planner.objective import SolverSettings
from approxdist.planner.pipedream_optimizer import PipeDreamSettings
from approxdist.planner.plan_file import write_plan
from approxdist.planner.profile import Profile
from approxdist.planner.search import (
    RankedPlan,
    TensorSpace,
    auto_microbatches,
    pipedream,
    plan_dict,
    search,
)
from approxdist.planner.tp_layout import layout_of, profiled_config
from approxdist.text import positive_ints
from approxdist.topology import Mesh, parse_mesh

#: the schedules `plan` compares by default: every one whose stages are one block range per
#: rank (the zero-bubble ones priced from the profile's split backward, `I` and `W`)
SCHEDULES = ("1f1b", "gpipe", "zbh1", "zbh2")


def add_flags(p: argparse.ArgumentParser) -> None:
    """The planner's flags, on `approxdist plan` itself."""
    add_model_flags(p)
    p.add_argument("--profile", help="plan from this profile file (ours, or a PipeDream "
                                     "graph.txt) instead of profiling --model")
    p.add_argument("--microbatch-size", type=int, default=32,
                   help="samples per micro-batch when profiling (default 32)")
    p.add_argument("--threads", type=int, help="torch threads per rank when profiling "
                                               "(default: this machine's cores / ranks)")
    p.add_argument("--load-probe", action="store_true",
                   help="probe the model on this machine's ranks first and price each plan at "
                        "its load (with --model; docs/planner.md)")
    p.add_argument("--repeat", type=int, default=REPEAT,
                   help=f"timed passes when profiling (default {REPEAT})")
    c = p.add_argument_group("cluster")
    c.add_argument("--world-size", type=int, help="ranks in all")
    c.add_argument("--mesh", help="plan only this mesh of tp and dp axes, e.g. tp=2,dp=2 "
                                  "(tensor parallelism) or dp=4; it sets the world size")
    c.add_argument("--nodes", type=int, help="nodes (with --per-node: ranks = nodes x per-node)")
    c.add_argument("--per-node", type=int, help="ranks per node")
    c.add_argument("--link", help="one link between every two ranks, e.g. bw=10gbit,lat=5us")
    c.add_argument("--intra", help="link inside a node (with --inter, --nodes, --per-node)")
    c.add_argument("--inter", help="link between nodes")
    c.add_argument("--calibration", type=Path,
                   help="cost calibration file: this machine's fitted levels and codec costs")
    c.add_argument("--memory", help="bytes per rank (e.g. 16e9); plans that exceed it are refused")
    w = p.add_argument_group("wire formats and schedule")
    w.add_argument("--codec", help="one wire format for activations, gradients and the "
                                   "replicas' all-reduce (each flag below overrides it)")
    w.add_argument("--fwd-codec", help="activations (default fp32)")
    w.add_argument("--bwd-codec", help="activation gradients (default fp32)")
    w.add_argument("--grad-codec", help="the replicas' gradient all-reduce (default fp32)")
    w.add_argument("--algorithm", default="auto", help="the replicas' all-reduce (default auto)")
    w.add_argument("--schedule", default=",".join(SCHEDULES),
                   help="schedules to compare (default 1f1b,gpipe,zbh1,zbh2; the zero-bubble "
                        "ones are priced from the profile's split backward)")
    w.add_argument("--microbatches", default="auto",
                   help="micro-batches per step, a comma list, or auto (N, 2N, 4N on N ranks)")
    w.add_argument("--stages", type=int, help="a fixed number of stages (default: any)")
    w.add_argument("--tp", default="auto",
                   help="tensor-parallel sizes to compare, a comma list, or auto (every "
                        "divisor of the world from 2 that the plan splits; default)")
    w.add_argument("--tp-plan", default="", help="the layers tensor parallelism splits: a "
                   "file of 'layer.path = style' lines or inline, 0=colwise,2=rowwise "
                   "(default: the model's own plan)")
    w.add_argument("--optimizer", default="momentum", help="sgd, momentum (default) or adam: "
                                                            "its state counts in memory")
    o = p.add_argument_group("objective")
    o.add_argument("--objective", choices=["ours", "pipedream"], default="ours",
                   help="ours (default) or PipeDream's optimizer, reproduced")
    o.add_argument("--activation-compression-ratio", type=float,
                   help="pipedream: count activation transfers at this ratio (its flag)")
    o.add_argument("--straight-pipeline", action="store_true",
                   help="pipedream: one worker per stage (its flag)")
    p.add_argument("--top", type=int, default=5, help="plans to list (default 5)")
    p.add_argument("--json", type=Path, help="write the best plan as a plan file here")


def run(args: argparse.Namespace) -> int:
    mesh = _mesh(args)
    cluster = ClusterSpec(mesh.world_size if mesh else args.world_size, args.nodes,
                          args.per_node, args.link, args.intra, args.inter,
                          CostCalibration.load(args.calibration) if args.calibration else None)
    profile, loads = planned_profile(args, cluster)
    tensor, not_priced = _tensor(args, profile, cluster.ranks, mesh)
    fwd, bwd, grad = (cluster.codec(spec) for spec in _codecs(args))
    cal = cluster.calibration or CostCalibration()  # none: the optimizer and engines unpriced
    base = SolverSettings(cluster.ranks, cluster.network(), fwd_codec=fwd, bwd_codec=bwd,
                          grad_codec=grad, algorithm=args.algorithm,
                          memory_bytes=_bytes(args.memory), optimizer=args.optimizer,
                          optimizer_s_per_byte=cal.optimizer_s_per_byte(args.optimizer),
                          optimizer_s_per_tensor=cal.optimizer_s_per_tensor(args.optimizer),
                          stages=1 if mesh else args.stages, overhead=cal.overhead)
    schedules = tuple(s.strip() for s in args.schedule.split(","))
    counts = auto_microbatches(cluster.ranks) if args.microbatches == "auto" \
        else positive_ints(args.microbatches, "--microbatches", word="auto")
    extra: dict[str, Any] = {}
    if args.objective == "pipedream":
        settings = PipeDreamSettings(cluster.pipedream_levels(), args.activation_compression_ratio,
                                     args.straight_pipeline, base.memory_bytes)
        chosen, ranked = pipedream(profile, base, settings, schedules, counts)
        extra["bottleneck_s"] = chosen.bottleneck_s
        print(f"PipeDream's objective: bottleneck {chosen.bottleneck_s * 1e3:.2f} ms per "
              f"micro-batch of {profile.micro_batch_size}")
    else:
        ranked = search(profile, base, schedules, counts, tensor)
        if mesh is not None:
            ranked = [p for p in ranked if p.tp == mesh.extent("tp")]
    if loads is not None:
        ranked = ranked_at_load(ranked, loads, base, tensor)
        print(load_line(loads))
    print(_header(profile, cluster, base, args.objective))
    print(_describe(ranked[0], "best"))
    print(_table(ranked[:max(1, args.top)]))
    for line in explain(ranked, not_priced):
        print(line)
    if args.json:
        write_plan(plan_dict(profile, ranked[0], cluster.to_json(), args.objective, extra,
                             profile.planned_for), args.json)
        print(f"plan file: {args.json} (run it: {next_step(args.json, profile)})")
    return 0


def next_step(path: str, profile: Profile) -> str:
    """The command that trains plan file `path`. A profile that names no data set of ours
    (PipeDream's) binds none, so the default data set would meet samples of another shape
    than profiled: the command then asks for random samples of the profiled shape."""
    run = f"approxdist train --plan {path}"
    if profile.planned_for is not None or \
            tuple(profile.input_shape) == load_dataset(DataConfig()).input_shape:
        return run
    shape = ",".join(map(str, profile.input_shape))
    return (f"{run} --dataset synthetic --set 'data.synthetic_shape=[{shape}]'; the profile "
            f"names no data set: these are random samples of the shape it was profiled on")


def _mesh(args: argparse.Namespace) -> Mesh | None:
    """`--mesh`: a mesh of tp and dp axes that agrees with `--world-size`."""
    if not args.mesh:
        return None
    mesh = parse_mesh(args.mesh)
    other = [a.text() for a in mesh.axes if a.name not in ("tp", "dp") and a.extent > 1]
    if other:
        raise ConfigError(f"--mesh {args.mesh}: plan --mesh takes tp and dp axes, not "
                          f"{', '.join(other)}; for pipelines give --world-size and --stages")
    if args.world_size is not None and args.world_size != mesh.world_size:
        raise ConfigError(f"--mesh {args.mesh} holds {mesh.world_size} rank(s) but "
                          f"--world-size is {args.world_size}; give one of the two, or make "
                          f"them agree")
    if args.tp != "auto":
        raise ConfigError(f"--mesh {args.mesh} says the tp size; drop --tp {args.tp}")
    return mesh


def _tensor(args: argparse.Namespace, profile: Profile, world: int, mesh: Mesh | None
            ) -> tuple[TensorSpace | None, list[str]]:
    """The tensor plans to price, and why some are not: asked for by `--tp` or `--mesh`,
    a size that cannot split the world or the model is one `ConfigError` line; under
    `--tp auto` it is skipped and said."""
    asked = mesh is not None or args.tp != "auto"
    sizes = (mesh.extent("tp"),) if mesh else \
        tuple(n for n in range(2, world + 1) if world % n == 0) if args.tp == "auto" \
        else positive_ints(args.tp, "--tp", "2,4", word="auto")
    for n in sizes:
        if asked and world % n:
            raise ConfigError(f"--tp {n} does not divide the world of {world} rank(s); the "
                              f"world is tp x replicas: give a tp among "
                              f"{', '.join(str(d) for d in range(1, world + 1) if world % d == 0)}")
    sizes = tuple(n for n in sizes if n > 1)
    if not sizes or args.objective != "ours":
        return None, []
    try:
        if args.profile:
            model_cfg, data_cfg = profiled_config(profile)
        else:
            cfg = model_config(args)
            model_cfg, data_cfg = cfg.model, cfg.data
        layout = layout_of(model_cfg, data_cfg, profile.micro_batch_size, args.tp_plan, sizes)
    except ConfigError as exc:
        if asked:
            raise
        return None, [f"tensor: {exc}"]
    refused = dict(layout.refused)
    if asked and refused:
        raise ConfigError(next(iter(refused.values())))
    return TensorSpace(layout, sizes), [f"tp={n}: {why}" for n, why in refused.items()]


def _codecs(args: argparse.Namespace) -> tuple[str, str, str]:
    common = args.codec or "fp32"
    return (args.fwd_codec or common, args.bwd_codec or common, args.grad_codec or common)


def _bytes(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 1 or value != value or value == float("inf"):
        raise ConfigError(f"--memory {text!r} must be a number of bytes >= 1, e.g. 16e9")
    return int(value)


def _header(profile: Profile, cluster: ClusterSpec, s: SolverSettings, objective: str) -> str:
    return (f"plan: {profile.model} ({len(profile.blocks)} blocks, micro-batch "
            f"{profile.micro_batch_size}) on {cluster.describe()}; wire fwd {s.fwd_codec.spec}, "
            f"bwd {s.bwd_codec.spec}, grad {s.grad_codec.spec} ({s.algorithm}); "
            f"objective {objective}")


def _stages(plan: RankedPlan) -> str:
    ranges = stage_ranges(plan.plan)
    return f"{ranges} {label(plan)}" if plan.tp > 1 else ranges


def _describe(p: RankedPlan, title: str) -> str:
    parts = parts_text(p)
    memory = ", ".join(f"stage {m.stage} {_size(m.total_bytes)}" for m in p.memory)
    schedule = f"{p.plan.schedule}, " if p.kind.scheduled else ""
    return (f"{title}: {p.mode}, {schedule}{p.plan.microbatches} micro-batch(es), stages "
            f"{_stages(p)}\n"
            f"  predicted {p.step_s * 1e3:.2f} ms per step of {p.samples_per_step} samples, "
            f"{p.per_sample_s * 1e6:.1f} us per sample\n"
            f"  memory per rank: {memory}\n"
            f"  where the time goes: {parts}")


def _table(plans: list[RankedPlan]) -> str:
    rows = [{"rank": i + 1, "mode": p.mode,
             "sched": p.plan.schedule if p.kind.scheduled else "-",
             "m": p.plan.microbatches, "stages": _stages(p),
             "step": p.step_s * 1e3, "sample": p.per_sample_s * 1e6,
             "est": "-" if p.estimate_s is None else f"{p.estimate_s * 1e3:.2f}",
             "mem": _size(max(m.total_bytes for m in p.memory))} for i, p in enumerate(plans)]
    cols = [Column("#", 2, "rank"), Column("mode", 8, "mode", left=True),
            Column("schedule", 8, "sched", left=True), Column("M", 4, "m"),
            Column("stages [first,end)xreplicas", 34, "stages", left=True),
            Column("step ms", 10, "step", ".2f"), Column("us/sample", 10, "sample", ".1f"),
            Column("solver ms", 10, "est"), Column("memory", 10, "mem")]
    return render(cols, rows)


def _size(nbytes: int) -> str:
    """Bytes as MiB, or GiB from 1 GiB on."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
