"""`seed001-scaling`: measured speed-up s(N,b) of data-parallel training (seed 001, eq. 1).

    s(N,b) = t(1,B) / t(N,b) * b/B * N

t(N,b) is the time of one forward + backward + update cycle on N nodes with per-node
batch b, B the reference batch of one node (seed 001: B = 256 on one GPU; it measured
217x on 256 nodes and 60.4x on 64 nodes with b = 256, 30.5x with b = 64, 15.5x with
b = 32 on 64 nodes, AlexNet). Here: the small AlexNet (`models.alexnet`) on synthetic
3x32x32 inputs, N = 1, 2, 4 local gloo ranks with one torch thread each, wrapped in
`approxdist.DataParallel` (algorithm `auto`, overlap on) for N > 1; a step's time is
the slowest rank's, the figure is the median over the timed steps.
CSV `scaling.csv`: nodes, per_node_batch, ref_batch, median_step_s, p10_step_s, steps,
speedup, ideal (= N x b/B x t(1,B)/t(1,b) would be the compute-only bound; we store N).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F  # noqa: N812

from approxdist.bench.stats import p10
from approxdist.comm.collectives.model import DEFAULT
from approxdist.config.schema import ModelConfig
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.base import Meta, Preset, Settings, cores_of
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row, group
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.profile import read_profile, write_profile
from approxdist.planner.profiler import profile_model
from approxdist.planner.scaling import Input, ScalingModel

NAME = "seed001-scaling"
PROFILE = "profile.json"  # the model's blocks at the reference batch (planner profile file)
SHAPE = (3, 32, 32)
CLASSES = 10
COLUMNS = ("nodes", "per_node_batch", "ref_batch", "median_step_s", "p10_step_s", "steps",
           "speedup", "ideal")
SCALING_CSV = CsvFile("scaling.csv", COLUMNS)
SEED_POINTS = {256: [(64, 60.4), (256, 217.0)], 64: [(64, 30.5)], 32: [(64, 15.5)]}


@dataclass(frozen=True)
class StepPlan:
    """What every rank times: `steps` cycles after `warmup`, per-node batch `batch`."""

    model: str
    batch: int
    steps: int
    warmup: int


def time_rank(ctx: DistContext, plan: StepPlan) -> list[float]:
    """This rank's view of each timed step's duration (the max over ranks, all-reduced)."""
    from approxdist.data_parallel import DataParallel

    torch.manual_seed(0)
    model = build_model(ModelConfig(name=plan.model), SHAPE, CLASSES)
    wrapped = DataParallel(model, ctx=ctx) if ctx.world_size > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + ctx.rank)
    x = torch.randn(plan.batch, *SHAPE, generator=gen)
    y = torch.randint(0, CLASSES, (plan.batch,), generator=gen)
    times = []
    try:
        for i in range(plan.warmup + plan.steps):
            if ctx.world_size > 1:
                dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(wrapped(x), y).backward()
            opt.step()
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            if ctx.world_size > 1:
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i >= plan.warmup:
                times.append(float(took))
    finally:
        if isinstance(wrapped, DataParallel):
            wrapped.close()
    return times


def grid(settings: Settings) -> tuple[int, list[int], int, int]:
    """(reference batch B, per-node batches b, timed steps, warm-up steps) for this size."""
    return settings.pick((8, [8, 2], 2, 1), (32, [32, 8], 3, 1), (64, [64, 16], 10, 2))


def collect(settings: Settings) -> Meta:
    ref, batches, steps, warmup = grid(settings)
    measured: dict[tuple[int, int], list[float]] = {}
    for b in sorted({ref, *batches}, reverse=True):
        for n in (1, 2, 4):
            if n == 1 or b in batches:
                print(f"[{NAME}] N={n}, per-node batch {b}", flush=True)
                plan = StepPlan("alexnet", b, steps, warmup)
                measured[(n, b)] = run_on_ranks(time_rank, n, plan, timeout_s=1800)[0]
    t_ref = statistics.median(measured[(1, ref)])
    rows = []
    for (n, b), ts in sorted(measured.items()):
        med = statistics.median(ts)
        rows.append({"nodes": n, "per_node_batch": b, "ref_batch": ref, "median_step_s": med,
                     "p10_step_s": p10(ts), "steps": len(ts),
                     "speedup": speedup(t_ref, med, n, b, ref), "ideal": n})
    SCALING_CSV.write(settings.out, rows)
    _write_profile(settings.out, ref)
    return {"model": "alexnet", "input_shape": list(SHAPE), "ref_batch": ref}


def _write_profile(out: Path, batch: int) -> None:
    """The model's block profile at the reference batch, one torch thread (as the runs)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="alexnet"), SHAPE, CLASSES)
    sample = torch.randn(batch, *SHAPE, generator=torch.Generator().manual_seed(1))
    write_profile(profile_model(model, sample, "alexnet", threads=1), out / PROFILE)


def simulated(out: Path, cores: int) -> ScalingModel | None:
    """The cost model's s(N,b) for this run (planner.scaling): compute from the run's own
    profile (measured), the all-reduce over loopback with the collectives' default
    alpha-beta (assumed, with the usual bands); ranks beyond this machine's `cores` share
    them (the cost model slows their compute by ranks / cores)."""
    path = out / PROFILE
    if not path.is_file():
        return None
    level = LinkLevel("loopback", DEFAULT.alpha_s, DEFAULT.beta_s_per_byte, 0.0,
                      cores=max(1, cores))
    return ScalingModel(read_profile(path), level,
                        Input("compute_scale", 1.0, 1.0, 1.0, "measured", "this run's profile"),
                        Input("batch_exponent", 1.0, 0.8, 1.0, "assumed", "compute ~ (b/B)^e"),
                        Input("bandwidth_scale", 1.0, 0.25, 1.0, "assumed",
                              "share of loopback the all-reduce gets"),
                        Input("gamma", 2.5e-10, 1e-10, 1e-9, "assumed",
                              "seconds per fp32 byte summed"))


def speedup(t_ref: float, t: float, nodes: int, batch: int, ref_batch: int) -> float:
    """Seed 001 eq. (1): s(N,b) = t(1,B) / t(N,b) * b/B * N."""
    return t_ref / t * batch / ref_batch * nodes


def plot(out: Path, rows: list[Row], title: str, cores: int = 0,
         sim: ScalingModel | None = None) -> str:
    fig, (ax, ax_seed) = plots.figure(2)
    top = max(int(r["nodes"]) for r in rows)
    ax.plot([1, top], [1, top], color="0.6", linestyle=":", label="ideal (s = N)")
    for (b,), rs in sorted(group(rows, "per_node_batch").items(), reverse=True):
        rs = sorted(rs, key=lambda r: r["nodes"])
        line = ax.plot([r["nodes"] for r in rs], [r["speedup"] for r in rs], marker="o",
                       label=f"b = {int(b)} per node (B = {int(rs[0]['ref_batch'])})")[0]
        if sim is not None:
            ns = [int(r["nodes"]) for r in rs]
            bands = [sim.band(n, int(b)) for n in ns]
            ax.plot(ns, [sim.speedup(n, int(b)) for n in ns], linestyle="--",
                    color=line.get_color(), label=f"b = {int(b)}: cost model")
            ax.fill_between(ns, [lo for lo, _ in bands], [hi for _, hi in bands],
                            color=line.get_color(), alpha=0.15)
    ax.set_xticks([1, 2, 4])
    plots.label(ax, f"nodes N (local gloo ranks, 1 thread each, {cores or '?'} cores)",
                "speed-up s(N,b)",
                "ours: small AlexNet, synthetic 3x32x32")
    ax_seed.plot([1, 256], [1, 256], color="0.6", linestyle=":", label="ideal (s = N)")
    for b, pts in SEED_POINTS.items():
        ax_seed.plot([n for n, _ in pts], [s for _, s in pts], marker="s", linestyle="none",
                     label=f"seed 001, b = {b} (B = 256)")
    ax_seed.set_xscale("log", base=2)
    ax_seed.set_yscale("log", base=2)
    plots.label(ax_seed, "nodes N (GPUs, InfiniBand)", "speed-up s(N,b)",
                "seed 001 (AlexNet, ImageNet), quoted points")
    plots.save(fig, out / "scaling_speedup.png", title)
    return "scaling_speedup.png"


def result_table(rows: list[Row]) -> str:
    seed = {(n, b): s for b, pts in SEED_POINTS.items() for n, s in pts}
    out = [(int(r["nodes"]), int(r["per_node_batch"]), f"{1e3 * r['median_step_s']:.1f}",
            f"{r['speedup']:.2f}", f"{100 * r['speedup'] / r['nodes']:.0f} %")
           for r in sorted(rows, key=lambda r: (-r["per_node_batch"], r["nodes"]))]
    quoted = ", ".join(f"s({n},{b}) = {s}" for (n, b), s in seed.items())
    return md.table(("N", "b per node", "median step ms", "speed-up s(N,b)", "s / N"), out) + \
        f"\n\nSeed 001 (quoted, B = 256): {quoted}."


def _s(rows: list[Row], n: int, b: float) -> float:
    return next((float(r["speedup"]) for r in rows
                 if r["nodes"] == n and r["per_node_batch"] == b), float("nan"))


def _simulation_trend(rows: list[Row], sim: ScalingModel, cores: int) -> md.Trend:
    """The cost model's s(N,b) (`approxdist simulate`) against the measured points."""
    parts, worst, crowded = [], 0.0, []
    for r in sorted(rows, key=lambda r: (r["per_node_batch"], r["nodes"])):
        n, b = int(r["nodes"]), int(r["per_node_batch"])
        if n == 1:
            continue
        pred, (lo, hi) = sim.speedup(n, b), sim.band(n, b)
        err = pred / float(r["speedup"]) - 1
        worst = max(worst, abs(err))
        parts.append(f"N={n} b={b}: {float(r['speedup']):.2f} measured, {pred:.2f} simulated "
                     f"[{lo:.2f}, {hi:.2f}] ({100 * err:+.0f} %)")
        if cores and n > cores and abs(err) > 0.25:
            crowded.append(n)
    ok = worst <= 0.25
    why = ("compute from this run's own block profile (measured), the all-reduce over "
           "loopback with the collectives' default alpha-beta (assumed); the criterion is "
           "25 %")
    if crowded:
        why += (f"; at N = {', '.join(map(str, sorted(set(crowded))))} the ranks share "
                f"{cores} core(s): the cost model slows every rank's compute and all-reduce by "
                f"ranks / cores, as if the cores were shared evenly the whole step, which this "
                f"run's measurement does not bear out there")
    return ("(not in the seed) the cost model's prediction (`approxdist simulate`) matches the "
            "measured speed-ups at N <= 4", "; ".join(parts), ok, why)


def trend_rows(rows: list[Row], cores: int = 0, grad_bytes: int = 0,
               sim: ScalingModel | None = None) -> list[md.Trend]:
    big = max(r["per_node_batch"] for r in rows)
    small = min(r["per_node_batch"] for r in rows)
    s2, s4 = _s(rows, 2, big), _s(rows, 4, big)
    ok2, ok4 = s2 >= 1.5, s4 > s2
    machine = f"{cores} core(s)" if cores else "an unknown number of cores"
    grads = f"{grad_bytes / 2**20:.1f} MiB of gradients" if grad_bytes else "the gradients"
    out: list[md.Trend] = [
        ("large per-node batch: speed-up close to N (217 on 256 nodes, 85 %)",
         f"s(2,{int(big)}) = {s2:.2f} ({50 * s2:.0f} % of 2)", ok2,
         md.why(ok2, "the all-reduce of the gradients hides behind backward",
                f"a hypothesis: 2 ranks on {machine} leave the communication threads and gloo "
                f"competing with compute, and the per-node batch of {int(big)} is small next "
                f"to {grads} exchanged per step")),
        ("speed-up keeps growing with N", f"s(4,{int(big)}) = {s4:.2f} vs s(2,{int(big)}) = "
         f"{s2:.2f}", ok4,
         md.why(ok4, "", f"4 ranks on {machine}: the cores, not the network, bound s(4,b) by "
                f"about {cores}" if cores and cores < 4 else
                "a hypothesis: the ranks' compute and the all-reduce compete for the cores")),
    ]
    if sim is not None:
        out.append(_simulation_trend(rows, sim, cores))
    if small != big:
        s2s = _s(rows, 2, small)
        ok = s2s < s2
        out.append(("smaller per-node batch scales worse (b = 64: 30.5 vs 60.4 on 64 nodes)",
                    f"s(2,{int(small)}) = {s2s:.2f} vs s(2,{int(big)}) = {s2:.2f}", ok,
                    md.why(ok, "communication per step is fixed while compute shrinks with b",
                           "machine noise between the runs exceeds the effect")))
    return out


def _grad_bytes(meta: Meta) -> int:
    """Bytes of the model's gradients (fp32), from the model the run used."""
    model = build_model(ModelConfig(name=str(meta["model"])), tuple(meta["input_shape"]), CLASSES)
    return sum(p.nelement() * 4 for p in model.parameters())


def render(out: Path, meta: Meta) -> str:
    rows = SCALING_CSV.read(out)
    title = (f"{NAME}: s(N,b) = t(1,B)/t(N,b) x b/B x N, {meta['model']} on synthetic "
             f"{'x'.join(map(str, meta['input_shape']))}, B = {meta['ref_batch']}")
    png = plot(out, rows, title, cores_of(meta), simulated(out, cores_of(meta)))
    return md.report(
        ["t(N,b): median over timed steps of the slowest rank's forward + backward + SGD "
         "update; N > 1 through `approxdist.DataParallel` (auto all-reduce, overlapped with "
         "backward).", result_table(rows)],
        [md.image(png, "speed-up vs nodes, ours and the seed's")],
        trend_rows(rows, cores_of(meta), _grad_bytes(meta), simulated(out, cores_of(meta))),
        "Seed 001 measured AlexNet on ImageNet with one GPU per node over InfiniBand (B = 256); "
        f"here N processes share this machine's {cores_of(meta) or '?'} core(s), the model is "
        f"a small AlexNet on 32x32 inputs and B is {meta['ref_batch']} to keep a step "
        f"affordable on a CPU.")


PRESET = Preset(listing(NAME), files=(SCALING_CSV,), collect=collect, render=render)
