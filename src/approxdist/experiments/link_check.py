"""`link-emulation-check`: our in-process link emulator against the kernel's shaper (tc).

Seed 000 throttled its links with Linux `tc`; approxdist emulates links in-process
(`--link bw=...`, `comm.netem`: each send is released when the link would have carried
it). This preset runs the same transfers and the same training both ways on 2 ranks at
each link rate: *inproc* on one host with `--link`, *kernel* on a 2-host cluster of
network namespaces whose links `tc` shapes to the same rate (`approxdist.cluster`, needs
root). Transfers: the all-reduce benchmark's measurement (`benchmarks.allreduce`) of
BRD (at N = 2 one exchange: each rank sends the whole message to the other at once) and
ring; training: data-parallel ResNet-20 for one epoch. CSV `links.csv`, one row per
(kind, link, shaper, what, size): kind (`transfer` or `train`), link, shaper, what (the
algorithm, or the model), size_bytes (message size; 0 for training), median_s (median
over rounds of the slower rank's time; training: the epoch's wall time), p10_s, repeats.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from approxdist.benchmarks.allreduce import BenchPlan, fmt_size, measure_rank, summarize
from approxdist.cluster import cluster_down, cluster_up
from approxdist.cluster.system import require_net_admin
from approxdist.comm.netem import parse_link
from approxdist.config.loader import build_config, write_config
from approxdist.errors import ClusterError
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row
from approxdist.experiments.runs import train_run
from approxdist.experiments.shaping import on_cluster
from approxdist.launch.spawn import run_on_ranks

NAME = "link-emulation-check"
COLUMNS = ("kind", "link", "shaper", "what", "size_bytes", "median_s", "p10_s", "repeats")
LINKS_CSV = CsvFile("links.csv", COLUMNS)
ALGORITHMS = ("brd", "ring")
K, M = 1 << 10, 1 << 20
TOLERANCE = 0.15  # the check passes within 15 % at 10 and 100 Mbit/s for messages >= 1 MB
CLUSTER = "lec"


def links(settings: Settings) -> dict[str, tuple[int, ...]]:
    """Link -> message sizes (smaller at slow links: 16 MB at 10 Mbit/s take 13 s a round)."""
    return settings.pick(
        {"bw=100mbit": (64 * K, M)},
        {"bw=10mbit": (64 * K, M), "bw=100mbit": (64 * K, M, 4 * M)},
        {"bw=10mbit": (64 * K, M, 4 * M), "bw=100mbit": (64 * K, M, 4 * M, 16 * M),
         "bw=1gbit": (64 * K, M, 4 * M, 16 * M, 64 * M)})


def _plan(settings: Settings, sizes: tuple[int, ...], link: str | None) -> BenchPlan:
    return BenchPlan(sizes, tuple((a, "fp32") for a in ALGORITHMS), link,
                     max_repeats=settings.pick(3, 10, 20), min_repeats=settings.pick(2, 5, 5),
                     budget_s=settings.pick(0.5, 2.0, 6.0))


def _model(settings: Settings) -> str:
    return str(settings.pick("mlp", "resnet20", "resnet20"))


def _train_sections(settings: Settings, link: str) -> dict[str, Any]:
    return {"train": {"parallel": "dp", "world_size": 2, "epochs": 1, "seed": 0,
                      "progress": False},
            "model": {"name": _model(settings)},
            "data": {"batch_size": 64},
            "comm": {"link": link}}


def collect(settings: Settings) -> Meta:
    require_net_admin()
    rows: list[Row] = []
    for link, sizes in links(settings).items():
        print(f"[{NAME}] {link}: in-process emulator", flush=True)
        per_rank = run_on_ranks(measure_rank, 2, _plan(settings, sizes, link), timeout_s=3600,
                                comm_timeout_s=300)
        rows += _transfer_rows(link, "inproc", [r.as_json() for r in summarize(per_rank, 2, link)])
        run_dir = settings.out / "runs" / f"train-inproc-{link[3:]}"
        summary = train_run(_train_sections(settings, link), run_dir)
        rows.append(_train_row(link, "inproc", settings, summary))
        print(f"[{NAME}] {link}: kernel (tc) on a 2-host cluster", flush=True)
        rows += _kernel_rows(settings, link, sizes)
    LINKS_CSV.write(settings.out, rows)
    return {"links": list(links(settings)), "algorithms": list(ALGORITHMS),
            "tolerance": TOLERANCE}


def _kernel_rows(settings: Settings, link: str, sizes: tuple[int, ...]) -> list[Row]:
    cluster_up(CLUSTER, 2, link)
    try:
        plan = _plan(settings, sizes, None)
        out = settings.out / f"kernel-{link[3:]}.json"
        argv = ["bench", "allreduce", "--sizes", ",".join(str(s) for s in sizes),
                "--algorithms", ",".join(ALGORITHMS), "--repeats", str(plan.max_repeats),
                "--budget", str(plan.budget_s), "--json", str(out.resolve())]
        _on_cluster(argv)
        found = json.loads(out.read_text())
        rows = _transfer_rows(link, "kernel", found["rows"] if isinstance(found, dict) else found)
        cfg = build_config(_train_sections(settings, ""))
        run_dir = (settings.out / "runs" / f"train-kernel-{link[3:]}").resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(cfg, run_dir / "train.toml")
        _on_cluster(["train", "--config", str(run_dir / "train.toml"), "--out", str(run_dir)])
        summary = json.loads((run_dir / "summary.json").read_text())
        return [*rows, _train_row(link, "kernel", settings, summary)]
    finally:
        cluster_down(CLUSTER)


def _on_cluster(argv: list[str]) -> None:
    on_cluster(CLUSTER, argv)


def _transfer_rows(link: str, shaper: str, rows: list[dict[str, Any]]) -> list[Row]:
    return [{"kind": "transfer", "link": link, "shaper": shaper, "what": r["algorithm"],
             "size_bytes": int(r["size_bytes"]), "median_s": float(r["median_s"]),
             "p10_s": float(r["p10_s"]), "repeats": int(r["repeats"])}
            for r in rows if r["algorithm"] in ALGORITHMS and r["codec"] == "fp32"]


def _train_row(link: str, shaper: str, settings: Settings, summary: dict[str, Any]) -> Row:
    seconds = float(summary["wall_time_s"])
    return {"kind": "train", "link": link, "shaper": shaper,
            "what": f"dp {_model(settings)}", "size_bytes": 0,
            "median_s": seconds, "p10_s": seconds, "repeats": 1}


def pairs(rows: list[Row]) -> list[dict[str, Any]]:
    """Inproc and kernel side by side per (kind, link, what, size): ratio = kernel / inproc."""
    index = {(r["kind"], r["link"], r["what"], int(float(r["size_bytes"])), r["shaper"]): r
             for r in rows}
    out = []
    for (kind, link, what, size, shaper), r in index.items():
        other = index.get((kind, link, what, size, "kernel"))
        if shaper != "inproc" or other is None:
            continue
        inproc, kernel = float(r["median_s"]), float(other["median_s"])
        out.append({"kind": kind, "link": link, "what": what, "size": size, "inproc_s": inproc,
                    "kernel_s": kernel, "kernel_p10_s": float(other["p10_s"]),
                    "ratio": kernel / inproc if inproc > 0 else math.nan})
    return out


def _rate(link: str) -> float:
    spec = parse_link(link)
    return spec.bandwidth_bps if spec is not None else math.inf


def trend_rows(matched: list[dict[str, Any]]) -> list[md.Trend]:
    out: list[md.Trend] = []
    for link in sorted({p["link"] for p in matched}, key=_rate):
        if _rate(link) > 100e6:
            continue
        big = [p for p in matched if p["link"] == link and p["kind"] == "transfer"
               and p["size"] >= M]
        if big:
            worst = max(big, key=lambda p: abs(p["ratio"] - 1))
            ok = abs(worst["ratio"] - 1) <= TOLERANCE
            out.append((f"{link}: transfers of >= 1 MB take the same time through the "
                        f"emulator as through tc (within 15 %)",
                        f"kernel / inproc from {min(p['ratio'] for p in big):.2f}x to "
                        f"{max(p['ratio'] for p in big):.2f}x over {len(big)} (algorithm, "
                        f"size) pairs; furthest: {worst['what']} {fmt_size(worst['size'])} "
                        f"{worst['ratio']:.2f}x", ok, _why(worst, ok)))
        train = [p for p in matched if p["link"] == link and p["kind"] == "train"]
        for p in train:
            ok = abs(p["ratio"] - 1) <= TOLERANCE
            out.append((f"{link}: a training epoch takes the same time under both shapers "
                        f"(within 15 %)", f"{p['what']}: {p['inproc_s']:.2f} s inproc, "
                        f"{p['kernel_s']:.2f} s kernel, {p['ratio']:.2f}x", ok,
                        "one epoch each, 2 ranks; the epoch includes compute, which both "
                        "runs share"))
    return out


def _why(p: dict[str, Any], ok: bool) -> str:
    fast = p["kernel_p10_s"] / p["inproc_s"]
    text = (f"the kernel's 10th percentile for it is {fast:.2f}x the emulator's median")
    if ok:
        return text
    if abs(fast - 1) <= TOLERANCE:
        return (text + ": the fast rounds agree, the median does not. Hypothesis: TCP "
                "losses where the token bucket's queue (100 ms) overflows make some rounds "
                "wait for retransmissions; the emulator never drops")
    return (text + ": even the fast rounds differ. Hypothesis: the per-message costs "
            "(TCP windows, segment sizes, the bucket's burst) that the emulator's "
            "bandwidth-only model does not have")


def result_table(matched: list[dict[str, Any]]) -> str:
    return md.table(("kind", "link", "what", "size", "inproc ms", "kernel ms (p10)",
                     "kernel / inproc"),
                    [(p["kind"], p["link"], p["what"], fmt_size(p["size"]) if p["size"] else "-",
                      f"{1e3 * p['inproc_s']:.1f}",
                      f"{1e3 * p['kernel_s']:.1f} ({1e3 * p['kernel_p10_s']:.1f})",
                      f"{p['ratio']:.2f}x") for p in matched])


def plot(out: Path, matched: list[dict[str, Any]], title: str) -> str:
    fig, (ax,) = plots.figure(1)
    for link in sorted({p["link"] for p in matched}, key=_rate):
        for what in ALGORITHMS:
            mine = sorted((p for p in matched if p["link"] == link and p["what"] == what),
                          key=lambda p: p["size"])
            if mine:
                ax.plot([p["size"] for p in mine], [p["ratio"] for p in mine], marker="o",
                        label=f"{link} {what}")
    ax.axhline(1 + TOLERANCE, color="grey", linestyle=":")
    ax.axhline(1 - TOLERANCE, color="grey", linestyle=":")
    ax.set_xscale("log", base=2)
    plots.label(ax, "message size (bytes)", "time through tc / through the emulator",
                "kernel vs in-process shaping")
    plots.save(fig, out / "link_check.png", title)
    return "link_check.png"


def render(out: Path, meta: Meta) -> str:
    matched = pairs(LINKS_CSV.read(out))
    png = plot(out, matched, f"{NAME}: 2 ranks, tc vs in-process link emulation")
    return md.report(
        ["Median time per operation on 2 ranks (the slower rank's), in-process emulator (one "
         "host, `--link`) against the kernel's token bucket (two namespaced hosts, "
         "`approxdist cluster`); kernel's 10th percentile in brackets.",
         result_table(matched)],
        [md.image(png, "kernel / in-process time per message size")],
        trend_rows(matched),
        "Seed 000 shaped real links between two machines with tc; here both hosts are "
        "namespaces on one machine, so the two ranks also share its CPU cores, and the kernel "
        "here has no netem (bandwidth only, no added latency).", trends_title="Trends")


PRESET = Preset(listing(NAME), files=(LINKS_CSV,), collect=collect, render=render,
                unavailable=lambda: _unavailable())


def _unavailable() -> str:
    try:
        require_net_admin()
    except ClusterError as exc:
        return str(exc)
    return ""
