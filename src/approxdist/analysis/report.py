"""What `approxdist analyze` prints: the run's context and the bottleneck tables.

`RunInfo.load(run_dir, trace)` reads the run's context: the pipeline shape from
`config.toml` (stages, micro-batches, schedule; else from `otherData.ranks[*].pipeline`
in the trace), the last epoch record of `metrics.jsonl` and each rank's clock;
`format_report` renders an `Analysis` with it as plain text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from approxdist.analysis.bottleneck import Analysis, RankFigures
from approxdist.pipeline.schedule import async_schedule_names


@dataclass(frozen=True)
class RunInfo:
    """Pipeline shape (when a pipeline run), last epoch metrics, clock of each rank."""

    stages: int | None = None
    microbatches: int | None = None
    schedule: str = ""
    epoch: dict[str, Any] = field(default_factory=dict)
    clocks: dict[str, Any] = field(default_factory=dict)
    replicated: bool = False  # some stage runs on several ranks (hybrid)
    #: `train.parallel` and `dp.algorithm` of the run's config.toml ("" when unknown)
    parallel: str = ""
    algorithm: str = ""

    @staticmethod
    def load(run_dir: str | Path, trace: dict[str, Any]) -> RunInfo:
        run_dir = Path(run_dir)
        stages = microbatches = None
        schedule = parallel = algorithm = ""
        if (run_dir / "config.toml").is_file():
            from approxdist.config.loader import read_toml

            cfg = read_toml(run_dir / "config.toml")
            pipe = cfg.get("pipeline", {})
            parallel = str(cfg.get("train", {}).get("parallel", ""))
            algorithm = str(cfg.get("dp", {}).get("algorithm", ""))
            if parallel == "pipeline":
                stages, microbatches = pipe.get("stages"), pipe.get("microbatches")
                schedule = str(pipe.get("schedule", ""))
        ranks = trace.get("otherData", {}).get("ranks", {})
        recorded: dict[str, Any] = next(
            (info["pipeline"] for info in ranks.values() if "pipeline" in info), {})
        if stages is None and recorded:  # the engine recorded its shape in the trace
            stages, microbatches = recorded.get("stages"), recorded.get("microbatches")
            schedule = str(recorded.get("schedule", ""))
        epochs = [r for r in _records(run_dir / "metrics.jsonl") if r.get("kind") == "epoch"]
        clocks = {r: info.get("clock", {}) for r, info in ranks.items()}
        replicated = max(recorded.get("replicas", [1]) or [1]) > 1
        return RunInfo(stages, microbatches, schedule, epochs[-1] if epochs else {}, clocks,
                       replicated, parallel, algorithm)


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rank_table(ranks: list[RankFigures]) -> list[str]:
    lines = ["per rank (fractions of its traced step window; they sum to 1)",
             f"{'rank':>4} {'steps':>5} {'window ms':>10} {'compute':>8} {'comm':>7} "
             f"{'waiting':>8} {'bubble':>7} {'busy/step ms':>13}"]
    for f in ranks:
        lines.append(f"{f.rank:>4} {f.steps:>5} {f.window_s * 1e3:>10.2f} {f.compute:>8.3f} "
                     f"{f.comm:>7.3f} {f.waiting:>8.3f} {f.bubble:>7.3f} "
                     f"{f.busy_per_step_s * 1e3:>13.3f}")
    return lines


def no_links(info: RunInfo) -> str:
    """Why a trace holds no transfer events, and what a user can run to see them."""
    if info.parallel in ("dp", "hybrid"):
        chose = f"--algorithm {info.algorithm}" if info.algorithm not in ("", "auto") else \
            "which --algorithm auto chose for these sizes"
        return (f"per link: no transfer events: the gradients' all-reduce ran inside "
                f"torch.distributed (`native`, {chose}), where the trace cannot see each "
                f"transfer; to see them, train again with --algorithm ring (or brd, vhd, brb; "
                f"docs/collectives.md)")
    if info.parallel == "single":
        return "per link: no transfer events: a single process sends nothing"
    return "per link: no transfer events in this trace"


def _link_table(analysis: Analysis, info: RunInfo) -> list[str]:
    if not analysis.links:
        return [no_links(info)]
    lines = ["per link and direction (transfer time = union of in-flight intervals)",
             f"{'link':>6} {'messages':>8} {'bytes':>12} {'time ms':>9} {'MB/s':>9} {'matched':>7}"]
    for k in analysis.links:
        lines.append(f"{k.src:>3}->{k.dst:<2} {k.messages:>8} {k.nbytes:>12,} "
                     f"{k.time_s * 1e3:>9.3f} {k.bandwidth_bps / 1e6:>9.2f} "
                     f"{'yes' if k.matched else 'no':>7}")
    return lines


def _top(items: dict[str, float], n: int = 3) -> str:
    best = sorted(((v, k) for k, v in items.items() if v > 0), reverse=True)[:n]
    return ", ".join(f"{k} {v * 1e3:.2f} ms" for v, k in best) or "nothing"


def _slowest(analysis: Analysis) -> list[str]:
    if analysis.slowest is None:
        return []
    f = next(r for r in analysis.ranks if r.rank == analysis.slowest)
    lines = [f"slowest stage: rank {f.rank}, busy {f.busy_per_step_s * 1e3:.3f} ms per step "
             f"(compute {f.compute:.1%}, comm {f.comm:.1%}, waiting {f.waiting:.1%}, "
             f"bubble {f.bubble:.1%})",
             f"  idle in: {_top(f.stalls)}",
             f"  links in flight while it waited: {_top(f.waits_on)}"]
    c = congestion(analysis)
    if c is not None:
        lines.append(f"congested: rank {c['rank']} waited {c['waited_s'] * 1e3:.2f} ms on links "
                     f"in flight, most on {c['link']} ({c['link_s'] * 1e3:.2f} ms)")
    return lines


def congestion(analysis: Analysis) -> dict[str, Any] | None:
    """The rank that waited longest on links in flight, and the link it waited on most
    (seed 002's congested stage: one fed by several replicas); None without waits."""
    waiting = [(sum(r.waits_on.values()), r) for r in analysis.ranks if r.waits_on]
    if not waiting:
        return None
    total, rank = max(waiting, key=lambda w: (w[0], -w[1].rank))
    if total <= 0:
        return None
    link, seconds = max(rank.waits_on.items(), key=lambda kv: kv[1])
    return {"rank": rank.rank, "waited_s": total, "link": link, "link_s": seconds}


def _bubble(analysis: Analysis, info: RunInfo) -> list[str]:
    b = analysis.bubble
    if b is None:
        return []
    p, m = b.stages, b.microbatches
    measured = f"measured bubble {b.measured:.3f} (mean over ranks); not computing {b.idle:.3f}"
    epochs, steps = int(info.epoch.get("epoch", 0)), int(info.epoch.get("step", 0))
    if info.schedule in async_schedule_names() and epochs and steps:
        k = steps // epochs  # an asynchronous schedule streams each epoch's mini-batches
        return [f"pipeline bubble ({info.schedule}, P={p}, M={m}, a stream of K={k} "
                f"mini-batches per epoch): theory (P-1)/(K*M+P-1) = {p - 1}/{k * m + p - 1} = "
                f"{(p - 1) / (k * m + p - 1):.3f} (a flush per mini-batch: {b.theory:.3f})"
                + ("; with one rank per stage: replicated stages step in lockstep and remove "
                   "less (docs/pipeline.md)" if info.replicated else "") + f"; {measured}"]
    return [f"pipeline bubble ({info.schedule or 'pipeline'}, P={p}, M={m}): theory "
            f"(P-1)/(M+P-1) = {p - 1}/{m + p - 1} = {b.theory:.3f}; {measured}"]


def _metrics(info: RunInfo) -> list[str]:
    e = info.epoch
    if not e:
        return []
    sent = ", ".join(f"{k} {v:,}" for k, v in sorted(e.get("bytes_sent", {}).items()))
    step = e.get("step_time_s")
    step_text = f"{step * 1e3:.2f} ms" if isinstance(step, (int, float)) else "not recorded"
    return [f"metrics.jsonl, epoch {e.get('epoch')}: step {step_text}, "
            f"{e.get('samples_per_s', 0):.0f} samples/s; bytes sent per epoch: {sent or 'none'}"]


def format_report(analysis: Analysis, info: RunInfo, title: str) -> str:
    bounds = [c.get("error_bound_us", 0.0) for c in info.clocks.values()]
    methods = sorted({str(c.get("method", "?")) for c in info.clocks.values()})
    head = (f"{title}: {len(analysis.ranks)} ranks; clock {', '.join(methods) or 'unknown'}"
            f" (alignment error <= {max(bounds, default=0.0):.1f} us)")
    parts = [[head], _rank_table(analysis.ranks), _link_table(analysis, info), _slowest(analysis),
             _bubble(analysis, info), _metrics(info)]
    return "\n\n".join("\n".join(p) for p in parts if p)


def report_dict(analysis: Analysis, info: RunInfo) -> dict[str, Any]:
    """The `--json` document: the analysis plus the run context it was read with."""
    return {**analysis.to_dict(), "pipeline": {"stages": info.stages,
                                               "microbatches": info.microbatches,
                                               "schedule": info.schedule},
            "congested": congestion(analysis),
            "clock": info.clocks, "metrics_last_epoch": info.epoch}
