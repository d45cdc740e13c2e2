"""`seed002-hybrid`: where hybrid pipeline x data-parallel runs lose time, seed 002 (PipeDream).

Seed 002 traced PipeDream on 4-32 GPUs and found compute idle while waiting for
transfers, a stage fed by three replicas congested by its nine communication threads,
and fewer, better-ordered threads (impl-SA, impl-SRA) shortening AlexNet's training by up
to 16 % while evenly replicated ResNet-50 gained nothing. Here 4 ranks train an
AlexNet-like CNN and ResNet-20 on synthetic 3x32x32 images as pure data parallelism, a
straight 4-stage pipeline, the 3+1 plan (stage 0 on 3 ranks feeding stage 1 on one, the
AlexNet split of seed 002: convolutions | fully-connected layers) and an evenly
replicated 2x2, each pipeline with every communication-thread strategy
(`--comm-threads`: inline, per-message = PipeDream's handler, sa, sra), 1F1B with flush,
8 micro-batches, traced; every run is repeated (quick 3, full 5 times), the strategies
interleaved within each repeat so that load drifting over the run hits them alike.
CSV `hybrid.csv`, one row per (model, plan, threads, repeat): model, plan, threads,
repeat, stages, replicas, step_ms (the slowest rank's traced step, warm-up skipped),
compute, comm, waiting, bubble (fractions of the step, mean over ranks), congested_rank,
congested_stage, congested_wait_ms (per step: the rank that waited longest on links in
flight, `approxdist analyze`), stage_wait_ms and stage_compute_ms (each stage's mean
waiting and computing per step, ";"-separated), host_steal (share of CPU time the
hypervisor took during the run; -1 where unknown). The report shows the
median over repeats and compares strategies by paired ratios (same repeat).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from approxdist.analysis import analyze, congestion
from approxdist.bench.host import HostWatch
from approxdist.bench.stats import median, paired_ratio
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.base import Meta, Preset, Settings, cores_of
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row, group
from approxdist.experiments.runs import train_run
from approxdist.trace.gather import load_run_trace

NAME = "seed002-hybrid"
THREADS = ("inline", "per-message", "sa", "sra")
#: plan -> (parallel mode, stages, replicas per stage, split by model)
PLANS: dict[str, tuple[str, int, tuple[int, ...], dict[str, str]]] = {
    "dp": ("dp", 1, (4,), {}),
    "pipeline": ("pipeline", 4, (1, 1, 1, 1), {"alexnet": "2,4,6", "resnet20": "3,6,9",
                                               "mlp": "1,2,3"}),
    "3+1": ("hybrid", 2, (3, 1), {"alexnet": "5", "resnet20": "8", "mlp": "3"}),
    "2x2": ("hybrid", 2, (2, 2), {"alexnet": "5", "resnet20": "6", "mlp": "2"}),
}
COLUMNS = ("model", "plan", "threads", "repeat", "stages", "replicas", "step_ms", "compute",
           "comm", "waiting", "bubble", "congested_rank", "congested_stage",
           "congested_wait_ms", "stage_wait_ms", "stage_compute_ms", "host_steal")
HYBRID_CSV = CsvFile("hybrid.csv", COLUMNS)
#: columns averaged by their median over repeats in the report
NUMERIC = ("step_ms", "compute", "comm", "waiting", "bubble", "congested_wait_ms", "host_steal")
SKIP = 2  # traced steps per rank left out as warm-up


def models(settings: Settings) -> list[str]:
    return settings.pick(["mlp"], ["alexnet", "resnet20"], ["alexnet", "resnet20"])


def runs(settings: Settings) -> list[tuple[str, str]]:
    """(plan, threads) pairs: every plan with every strategy; smoke: 3+1 inline and sa."""
    if settings.size == "smoke":
        return [("3+1", "inline"), ("3+1", "sa")]
    return [(plan, threads) for plan, (mode, *_) in PLANS.items()
            for threads in (("inline",) if mode == "dp" else THREADS)]


def repeats(settings: Settings) -> int:
    return settings.pick(1, 3, 5)


def _sections(settings: Settings, model: str, plan: str, threads: str) -> dict[str, Any]:
    mode, stages, replicas, splits = PLANS[plan]
    steps = settings.pick(4, 10, 16)
    batch = settings.pick(32, 64, 64)
    sections: dict[str, Any] = {
        "train": {"parallel": mode, "world_size": 4, "epochs": 1, "seed": 0, "trace": True,
                  "progress": False},
        "data": {"dataset": "synthetic", "synthetic_shape": [3, 32, 32] if model != "mlp"
                 else [64], "synthetic_samples": steps * batch + 64, "batch_size": batch,
                 "test_batch_size": 64, "augment": False},
        "model": {"name": model, "hidden": 128},
        "optim": {"lr": 0.02, "schedule": "constant"}}
    if mode != "dp":
        sections["pipeline"] = {"stages": stages, "split": splits[model], "schedule": "1f1b",
                                "microbatches": 8, "comm_threads": threads,
                                **({"replicas": list(replicas)} if mode == "hybrid" else {})}
    return sections


def collect(settings: Settings) -> Meta:
    """One traced run per (model, plan, threads) and repeat; write hybrid.csv."""
    rows = []
    for repeat in range(repeats(settings)):
        for model in models(settings):
            for plan, threads in runs(settings):
                _, stages, replicas, _ = PLANS[plan]
                print(f"[{NAME}] repeat {repeat + 1}/{repeats(settings)}: {model}, {plan}, "
                      f"threads {threads}", flush=True)
                name = f"{model}-{plan.replace('+', 'p')}-{threads}-r{repeat}"
                run_dir = settings.out / "runs" / name
                with HostWatch() as host:
                    train_run(_sections(settings, model, plan, threads), run_dir)
                rows.append({**_row(run_dir, model, plan, threads, stages, replicas),
                             "repeat": repeat,
                             "host_steal": -1.0 if host.steal is None else host.steal})
    HYBRID_CSV.write(settings.out, rows)
    return {"models": models(settings), "plans": list(PLANS), "threads": list(THREADS),
            "skip_steps": SKIP, "repeats": repeats(settings)}


def _row(run_dir: Path, model: str, plan: str, threads: str, stages: int,
         replicas: tuple[int, ...]) -> Row:
    result = analyze(load_run_trace(run_dir), skip=SKIP)
    ranks = sorted(result.ranks, key=lambda r: r.rank)
    per_step = {r.rank: r.window_s / max(1, r.steps) for r in ranks}
    c = congestion(result) or {"rank": -1, "waited_s": 0.0}
    steps = {r.rank: max(1, r.steps) for r in ranks}
    stage_of = [s for s, n in enumerate(replicas) for _ in range(n)]
    def per_stage(part: str) -> str:
        means = []
        for s in range(stages):
            mine = [r for r in ranks if stage_of[r.rank] == s]
            means.append(sum(getattr(r, part) * per_step[r.rank] for r in mine) / max(1, len(mine)))
        return ";".join(f"{1e3 * m:.2f}" for m in means)

    mean = {k: sum(getattr(r, k) for r in ranks) / len(ranks)
            for k in ("compute", "comm", "waiting", "bubble")}
    rank = int(c["rank"])
    return {"model": model, "plan": plan, "threads": threads, "stages": stages,
            "replicas": ",".join(map(str, replicas)), "step_ms": 1e3 * max(per_step.values()),
            **mean, "congested_rank": rank, "congested_stage": stage_of[rank] if rank >= 0 else -1,
            "congested_wait_ms": 1e3 * c["waited_s"] / steps.get(rank, 1),
            "stage_wait_ms": per_stage("waiting"), "stage_compute_ms": per_stage("compute")}


def summarize(rows: list[Row]) -> list[Row]:
    """One row per (model, plan, threads): medians over repeats (per stage too), the most
    frequent congested rank, and `spread`: (max - min) / median of the step times."""
    out = []
    for (model, plan, threads), mine in group(rows, "model", "plan", "threads").items():
        steps = [float(r["step_ms"]) for r in mine]
        where = Counter((int(float(r["congested_rank"])), int(float(r["congested_stage"])))
                        for r in mine).most_common(1)[0][0]
        row: Row = {"model": model, "plan": plan, "threads": threads, "repeats": len(mine),
                    "stages": mine[0]["stages"], "replicas": mine[0]["replicas"],
                    **{k: median([float(r[k]) for r in mine]) for k in NUMERIC},
                    "congested_rank": where[0], "congested_stage": where[1],
                    "spread": (max(steps) - min(steps)) / median(steps) if median(steps) else 0.0}
        for key in ("stage_wait_ms", "stage_compute_ms"):
            per = [_ms(r[key]) for r in mine]
            row[key] = ";".join(f"{median(list(v)):.2f}" for v in zip(*per))
        out.append(row)
    return out


def _pick(rows: list[Row], model: str, plan: str, threads: str) -> Row | None:
    return next((r for r in rows if r["model"] == model and r["plan"] == plan
                 and r["threads"] == threads), None)


def _change(rows: list[Row], model: str, plan: str, base: str, key: str) -> tuple[str, float]:
    """Of sa and sra, the strategy with the lowest paired ratio of `key` to `base` (the
    median over repeats of the two runs' ratio in the same repeat), and that ratio - 1."""
    runs_ = {t: {int(float(r["repeat"])): float(r[key]) for r in rows if r["model"] == model
                 and r["plan"] == plan and r["threads"] == t} for t in ("sa", "sra", base)}
    best, change = "-", math.nan
    for name in ("sa", "sra"):
        both = [rep for rep in runs_[name] if runs_[base].get(rep, 0.0) > 0]
        if not both:
            continue
        ratio = paired_ratio([runs_[name][rep] for rep in both], [runs_[base][rep] for rep in both])
        if math.isnan(change) or ratio - 1.0 < change:
            best, change = name, ratio - 1.0
    return best, change


def _ms(cell: Any) -> list[float]:
    return [float(x) for x in str(cell).split(";")]


def trend_rows(rows: list[Row], model_a: str, model_r: str) -> list[md.Trend]:
    """The verdicts; `rows` are the CSV's rows (every repeat)."""
    out: list[md.Trend] = []
    summary = summarize(rows)
    staged = [r for r in summary if r["plan"] != "dp" and r["threads"] == "inline"]
    if staged:
        idle = [float(r["waiting"]) + float(r["bubble"]) for r in staged]
        share = sum(idle) / len(idle)
        out.append(("compute stands idle while ranks wait for transfers (seed 002's timelines)",
                    f"pipelines and hybrids ({len(staged)} run{'s' * (len(staged) > 1)}, inline "
                    f"threads): mean share of the step spent waiting on links or idle in the "
                    f"bubble, {md.pct(share)}", share >= 0.2,
                    "measured from the traces (`approxdist analyze`); the criterion is a "
                    "fifth of the step or more"))
    three = _pick(summary, model_a, "3+1", "inline")
    if three is not None:
        out.append(_congested_trend(three))
    for model, plan, claim, expect in (
            (model_a, "3+1", "fewer communication threads (impl-SA / SRA) shorten the step "
                             "(AlexNet: up to 16 % shorter training)", "gain"),
            (model_r, "2x2", "evenly replicated stages gain nothing from fewer threads "
                             "(ResNet-50: no gain)", "none")):
        name, change = _change(rows, model, plan, "per-message", "step_ms")
        base = _pick(summary, model, plan, "per-message")
        if math.isnan(change) or base is None:
            continue
        ok = change < -0.02 if expect == "gain" else abs(change) <= 0.05
        wait_name, wait = _change(rows, model, plan, "per-message", "congested_wait_ms")
        out.append((claim, f"{model} {plan}: best of sa / sra ({name}) {100 * change:+.1f} % step "
                    f"time vs per-message (PipeDream's handler), paired over "
                    f"{base['repeats']} repeat(s); congested rank's waiting on links "
                    f"{100 * wait:+.1f} % ({wait_name})", ok, _thread_comment(base, expect, ok)))
    return out


def _thread_comment(base: Row, expect: str, ok: bool) -> str:
    """Why the strategies could or could not move the step, from the run's own figures."""
    criterion = ("the criterion is 2 % shorter" if expect == "gain" else
                 "the criterion is within 5 %")
    spread = (f"per-message's step varied by {md.pct(float(base['spread']))} (max - min over "
              f"median) across repeats" if int(base["repeats"]) > 1 else "one repeat")
    text = f"{criterion}; {spread}"
    if expect == "gain" and not ok:
        wait, step = float(base["congested_wait_ms"]), float(base["step_ms"])
        text += (f"; the most a strategy can save is what the congested rank waits on links "
                 f"in flight: {wait:.1f} ms of a {step:.1f} ms step "
                 f"({md.pct(wait / step if step else 0.0)}) with per-message")
    return text


def _congested_trend(row: Row) -> md.Trend:
    """Seed 002: in AlexNet 3+1 the stage receiving from three replicas is congested."""
    stage = int(float(row["congested_stage"]))
    waits, computes = _ms(row["stage_wait_ms"]), _ms(row["stage_compute_ms"])
    ours = (f"congested: rank {int(float(row['congested_rank']))} (stage {stage}), waiting "
            f"{float(row['congested_wait_ms']):.1f} ms per step on links in flight; waiting "
            f"per stage {' / '.join(f'{w:.1f}' for w in waits)} ms, computing "
            f"{' / '.join(f'{c:.1f}' for c in computes)} ms")
    if stage == 1 and computes[1] < computes[0]:
        why = (f"the single stage-1 rank receives every activation from three replicas; "
               f"it computes {computes[1]:.1f} ms per step against {computes[0]:.1f} ms on "
               f"each replica, so much of its waiting is for the replicas' compute rather "
               f"than for the wire")
    elif stage == 1:
        why = (f"the single stage-1 rank receives every activation from three replicas and "
               f"computes the most ({computes[1]:.1f} vs {computes[0]:.1f} ms per step)")
    elif computes[1] > computes[0]:
        why = (f"stage 1 computes {computes[1]:.1f} ms per step against {computes[0]:.1f} ms "
               f"on each stage-0 replica (it runs every micro-batch of the three replicas): "
               f"it is the compute bottleneck here, and the replicas wait for it")
    else:
        why = (f"stage {stage} waited most although stage 1 computes no more "
               f"({computes[1]:.1f} vs {computes[0]:.1f} ms per step); a hypothesis: where "
               f"fewer cores than ranks serve the four ranks, a rank waits for its peers' "
               f"compute as much as for the wire")
    return ("the stage fed by three replicas is the congested one (AlexNet 3+1)", ours,
            stage == 1, why)


def _where(row: Row) -> str:
    return f"{int(float(row['congested_rank']))} ({int(float(row['congested_stage']))})"


def result_table(rows: list[Row]) -> str:
    """`rows`: the summary (`summarize`)."""
    return md.table(
        ("model", "plan", "threads", "ms / step", "spread", "compute", "comm", "waiting",
         "bubble", "congested rank (stage)", "its waiting ms / step",
         "waiting ms / step per stage"),
        [(r["model"], r["plan"], r["threads"], f"{float(r['step_ms']):.1f}",
          md.pct(float(r["spread"])), md.pct(float(r["compute"])), md.pct(float(r["comm"])),
          md.pct(float(r["waiting"])),
          md.pct(float(r["bubble"])), _where(r),
          f"{float(r['congested_wait_ms']):.1f}", str(r["stage_wait_ms"]).replace(";", " / "))
         for r in rows])


def plot(out: Path, rows: list[Row], title: str) -> str:
    models_ = list(dict.fromkeys(str(r["model"]) for r in rows))
    fig, axes = plots.figure(len(models_))
    for ax, model in zip(axes, models_):
        mine = [r for r in rows if r["model"] == model]
        xs = list(range(len(mine)))
        parts = ("compute", "comm", "waiting", "bubble")
        bottom = [0.0] * len(mine)
        for part in parts:
            ms = [float(r["step_ms"]) * float(r[part]) for r in mine]
            ax.bar(xs, ms, bottom=bottom, label=part)
            bottom = [b + m for b, m in zip(bottom, ms)]
        ax.set_xticks(xs, [f"{r['plan']}\n{r['threads']}" for r in mine], fontsize=6, rotation=90)
        plots.label(ax, "plan, communication threads", "ms per step (mean split over ranks)",
                    model)
    plots.save(fig, out / "hybrid_breakdown.png", title)
    return "hybrid_breakdown.png"


def render(out: Path, meta: Meta) -> str:
    rows = HYBRID_CSV.read(out)
    names = list(dict.fromkeys(str(r["model"]) for r in rows))
    model_a = "alexnet" if "alexnet" in names else names[0]
    model_r = "resnet20" if "resnet20" in names else names[-1]
    title = f"{NAME}: 4 ranks, 1F1B with flush, 8 micro-batches, synthetic images"
    summary = summarize(rows)
    png = plot(out, summary, title)
    steal = [float(r["host_steal"]) for r in rows if float(r["host_steal"]) >= 0]
    steal_text = (f" The hypervisor took {md.pct(median(steal))} of the CPU time in the "
                  f"median run (most {md.pct(max(steal))})." if steal else "")
    return md.report(
        [f"Per (model, plan, strategy), the median over {meta.get('repeats', 1)} repeat(s) of "
         f"one traced epoch (the first {meta.get('skip_steps', SKIP)} steps of each rank left "
         f"out): the slowest rank's step and its spread over repeats ((max - min) / median), "
         f"the mean split of the step over ranks, and the congested rank (`approxdist "
         f"analyze`).{steal_text}", result_table(summary)],
        [md.image(png, "time per step, split by phase, per plan and thread strategy")],
        trend_rows(rows, model_a, model_r),
        "Seed 002 ran PipeDream (asynchronous 1F1B, GPUs, one CUDA stream per communication "
        "thread) on 4-32 GPUs with AlexNet batch 256 and ResNet-50; here 4 CPU ranks share "
        f"{cores_of(meta) or '?'} core(s) over loopback gloo, the schedule is 1F1B with a "
        "flush, and the batches are small. Thread strategies differ here in who posts each "
        "non-blocking gloo request and waits for it, not in GPU streams.")


PRESET = Preset(listing(NAME), files=(HYBRID_CSV,), collect=collect, render=render)
