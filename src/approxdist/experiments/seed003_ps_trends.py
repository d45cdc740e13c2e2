"""The checked claims of `seed003-ps`: seed 003's trends and our targets that quantify
them, each with a comment computed from the run's own CSVs (or a hypothesis stating what
would test it)."""

from __future__ import annotations

import math

from approxdist.experiments import markdown as md
from approxdist.experiments.accuracy import noise
from approxdist.experiments.base import Meta
from approxdist.experiments.csvio import Row, spread
from approxdist.experiments.seed003_ps_report import (
    MODES,
    NB_CUT,
    NB_POINTS,
    PS_RATIO,
    SSP_BOUND,
    hist_mean,
    histogram,
    mean,
    med,
    select,
    step_rows,
)


def trend_rows(epochs: list[Row], runs: list[Row], stale: list[Row], meta: Meta) -> list[md.Trend]:
    """Every checked claim; `stale` holds the task model's staleness rows only."""
    model, workers = meta["task_model"], float(meta["workers"])
    matrix = select(epochs, model=model, workers=workers)
    mruns = select(runs, model=model, workers=workers)
    out = [*_straggler_pace(matrix, mruns, meta), *_backup(mruns, meta)]
    out += _ratios(epochs, meta)
    out += [*_ssp(mruns), *_async_accuracy(mruns, stale)]
    return out


def _final(runs: list[Row], setting: str, mode: str) -> dict[str, float]:
    return spread([float(r["final_accuracy"]) for r in select(runs, setting=setting, mode=mode)])


def _straggler_pace(matrix: list[Row], runs: list[Row], meta: Meta) -> list[md.Trend]:
    """A synchronous step waits for the slowest worker; an asynchronous one does not."""
    out: list[md.Trend] = []
    delay = float(meta["delay_ms"]) / 1e3
    for mode in ("sync", "async"):
        calm = select(matrix, setting="none", mode=mode)
        slow = select(matrix, setting="persistent", mode=mode)
        if not calm or not slow:
            continue
        step, base = med(slow, "step_time_s"), med(calm, "step_time_s")
        ours = (f"{1e3 * step:.1f} ms per step with the straggler ({1e3 * base:.1f} ms "
                f"without); its delay {1e3 * delay:.0f} ms")
        if mode == "sync":
            out.append(("a synchronous step waits for the slowest worker: with a persistent "
                        "straggler, sync PS's time per step is at least the straggler's delay "
                        "(seed 003)", ours, step >= delay,
                        md.join("sync PS averages one gradient of every worker per step",
                                _sleep_share(runs, "sync"))))
        else:
            out.append(("an asynchronous update does not wait for the slowest worker: with a "
                        "persistent straggler, async's time per step stays below the "
                        "straggler's delay (seed 003)", ours, step < delay,
                        _sleep_share(runs, "async")))
    return out


def _sleep_share(runs: list[Row], mode: str) -> str:
    """The straggler's scheduled sleep as a share of the measured training time."""
    mine = select(runs, setting="persistent", mode=mode)
    if not mine:
        return ""
    sleep, wall = mean(mine, "straggler_sleep_s"), mean(mine, "wall_time_s")
    return (f"the straggler sleeps {sleep:.1f} s over the run when it runs each of its "
            f"{mean(mine, 'steps'):.0f} steps: {md.pct(sleep / wall)} of the run's "
            f"{wall:.1f} s of training")


def _backup(runs: list[Row], meta: Meta) -> list[md.Trend]:
    """Our target: N+b with b = 1 cuts sync PS's time by >= 50 % within 1 point."""
    nb, sync = select(runs, setting="persistent", mode="backup"), \
        select(runs, setting="persistent", mode="sync")
    if not nb or not sync:
        return []
    t_nb, t_sync = mean(nb, "wall_time_s"), mean(sync, "wall_time_s")
    cut = 1 - t_nb / t_sync
    a, s = _final(runs, "persistent", "backup"), _final(runs, "persistent", "sync")
    diff = a["mean"] - s["mean"]
    ok = cut >= NB_CUT and diff >= -NB_POINTS
    sleep = mean(nb, "straggler_sleep_s")
    pushed = mean(nb, "steps") * int(meta["workers"])
    why = [f"N+b dropped {mean(nb, 'dropped'):.0f} of the {pushed:.0f} gradients pushed to "
           f"server 0 and applied {mean(nb, 'updates'):.0f} updates in "
           f"{mean(nb, 'steps'):.0f} trainer steps", noise(a, s)]
    if t_nb >= sleep:
        why.append(f"N+b's {t_nb:.1f} s is at least the {sleep:.1f} s its straggler sleeps "
                   f"when it runs every step: the straggler's own steps, not the wait for "
                   f"its gradient, set the pace (docs/param_server.md)")
    else:
        why.append(f"N+b's {t_nb:.1f} s is below the {sleep:.1f} s its straggler would sleep "
                   f"running every step: it ran fewer steps than the others")
    return [(f"N+b (b = 1), {meta['workers']} workers, persistent {meta['delay_ms']} ms "
             f"straggler: time to the same epochs >= {NB_CUT:.0%} below sync PS, final "
             f"accuracy within {100 * NB_POINTS:.0f} point (our target)",
             f"{t_nb:.1f} s vs {t_sync:.1f} s: {md.pct(cut)} cut; {md.pct(a['mean'])} vs "
             f"{md.pct(s['mean'])}: {md.points(diff)}", ok, md.join(*why))]


def _ratios(epochs: list[Row], meta: Meta) -> list[md.Trend]:
    """Our target: sync PS (S = 1) within 1.5x of all-reduce per step; S = W closes the gap."""
    cells_of = {(m, w): c for m, w, c in step_rows(epochs)}
    ratio = {k: c["sync"]["vs"] for k, c in cells_of.items()
             if "sync" in c and "allreduce" in c}
    out: list[md.Trend] = []
    cores = int(meta.get("cores", 0))
    for (model, w), r in ratio.items():
        cells = cells_of[(model, w)]
        dp, ps = cells["allreduce"], cells["sync"]
        why = [f"the server sends + receives {_kb(ps['busiest'])} per step, the busiest "
               f"all-reduce rank {_kb(dp['busiest'])} ({ps['busiest'] / dp['busiest']:.2f}x); "
               f"all links: {_kb(ps['bytes'])} vs {_kb(dp['bytes'])}"]
        why += [_by_bytes(model, r, ps["busiest"], m2, r2, cells_of[(m2, w2)]["sync"]["busiest"])
                for (m2, w2), r2 in ratio.items() if w2 == w and m2 != model]
        out.append((f"sync PS, 1 server + {w} workers, {model}: time per step within "
                    f"{PS_RATIO}x of all-reduce (our target)",
                    f"{1e3 * ps['step_s']:.2f} ms vs {1e3 * dp['step_s']:.2f} ms (medians); "
                    f"paired ratio {r:.2f}x{_range(ps)}",
                    r <= PS_RATIO, md.join(*why)))
        if "sharded" in cells:
            out.append(_sharded(model, w, cells, cores))
    return out


def _sharded(model: str, w: int, cells: dict[str, dict[str, float]], cores: int) -> md.Trend:
    one, many = cells["sync"], cells["sharded"]
    gap = one["vs"] - 1.0  # in units of all-reduce's step (paired within seeds)
    s = int(many["servers"])
    ours = (f"S = {s}: {1e3 * many['step_s']:.2f} ms, paired {many['vs']:.2f}x "
            f"all-reduce{_range(many)}; S = 1: {one['vs']:.2f}x")
    why = [f"the busiest server sends + receives {_kb(many['busiest'])} per step (S = 1: "
           f"{_kb(one['busiest'])})"]
    if gap <= 0:
        return (f"sync PS, {model}, W = {w}: a sharded server with S = W closes most of the "
                f"gap to all-reduce (our target)", ours, None,
                md.join("no gap to close: S = 1 is not slower than all-reduce here", *why))
    closed = (one["vs"] - many["vs"]) / gap
    ok = closed >= 0.5
    if not ok and cores:
        why.append(f"a hypothesis: S = {s} runs {s + w} processes on {cores} core(s) "
                   f"(all-reduce: {w}), so each added server competes with the workers for "
                   f"a core; with a core per rank the busiest server's bytes would decide")
    return (f"sync PS, {model}, W = {w}: a sharded server with S = W closes most of the gap "
            f"to all-reduce (our target)", f"{ours}; gap closed: {md.pct(closed)}", ok,
            md.join(*why))


def _by_bytes(model: str, r: float, nbytes: float, other: str, r2: float,
              nbytes2: float) -> str:
    """How the ratio moves with the server's bytes per step, between two models."""
    (ra, ba, ma), (rb, bb, mb) = sorted([(r, nbytes, model), (r2, nbytes2, other)],
                                        key=lambda c: c[1])
    both = f"{ra:.2f}x at {_kb(ba)} ({ma}), {rb:.2f}x at {_kb(bb)} ({mb})"
    if rb >= ra:
        return (f"the ratio grows with the server's bytes per step ({both}): consistent with "
                f"the bytes that the one server carries for every worker setting the gap")
    return (f"the ratio falls as the server's bytes per step grow ({both}); a hypothesis: "
            f"per-message costs, not bytes, dominate the smaller model's step")


def _range(cell: dict[str, float]) -> str:
    """The per-seed range of a paired ratio, when there is more than one seed."""
    if not cell["vs_max"] > cell["vs_min"]:
        return ""
    return f" (per seed {cell['vs_min']:.2f}-{cell['vs_max']:.2f}x)"


def _kb(value: float) -> str:
    return f"{value / 1e3:.1f} kB"


def _ssp(runs: list[Row]) -> list[md.Trend]:
    mine = select(runs, mode="ssp")
    if not mine:
        return []
    lead = max(int(r["max_lead"]) for r in mine)
    return [(f"SSP never lets a worker run more than s = {SSP_BOUND} steps ahead of the "
             f"slowest (Ho et al. 2013)",
             f"largest lead {lead} over {len(mine)} run(s) (every step record)",
             lead <= SSP_BOUND,
             "the lead of a push is its worker's pushes minus the slowest worker's, as "
             "server 0 counted them")]


def _async_accuracy(runs: list[Row], stale: list[Row]) -> list[md.Trend]:
    """Seed 003: asynchronous updates apply stale gradients and lose accuracy."""
    out: list[md.Trend] = []
    sync = select(runs, setting="none", mode="sync")
    for mode in ("async", "ssp"):
        mine = select(runs, setting="none", mode=mode)
        if not mine or not sync:
            continue
        a, s = _final(runs, "none", mode), _final(runs, "none", "sync")
        diff = a["mean"] - s["mean"]
        # with seeds to compare, a loss counts only beyond 2x the combined spread
        spread_ok = a["n"] < 2 or s["n"] < 2 or -diff > 2 * math.hypot(a["std"], s["std"])
        h = histogram(stale, "none", mode)
        why = [f"mean staleness {hist_mean(h):.2f} updates, largest {max(h, default=0)}"
               if h else "", noise(a, s)]
        if diff >= 0:
            why.append(f"{mode} applied {mean(mine, 'updates'):.0f} updates where sync PS "
                       f"applied {mean(sync, 'updates'):.0f} in the same epochs (one per "
                       f"gradient vs one per average of W); a hypothesis: more, smaller-batch "
                       f"steps outweigh the staleness at this learning rate, which a run with "
                       f"the learning rate divided by W (or `--staleness-lr`) would test")
        out.append((f"{MODES[mode]['label']}: stale gradients lose accuracy against "
                    f"synchronous updates at the same epochs (seed 003)",
                    f"{md.pct(a['mean'])} vs {md.pct(s['mean'])} (sync PS): "
                    f"{md.points(diff)}", diff < 0 and spread_ok, md.join(*why)))
    return out
