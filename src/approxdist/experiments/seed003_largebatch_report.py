"""The report of `seed003-largebatch`, from its CSV alone: tables, verdicts, explanations.

Seed 003's large-batch claims, checked against the run: accuracy falls as the global
batch grows at the base learning rate; linear scaling with gradual warm-up (Goyal et al.
2017) brings most of it back; growing the batch instead of decaying the rate (Smith et
al. 2018) reaches the same accuracy with fewer parameter updates, its noise scale
g = lr / (1 - m) * (N / B - 1) following the decay's. Every number and every "why" is
computed from `largebatch.csv` and `experiment.json`; a reason that the run cannot prove
is worded as a hypothesis with the test that would decide it.
"""

from __future__ import annotations

import math
from typing import Any

from approxdist.bench.stats import median
from approxdist.experiments import markdown as md
from approxdist.experiments.accuracy import EPOCH_COLUMNS, seconds
from approxdist.experiments.accuracy import time_to as _time_to
from approxdist.experiments.base import Meta
from approxdist.experiments.csvio import CsvFile, Row, group, spread

#: the sweep's rules and the two schedules of the same noise-scale path
UNSCALED, SCALED = "unscaled", "linear+warmup"
DECAY, GROWTH = "step-decay", "batch-growth"
RULES = (UNSCALED, SCALED)
SCHEDULES = (DECAY, GROWTH)
COLUMNS = ("rule", "global_batch", *EPOCH_COLUMNS, "batch_size", "lr", "noise_scale",
           "updates", "samples_seen", "elapsed_s")
LARGEBATCH_CSV = CsvFile("largebatch.csv", COLUMNS)
#: time to accuracy is measured to this share of the reference run's final accuracy
TARGET_SHARE = 0.9
#: Goyal et al. 2017 kept ResNet-50's ImageNet accuracy up to a batch of 8192 of the
#: 1,281,167 training images: each step took this share of the training set
GOYAL_SHARE = 8192 / 1281167


def runs(rows: list[Row], rule: str, batch: float | None = None) -> list[Row]:
    """The rows of `rule` (and of the runs starting at global batch `batch`, if given)."""
    return [r for r in rows if r["rule"] == rule
            and (batch is None or int(r["global_batch"]) == int(batch))]


def batches(rows: list[Row]) -> list[int]:
    """The sweep's global batches, ascending."""
    return sorted({int(r["global_batch"]) for r in rows if r["rule"] in RULES})


def final(rows: list[Row], key: str = "test_accuracy") -> dict[str, float]:
    """Spread over seeds of `key` at the last epoch of `rows` (one run per seed)."""
    if not rows:
        return spread([])
    last = max(int(r["epoch"]) for r in rows)
    return spread([float(r[key]) for r in rows if int(r["epoch"]) == last])


def by_epoch(rows: list[Row], key: str) -> list[tuple[int, float]]:
    """(epoch, mean of `key` over seeds) in epoch order."""
    return [(int(e), spread([float(r[key]) for r in rs])["mean"])
            for (e,), rs in sorted(group(rows, "epoch").items(), key=lambda kv: int(kv[0][0]))]


def margin(a: dict[str, float], b: dict[str, float], test_size: int) -> float:
    """The difference two final accuracies must pass to count: twice the larger of the
    binomial noise of a `test_size`-sample test set and the seeds' combined std."""
    pa, pb = a["mean"], b["mean"]
    binom = math.sqrt((pa * (1 - pa) + pb * (1 - pb)) / max(1, test_size))
    return 2 * max(binom, math.hypot(a["std"] or 0.0, b["std"] or 0.0))


def target(rows: list[Row]) -> float:
    """The target accuracy: TARGET_SHARE of the reference run's (smallest batch, unscaled)."""
    sweep = batches(rows)
    return TARGET_SHARE * final(runs(rows, UNSCALED, sweep[0]))["mean"] if sweep else math.nan


def time_to(rows: list[Row], goal: float) -> float:
    """Median over seeds of the training time to `goal` (NaN unless every seed reached it)."""
    return _time_to(rows, goal, median)


def epoch_s(rows: list[Row], batch: int) -> float:
    """Median epoch time of the sweep's runs at global batch `batch` (both rules)."""
    return median([float(r["epoch_time_s"]) for rule in RULES for r in runs(rows, rule, batch)])


# -- trends ------------------------------------------------------------------------------
def trend_rows(rows: list[Row], meta: Meta) -> list[md.Trend]:
    out: list[md.Trend] = []
    sweep = batches(rows)
    if len(sweep) >= 2:
        out.append(_falls(rows, meta, sweep))
        out += [_recovers(rows, meta, sweep[0], b) for b in sweep[1:]]
        out.append(_sooner(rows, sweep))
    if runs(rows, DECAY) and runs(rows, GROWTH):
        out.append(_growth_matches(rows, meta))
        out.append(_noise_follows(rows))
    return out


def _falls(rows: list[Row], meta: Meta, sweep: list[int]) -> md.Trend:
    small, large = sweep[0], sweep[-1]
    accs = [final(runs(rows, UNSCALED, b)) for b in sweep]
    gap = accs[0]["mean"] - accs[-1]["mean"]
    need = margin(accs[0], accs[-1], int(meta.get("test_size", 0)))
    falls = sum(b["mean"] < a["mean"] for a, b in zip(accs, accs[1:]))
    ends = {b: runs(rows, UNSCALED, b) for b in (small, large)}
    updates = {b: final(ends[b], "updates")["mean"] for b in ends}
    g = {b: by_epoch(ends[b], "noise_scale")[0][1] for b in ends}
    return ("without scaling rules, accuracy falls as the global batch grows (seed 003: "
            "accuracy drops as the total batch grows)",
            " → ".join(f"{md.pct(a['mean'])} ({b})" for a, b in zip(accs, sweep)),
            gap > need,
            f"{md.points(-gap)} from {small} to {large} (noise band {100 * need:.1f} pts); "
            f"it fell at {falls} of {len(sweep) - 1} steps up the sweep. At the same rate, "
            f"B = {large} makes {updates[large]:.0f} updates in the run against "
            f"{updates[small]:.0f} at B = {small}, and its noise scale g in the first epoch "
            f"(its last step) is {g[large]:.2f} against {g[small]:.1f}: a hypothesis (Smith and "
            f"Le 2018): too few updates and too little SGD noise; the scaled rule below tests it")


def _recovers(rows: list[Row], meta: Meta, base: int, batch: int) -> md.Trend:
    ref, plain = final(runs(rows, UNSCALED, base)), final(runs(rows, UNSCALED, batch))
    ruled = final(runs(rows, SCALED, batch))
    lost = ref["mean"] - plain["mean"]
    back = (ruled["mean"] - plain["mean"]) / lost if lost > 0 else math.nan
    need = margin(ref, plain, int(meta.get("test_size", 0)))
    k = batch / float(meta.get("base_batch", base))
    claim = (f"B = {batch} ({k:g}x): linear scaling + gradual warm-up brings back most "
             f"(at least half) of the accuracy lost without them (Goyal et al.: no loss up to "
             f"8192, 32x their base 256)")
    ours = (f"{md.pct(ruled['mean'])} vs {md.pct(plain['mean'])} unscaled, reference "
            f"{md.pct(ref['mean'])} (B = {base})"
            + (f": {100 * back:.0f} % of the loss back" if math.isfinite(back) else ""))
    if lost <= need:
        return (claim, ours, None, f"nothing to recover: unscaled B = {batch} is within the "
                                   f"noise band ({100 * need:.1f} pts) of the reference")
    ok = back >= 0.5
    return (claim, ours, ok, _scaled_why(rows, meta, base, batch, ok))


def _scaled_why(rows: list[Row], meta: Meta, base: int, batch: int, ok: bool) -> str:
    mine = runs(rows, SCALED, batch)
    k = batch / float(meta.get("base_batch", base))
    steps = by_epoch(mine, "updates")[0][1]
    warm = round(float(meta.get("warmup_epochs", 0)) * steps)
    peak = float(meta.get("lr", math.nan)) * k
    share = batch / max(1, int(meta.get("train_size", 0)))
    facts = (f"peak rate {peak:g} (lr x {k:g}), warm-up {warm} updates, "
             f"{final(mine, 'updates')['mean']:.0f} updates in the run; a step takes "
             f"{100 * share:.1f} % of the training set (Goyal's 8192: "
             f"{100 * GOYAL_SHARE:.2f} % of ImageNet)")
    if ok:
        return facts
    lagging = eval_lag(mine, runs(rows, UNSCALED, base), meta, "the reference")
    if lagging:
        ref, plain = (final(runs(rows, UNSCALED, b), "train_accuracy")["mean"] for b in (base, batch))
        train = final(mine, "train_accuracy")["mean"]
        back = (train - plain) / (ref - plain) if ref > plain else math.nan
        return (f"{facts}. {lagging}; on the training accuracy the rule brings back "
                f"{100 * back:.0f} % of the loss ({md.pct(train)} vs {md.pct(plain)} unscaled, "
                f"reference {md.pct(ref)})")
    losses = by_epoch(mine, "train_loss")
    rises = [(e, a, b) for (_, a), (e, b) in zip(losses, losses[1:]) if b > a]
    if rises:
        e, a, b = max(rises, key=lambda t: t[2] - t[1])
        longer = 2 * max(1, round(float(meta.get("warmup_epochs", 1))))
        return (f"{facts}. The training loss rose at epoch {e} ({a:.3f} → {b:.3f}): a "
                f"hypothesis: the scaled rate {peak:g} is past the largest rate this model "
                f"trains stably at after {warm} warm-up updates; if so a longer warm-up "
                f"recovers more (test: `--set optim.warmup_epochs={longer}` at this batch)")
    return (f"{facts}. The training loss fell every epoch but ended at {losses[-1][1]:.3f}: "
            f"a hypothesis: too few updates for linear scaling's premise (k small steps ≈ one "
            f"step k times as large) when each step sees {100 * share:.1f} % of the data; if "
            f"so, more epochs at this batch close the gap")


def eval_lag(mine: list[Row], ref: list[Row], meta: Meta, ref_name: str) -> str:
    """A hypothesis when the evaluated model trails what training measured by more than the
    reference run does (train minus test accuracy at the end, beyond the noise band); ""
    otherwise. The training accuracy is taken in training mode over the epoch."""
    train, test = final(mine, "train_accuracy"), final(mine)
    gap = train["mean"] - test["mean"]
    ref_gap = final(ref, "train_accuracy")["mean"] - final(ref)["mean"]
    if gap - ref_gap <= margin(train, test, int(meta.get("test_size", 0))):
        return ""
    worst = max(float(r["test_loss"]) for r in mine)
    losses = {k: final(mine, k)["mean"] for k in ("test_loss", "train_loss")}
    fastest = max(float(r["lr"]) for r in mine)
    updates = final(mine, "updates")["mean"]
    what = ("BatchNorm's running statistics, which evaluation uses and which move once per "
            "update," if meta.get("batch_norm") else "the evaluated weights")
    return (f"training accuracy {md.pct(train['mean'])} against {md.pct(test['mean'])} on the "
            f"test set ({md.points(gap)}; {ref_name}: {md.points(ref_gap)}), test loss "
            f"{losses['test_loss']:.3g} against training loss {losses['train_loss']:.3g} at the "
            f"end (test loss up to {worst:.3g} during the run): a hypothesis: {what} lag the weights after "
            f"{updates:.0f} updates at rates up to {fastest:.3g}; if so, more epochs (more "
            f"updates) at this batch close the gap between the two")


def _sooner(rows: list[Row], sweep: list[int]) -> md.Trend:
    goal = target(rows)
    ref = time_to(runs(rows, UNSCALED, sweep[0]), goal)
    times = {b: time_to(runs(rows, SCALED, b), goal) for b in sweep[1:]}
    reached = {b: t for b, t in times.items() if math.isfinite(t)}
    best = min(reached, key=lambda b: reached[b]) if reached else None
    ok = best is not None and math.isfinite(ref) and reached[best] < ref
    epoch = {b: epoch_s(rows, b) for b in sweep}
    ours = (f"fastest: B = {best}, {reached[best]:.1f} s vs {seconds(ref)} s at B = {sweep[0]}"
            if best is not None else f"no larger batch reached {md.pct(goal)}")
    return (f"with the rules, a larger global batch reaches the target accuracy "
            f"({md.pct(goal)}) sooner (seed 003: parallelism shortens the total time)", ours, ok,
            "median epoch time: " + ", ".join(
                f"{epoch[b]:.2f} s (B = {b})" for b in sweep) +
            "; a larger batch makes fewer steps per epoch, each with one all-reduce of the "
            "gradients, so an epoch is cheaper; reaching the target also needs the accuracy")


def _growth_matches(rows: list[Row], meta: Meta) -> md.Trend:
    decay, growth = runs(rows, DECAY), runs(rows, GROWTH)
    a, b = final(growth), final(decay)
    need = margin(a, b, int(meta.get("test_size", 0)))
    ua, ub = final(growth, "updates")["mean"], final(decay, "updates")["mean"]
    ok = a["mean"] >= b["mean"] - need and ua < ub
    sa, sb = final(growth, "samples_seen")["mean"], final(decay, "samples_seen")["mean"]
    why = (f"noise band {100 * need:.1f} pts; samples seen {sa:.0f} vs {sb:.0f}; the batch "
           f"grew {' → '.join(str(int(x)) for x in _phases(growth, 'batch_size'))} where the "
           f"rate decayed {' → '.join(f'{x:g}' for x in _phases(decay, 'lr'))}")
    if a["mean"] < b["mean"] - need:
        best = [max(a for _, a in by_epoch(r, "test_accuracy")) for r in (growth, decay)]
        ratio = _phases(growth, "noise_scale")[-1] / _phases(decay, "noise_scale")[-1]
        why += (f"; a hypothesis: in the last phase growth's noise scale is {ratio:.2f}x the "
                f"decay's and it makes {_last_updates(growth):.0f} updates there against "
                f"{_last_updates(decay):.0f}, too few to settle (best epoch: "
                f"{md.pct(best[0])} vs {md.pct(best[1])}); a later growth point or a smaller "
                f"factor would test it")
        lagging = eval_lag(growth, decay, meta, "decay")
        why += f"; also, growth's {lagging}" if lagging else ""
    return ("growing the batch instead of decaying the learning rate reaches the same accuracy "
            "with fewer parameter updates (Smith et al. 2018; seed 003)",
            f"{md.pct(a['mean'])} vs {md.pct(b['mean'])} (decay), {md.points(a['mean'] - b['mean'])}; "
            f"{ua:.0f} vs {ub:.0f} updates ({ua / ub:.2f}x)", ok, why)


def _phases(rows: list[Row], key: str) -> list[float]:
    """The distinct consecutive per-epoch values of `key` (mean over seeds)."""
    values = [v for _, v in by_epoch(rows, key)]
    return [v for i, v in enumerate(values) if i == 0 or not math.isclose(v, values[i - 1])]


def _last_updates(rows: list[Row]) -> float:
    """Updates in the last phase (since the batch size or rate last changed)."""
    ep = sorted(group(rows, "epoch").items(), key=lambda kv: int(kv[0][0]))
    series = [(spread([float(r["updates"]) for r in rs])["mean"],
               (rs[0]["batch_size"], rs[0]["lr"])) for _, rs in ep]
    start = max((i for i in range(1, len(series)) if series[i][1] != series[i - 1][1]), default=0)
    before = series[start - 1][0] if start else 0.0
    return series[-1][0] - before


def _noise_follows(rows: list[Row]) -> md.Trend:
    grow, dec = by_epoch(runs(rows, GROWTH), "noise_scale"), by_epoch(runs(rows, DECAY), "noise_scale")
    ratios = [(e, g / d) for (e, g), (_, d) in zip(grow, dec) if d > 0]
    worst = max(ratios, key=lambda t: abs(math.log(t[1])))
    ok = all(0.8 <= r <= 1.25 for _, r in ratios)
    return ("growing B by the factor the rate would decay by keeps the noise scale "
            "g = lr / (1 - m) (N / B - 1) on the decay's path (within 25 %)",
            "growth / decay per epoch: " + ", ".join(f"{r:.2f}" for _, r in ratios), ok,
            f"furthest apart at epoch {worst[0]} ({worst[1]:.2f}x): g is proportional to "
            f"N / B - 1, not to 1 / B, so a batch that is a sizeable share of the training set "
            f"lowers g by more than the factor it grew by")


# -- tables ------------------------------------------------------------------------------
def sweep_table(rows: list[Row], meta: Meta) -> str:
    goal = target(rows)
    lr, base = float(meta.get("lr", math.nan)), float(meta.get("base_batch", math.nan))
    body = []
    for b in batches(rows):
        plain, ruled = runs(rows, UNSCALED, b), runs(rows, SCALED, b)
        body.append((b, f"{by_epoch(plain, 'updates')[0][1]:.0f}", f"{lr * b / base:g}",
                     md.pct_spread(final(plain)),
                     md.pct_spread(final(ruled)) if ruled else "(not run: rule = identity)",
                     seconds(time_to(plain, goal)),
                     seconds(time_to(ruled, goal)) if ruled else "-",
                     f"{epoch_s(rows, b):.2f}"))
    return md.table(("global batch", "steps / epoch", "peak rate with linear scaling",
                     "test acc. unscaled", "test acc. linear + warm-up",
                     f"time to {md.pct(goal)} unscaled (s)", f"time to {md.pct(goal)} linear (s)",
                     "median epoch (s)"), body)


def schedule_table(rows: list[Row]) -> str:
    decay, growth = runs(rows, DECAY), runs(rows, GROWTH)
    cols = ("batch_size", "lr", "noise_scale", "updates", "test_accuracy")
    d = {k: by_epoch(decay, k) for k in cols}
    g = {k: by_epoch(growth, k) for k in cols}
    body = [(e, f"{d['batch_size'][i][1]:.0f} / {d['lr'][i][1]:g} / {d['noise_scale'][i][1]:.2f}",
             f"{g['batch_size'][i][1]:.0f} / {g['lr'][i][1]:g} / {g['noise_scale'][i][1]:.2f}",
             f"{d['updates'][i][1]:.0f} / {g['updates'][i][1]:.0f}",
             f"{md.pct(d['test_accuracy'][i][1])} / {md.pct(g['test_accuracy'][i][1])}")
            for i, (e, _) in enumerate(d["lr"]) if i < len(g["lr"])]
    return md.table(("epoch", "decay: B / lr / g", "growth: B / lr / g", "updates decay / growth",
                     "test acc. decay / growth"), body)


def finals_table(rows: list[Row]) -> str:
    goal = target(rows)
    body = [(name, md.pct_spread(final(runs(rows, name))),
             f"{final(runs(rows, name), 'updates')['mean']:.0f}",
             f"{final(runs(rows, name), 'samples_seen')['mean']:.0f}",
             seconds(time_to(runs(rows, name), goal)))
            for name in SCHEDULES if runs(rows, name)]
    return md.table(("schedule", "final test accuracy", "parameter updates", "samples seen",
                     f"time to {md.pct(goal)} (s)"), body)


#: the seed's and the papers' figures, beside ours in the report (docs/studies.md#seed003)
PAPERS: tuple[tuple[str, str, str], ...] = (
    ("accuracy vs global batch", "ImageNet, ResNet-50: accuracy drops as the total batch "
     "grows; Facebook kept it up to 8K on 256 GPUs, PFN up to 32K on 1024 GPUs",
     "seed 003 (Goyal et al. 2017; Akiba et al. 2017)"),
    ("linear scaling + gradual warm-up", "lr x k for a batch k times larger, ramped from lr "
     "over the first 5 epochs; no loss of accuracy up to 8192 images", "Goyal et al. 2017"),
    ("batch growth vs decay", "same learning curves and test accuracy after the same epochs, "
     "with fewer parameter updates; Inception-ResNet-V2 to 77 % in under 2500 updates with "
     "batches of 65536", "Smith et al. 2018; seed 003"),
    ("noise scale", "g = eps / (1 - m) (N / B - 1): growing B lowers g as decaying eps does",
     "seed 003 (Smith and Le 2018)"),
)


def papers_table() -> str:
    return md.table(("what", "seed / papers", "source"), PAPERS)


def describe(meta: Meta) -> dict[str, Any]:
    """The setup line of the report, from experiment.json."""
    return {k: meta.get(k, "?") for k in ("dataset", "model", "ranks", "epochs", "lr",
                                         "base_batch", "warmup_epochs", "momentum",
                                         "train_size", "test_size", "gamma", "every")}
