"""Reports from CSVs alone: each preset's render on made-up rows, and its computed verdicts.

No run happens here: the rows are written as the presets document them, `render_report`
draws the PNGs and the Markdown, and the trend verdicts must follow the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.experiments import render_report
from approxdist.experiments import seed003_largebatch_report as rep
from approxdist.experiments.csvio import write_csv
from approxdist.experiments.link_check import COLUMNS as LINK_COLUMNS
from approxdist.experiments.runner import META_FILE
from approxdist.experiments.seed000_bandwidth import COLUMNS as BW_COLUMNS
from approxdist.experiments.seed000_ber import COLUMNS as BER_COLUMNS
from approxdist.experiments.seed000_bits import COLUMNS as BITS_COLUMNS
from approxdist.experiments.seed000_bits import SCHEMES
from approxdist.experiments.seed001_allreduce import COLUMNS as AR_COLUMNS
from approxdist.experiments.seed001_scaling import COLUMNS as SC_COLUMNS
from approxdist.experiments.seed002_hybrid import COLUMNS as HY_COLUMNS
from approxdist.experiments.seed002_hybrid import trend_rows

TASK = {"key": "mnist1d", "dataset": "mnist1d", "model": {"name": "resnet1d", "width": 4},
        "split": "2", "epochs": 2, "batch_size": 64, "lr": 0.1, "microbatches": 4,
        "schedule": "gpipe", "cut": "after block 1", "why": "Why this task: test."}


def _meta(out: Path, name: str, **extra: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": name, "settings": {"out": str(out), "size": "quick", "data_dir": "",
                                             "seeds": 0},
            "machine": {"cpus": 2, "torch": "x", "cuda": False, "load_avg_1min_at_start": 1.0},
            "command": f"approxdist experiment {name} --quick", "started": "now",
            "duration_s": 1.0, **extra}
    (out / META_FILE).write_text(json.dumps(meta))


def _epochs(keys: dict[str, Any], final: float, seeds: int = 3) -> list[dict[str, Any]]:
    return [{**keys, "seed": s, "epoch": e, "train_accuracy": final * e / 2 + 0.001 * s,
             "test_accuracy": final * e / 2 - 0.001 * s, "train_loss": 1.0, "test_loss": 1.0,
             "epoch_time_s": 1.0, "bytes_fwd": 1e5} for s in range(seeds) for e in (1, 2)]


def _pngs(out: Path) -> list[Path]:
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.stat().st_size > 10_000 for p in pngs)
    return pngs


def test_bits_report(tmp_path: Path) -> None:
    finals = {"fp32": 0.93, "no-sign 8+0": 0.92, "sign 1+7": 0.10, "proposed 2+2": 0.85}
    rows = [r for s in SCHEMES if s.name in finals
            for r in _epochs({"scheme": s.name, "codec": s.codec, "bits_per_value": s.bits},
                             finals[s.name])]
    _meta(tmp_path, "seed000-bits", task=TASK, seeds=[0, 1, 2])
    write_csv(tmp_path / "curves.csv", BITS_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    assert len(_pngs(tmp_path)) == 2
    assert ("| proposed 2+2 | `bits:s0e2+2m0` | 4 | 85.1 ± 0.1 % (n=3) | 84.9 ± 0.1 % (n=3) | "
            "-8.0 pts | -0.8 / -1.0 pts |") in text
    assert "| no exponent bits (sign 1+7): does not learn, ~10 % | 9.9 ± 0.1 % (n=3) | holds |" in text
    assert "| the 4-bit proposal is within ~2 points of 8-bit no-sign 8+0 | -7.0 pts" in text
    assert "**does not hold here**" in text and "Why this task: test." in text


def test_ber_report(tmp_path: Path) -> None:
    finals = {(0.0, 32): 0.93, (1e-5, 2): 0.3, (1e-5, 5): 0.925, (1e-5, 9): 0.93,
              (1e-4, 2): 0.2, (1e-4, 5): 0.7}
    rows = [r for (rate, p), acc in finals.items() for r in _epochs(
        {"protected_bits": p, "ber": rate, "channel": f"ber:{rate:g}@{p}"}, acc)]
    _meta(tmp_path, "seed000-ber", task=TASK, seeds=[0, 1, 2], rates=[1e-5, 1e-4])
    write_csv(tmp_path / "ber.csv", BER_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    _pngs(tmp_path)
    assert "| 1e-05 | top 5 bits protected | 92.6 ± 0.1 % (n=3) | 92.4 ± 0.1 % (n=3) | -0.5 pts |" \
        in text
    assert "(rate 1e-05) | worst of P >= 5: P = 5, train -0.5 pts | holds |" in text
    assert "(rate 0.0001) | worst of P >= 5: P = 5, train -23.0 pts | **does not hold here** |" \
        in text
    assert "| fewer protected bits hurt (rate 1e-05) | P = 2: train -63.0 pts, test -63.0 pts | " \
        "holds |" in text


def test_bandwidth_report(tmp_path: Path) -> None:
    rows = []
    for link, bps, t in (("1gbit", 1e9, 2.0), ("500mbit", 5e8, 2.1), ("2mbit", 2e6, 20.0)):
        for config, fwd, bwd, scale in (("fp32", "fp32", "fp32", 1.0),
                                        ("4-bit fwd", "bits:s0e2+2m0", "fp32", 0.6),
                                        ("4-bit fwd + bf16 bwd", "bits:s0e2+2m0", "bf16", 0.3)):
            tt = t if bps > 1e8 else 2.0 + (t - 2.0) * scale
            rows.append({"link": link, "bw_bps": bps, "config": config, "fwd_codec": fwd,
                         "bwd_codec": bwd, "epochs": 1, "epoch_time_s": tt,
                         "step_time_s": tt / 62, "compute_s_stage0": 0.01,
                         "compute_s_stage1": 0.012, "comm_s_stage0": 0.001,
                         "comm_s_stage1": 0.001, "wait_s_stage0": 0.02, "wait_s_stage1": 0.01,
                         "bytes_fwd_per_step": 4e4 * scale, "bytes_bwd_per_step": 4e4,
                         "link_time_s_per_step": 8 * 8e4 / bps})
    _meta(tmp_path, "seed000-bandwidth", task=TASK, seeds=[0], epochs_per_run=1)
    write_csv(tmp_path / "bandwidth.csv", BW_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    assert len(_pngs(tmp_path)) == 2
    assert "| 9.8x at 2mbit (20.0 s vs 2.05 s, the median over links >= 500 Mbit/s) | holds |" in text
    assert "recovers 40 % at 2mbit" in text and "recovers 70 % at 2mbit" in text
    assert "| 1gbit | fp32 | 2.00 | 0.98x |" in text and "33.29 s" in text


def test_allreduce_report(tmp_path: Path) -> None:
    times = {"native": (1.0, 10.0), "brb": (2.0, 12.0), "brd": (0.5, 20.0), "vhd": (3.0, 8.0),
             "ring": (2.5, 9.0), "auto": (0.55, 8.5)}
    rows = [{"world_size": n, "algorithm": a, "codec": "fp32", "size_bytes": size,
             "median_s": t[i] / 1e3, "p10_s": t[i] / 1e3, "busbw_gbps": 1.0,
             "ratio_vs_native": 1.0, "paired_ratio": 1.0, "repeats": 5}
            for n in (2, 4) for a, t in times.items() for i, size in enumerate((4096, 1 << 24))]
    _meta(tmp_path, "seed001-allreduce", sizes=[4096, 1 << 24], budget_s=1.0)
    write_csv(tmp_path / "allreduce.csv", AR_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    _pngs(tmp_path)
    assert "| N=4: recursive doubling (BRD) wins small messages | 4K: brd | holds |" in text
    assert "| N=2: halving-doubling (VHD) or ring wins large messages | 16M: vhd | holds |" in text
    assert "within 15 % of the best at 100 % of sizes | holds |" in text
    assert "| ring ms | auto ms |" in text and "| 2 | 4K | 1.00 | 2.00 | 0.50 | 3.00 | 2.50 | 0.55 |" in text
    assert "| N=4: picking by size (`auto`, the seed's hybrid) is as good as the best per size |" \
        in text


def test_scaling_report(tmp_path: Path) -> None:
    t = {(1, 32): 0.4, (2, 32): 0.45, (4, 32): 0.9, (1, 8): 0.12, (2, 8): 0.2, (4, 8): 0.4}
    rows = [{"nodes": n, "per_node_batch": b, "ref_batch": 32, "median_step_s": s,
             "p10_step_s": s, "steps": 3, "speedup": 0.4 / s * b / 32 * n, "ideal": n}
            for (n, b), s in t.items()]
    _meta(tmp_path, "seed001-scaling", model="alexnet", input_shape=[3, 32, 32], ref_batch=32)
    write_csv(tmp_path / "scaling.csv", SC_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    _pngs(tmp_path)
    assert "s(2,32) = 1.78 (89 % of 2) | holds |" in text
    assert "s(4,32) = 1.78 vs s(2,32) = 1.78 | **does not hold here** |" in text
    assert "s(2,8) = 1.00 vs s(2,32) = 1.78 | holds |" in text


def _hybrid_rows(model: str, plan: str, threads: str, steps: tuple[float, ...],
                 congested: tuple[int, int], wait_ms: float, stage_wait: str,
                 stage_compute: str) -> list[dict[str, Any]]:
    """One row per repeat with step time `steps[repeat]`."""
    return [{"model": model, "plan": plan, "threads": threads, "repeat": repeat,
             "stages": 1 if plan == "dp" else 2,
             "replicas": {"dp": "4", "3+1": "3,1", "2x2": "2,2"}[plan], "step_ms": step,
             "compute": 0.5, "comm": 0.1, "waiting": 0.25, "bubble": 0.15,
             "congested_rank": congested[0], "congested_stage": congested[1],
             "congested_wait_ms": wait_ms * step / steps[0], "stage_wait_ms": stage_wait,
             "stage_compute_ms": stage_compute, "host_steal": 0.01 * (repeat + 1)}
            for repeat, step in enumerate(steps)]


def _hybrid_csv(sa: tuple[float, float],
                sra: tuple[float, float] = (19.0, 22.0)) -> list[dict[str, Any]]:
    return [*_hybrid_rows("alexnet", "dp", "inline", (10.0, 10.0), (0, 0), 1.0, "1.00", "8.00"),
            *_hybrid_rows("alexnet", "3+1", "inline", (20.0, 20.0), (0, 0), 5.0, "5.00;1.00",
                          "4.00;9.00"),
            *_hybrid_rows("alexnet", "3+1", "per-message", (20.0, 22.0), (3, 1), 6.0,
                          "4.00;6.00", "4.00;9.00"),
            *_hybrid_rows("alexnet", "3+1", "sa", sa, (3, 1), 3.0, "4.00;3.00", "4.00;9.00"),
            *_hybrid_rows("alexnet", "3+1", "sra", sra, (3, 1), 4.0, "4.00;4.00",
                          "4.00;9.00"),
            *_hybrid_rows("resnet20", "2x2", "per-message", (30.0, 30.0), (1, 0), 2.0,
                          "2.00;1.00", "9.00;9.00"),
            *_hybrid_rows("resnet20", "2x2", "sa", (33.0, 33.0), (1, 0), 2.0, "2.00;1.00",
                          "9.00;9.00"),
            *_hybrid_rows("resnet20", "2x2", "sra", (32.0, 32.0), (1, 0), 2.0, "2.00;1.00",
                          "9.00;9.00")]


def test_hybrid_report_verdicts_follow_the_rows(tmp_path: Path) -> None:
    _meta(tmp_path, "seed002-hybrid", models=["alexnet", "resnet20"], skip_steps=2, repeats=2)
    write_csv(tmp_path / "hybrid.csv", HY_COLUMNS, _hybrid_csv(sa=(18.0, 19.8)))
    text = render_report(tmp_path).read_text()
    _pngs(tmp_path)
    # medians over the two repeats; spread = (max - min) / median
    assert "| alexnet | 3+1 | per-message | 21.0 | 9.5 % | 50.0 % |" in text
    assert "| 3 (1) | 6.3 | 4.00 / 6.00 |" in text
    assert "took 1.5 % of the CPU time in the median run (most 2.0 %)" in text
    # 3+1 inline: stage 0 waited most, stage 1 computes more -> the computed explanation
    assert ("congested: rank 0 (stage 0), waiting 5.0 ms per step on links in flight; waiting "
            "per stage 5.0 / 1.0 ms, computing 4.0 / 9.0 ms | **does not hold here** | stage 1 "
            "computes 9.0 ms per step against 4.0 ms") in text
    # paired over repeats: sa 18/20 and 19.8/22 -> -10 %; sra 19/20, 22/22 -> -2.5 %
    assert "alexnet 3+1: best of sa / sra (sa) -10.0 % step time vs per-message" in text
    assert "congested rank's waiting on links -50.0 % (sa) | holds |" in text
    # 2x2: +6.7 % with the best of sa / sra is outside the 5 % band -> does not hold
    assert "resnet20 2x2: best of sa / sra (sra) +6.7 % step time" in text
    assert "+0.0 % (sa) | **does not hold here** | the criterion is within 5 %" in text
    assert "mean share of the step spent waiting on links or idle in the bubble, 40.0 %" in text


def test_hybrid_report_says_how_little_the_threads_could_save() -> None:
    rows = _hybrid_csv(sa=(21.0, 23.1), sra=(19.8, 22.0))  # +5 % and -0.5 %: no 2 % gain
    trends = {t[0]: t for t in trend_rows(rows, "alexnet", "resnet20")}
    claim, ours, ok, why = next(t for k, t in trends.items() if k.startswith("fewer"))
    assert ok is False and "(sra) -0.5 % step time" in ours
    assert ("per-message's step varied by 9.5 % (max - min over median) across repeats; the "
            "most a strategy can save is what the congested rank waits on links in flight: "
            "6.3 ms of a 21.0 ms step (30.0 %) with per-message") in why


def test_link_check_report_pairs_the_shapers_and_judges_big_messages(tmp_path: Path) -> None:
    def row(kind: str, link: str, shaper: str, what: str, size: int, med: float,
            p10: float) -> dict[str, Any]:
        return {"kind": kind, "link": link, "shaper": shaper, "what": what, "size_bytes": size,
                "median_s": med, "p10_s": p10, "repeats": 5}

    rows = [row("transfer", "bw=10mbit", "inproc", "brd", 1 << 20, 0.84, 0.84),
            row("transfer", "bw=10mbit", "kernel", "brd", 1 << 20, 0.90, 0.88),
            row("transfer", "bw=10mbit", "inproc", "brd", 1 << 16, 0.05, 0.05),
            row("transfer", "bw=10mbit", "kernel", "brd", 1 << 16, 0.10, 0.09),  # small: free
            row("transfer", "bw=100mbit", "inproc", "ring", 4 << 20, 0.34, 0.34),
            row("transfer", "bw=100mbit", "kernel", "ring", 4 << 20, 0.60, 0.35),
            row("train", "bw=100mbit", "inproc", "dp resnet20", 0, 10.0, 10.0),
            row("train", "bw=100mbit", "kernel", "dp resnet20", 0, 10.5, 10.5),
            row("transfer", "bw=1gbit", "inproc", "ring", 4 << 20, 0.04, 0.04),
            row("transfer", "bw=1gbit", "kernel", "ring", 4 << 20, 0.09, 0.08)]  # not judged
    _meta(tmp_path, "link-emulation-check", links=["bw=10mbit", "bw=100mbit", "bw=1gbit"])
    write_csv(tmp_path / "links.csv", LINK_COLUMNS, rows)
    text = render_report(tmp_path).read_text()
    _pngs(tmp_path)
    assert "| transfer | bw=100mbit | ring | 4M | 340.0 | 600.0 (350.0) | 1.76x |" in text
    assert ("bw=10mbit: transfers of >= 1 MB take the same time through the emulator as "
            "through tc (within 15 %) | kernel / inproc from 1.07x to 1.07x over 1") in text
    assert "furthest: ring 4M 1.76x | **does not hold here** |" in text
    assert "the fast rounds agree, the median does not. Hypothesis: TCP losses" in text
    assert "dp resnet20: 10.00 s inproc, 10.50 s kernel, 1.05x | holds |" in text
    assert "bw=1gbit: transfers" not in text  # the criterion covers 10 and 100 Mbit/s


def test_render_names_a_missing_column(tmp_path: Path) -> None:
    _meta(tmp_path, "seed001-scaling", model="alexnet", input_shape=[3, 32, 32], ref_batch=32)
    write_csv(tmp_path / "scaling.csv", ("nodes",), [{"nodes": 1}])
    with pytest.raises(Exception, match="scaling.csv lacks column"):
        render_report(tmp_path)


# -- seed003-largebatch: the verdicts and their reasons follow the CSV --------------------------
N_TRAIN, MOMENTUM = 4000, 0.9


def _run_rows(rule: str, batch: int, accs: list[float], losses: list[float],
              batches: list[int] | None = None, lrs: list[float] | None = None,
              train_gap: float = 0.0) -> list[dict[str, Any]]:
    """One run's CSV rows, consistent with each other (updates, samples, noise scale)."""
    rows, updates, samples = [], 0, 0
    for e, (acc, loss) in enumerate(zip(accs, losses)):
        b = (batches or [batch] * len(accs))[e]
        lr = (lrs or [0.05] * len(accs))[e]
        updates += N_TRAIN // b
        samples += N_TRAIN // b * b
        rows.append({"rule": rule, "global_batch": batch, "seed": 0, "epoch": e + 1,
                     "train_accuracy": acc + train_gap, "test_accuracy": acc, "train_loss": loss,
                     "test_loss": loss, "epoch_time_s": 1.0, "bytes_fwd": 0, "batch_size": b,
                     "lr": lr, "noise_scale": lr / (1 - MOMENTUM) * (N_TRAIN / b - 1),
                     "updates": updates, "samples_seen": samples, "elapsed_s": float(e + 1)})
    return rows


LB_META = {"seeds": [0], "ranks": 2, "cores": 2, "dataset": "mnist1d", "model": {}, "epochs": 3,
           "lr": 0.05, "base_batch": 32, "warmup_epochs": 1.0, "momentum": MOMENTUM,
           "gamma": 0.2, "every": 1, "train_size": N_TRAIN, "test_size": 1000,
           "batch_norm": True}


def _largebatch_rows(scaled_512_losses: list[float], train_gap: float = 0.0) -> list[dict[str, Any]]:
    falling = [1.5, 1.0, 0.8]
    return (_run_rows(rep.UNSCALED, 32, [0.6, 0.8, 0.9], falling)
            + _run_rows(rep.SCALED, 32, [0.6, 0.8, 0.9], falling)
            + _run_rows(rep.UNSCALED, 128, [0.3, 0.5, 0.7], falling)
            + _run_rows(rep.SCALED, 128, [0.5, 0.8, 0.86], falling)
            + _run_rows(rep.UNSCALED, 512, [0.2, 0.3, 0.4], falling)
            + _run_rows(rep.SCALED, 512, [0.3, 0.2, 0.45], scaled_512_losses,
                        train_gap=train_gap)
            + _run_rows(rep.DECAY, 32, [0.6, 0.8, 0.9], falling, lrs=[0.05, 0.01, 0.002])
            + _run_rows(rep.GROWTH, 32, [0.6, 0.75, 0.8], falling, batches=[32, 160, 800]))


def _trend(rows: list[dict[str, Any]], start: str) -> tuple[str, str, bool | None, str]:
    return next(t for t in rep.trend_rows(rows, LB_META) if t[0].startswith(start))


def test_the_largebatch_report_states_what_its_csv_holds(tmp_path: Path) -> None:
    unstable = _largebatch_rows([2.0, 1.0, 1.6])
    write_csv(tmp_path / "largebatch.csv", rep.COLUMNS, unstable)
    _meta(tmp_path, "seed003-largebatch", **LB_META)
    text = render_report(tmp_path).read_text()
    assert [p.name for p in _pngs(tmp_path)] == ["decay_vs_growth.png", "largebatch.png"]
    assert "| 512 | 7 | 0.8 | 40.0 % (n=1) | 45.0 % (n=1) | not reached |" in text

    _, ours, ok, why = _trend(unstable, "without scaling rules")
    assert ours == "90.0 % (32) → 70.0 % (128) → 40.0 % (512)" and ok is True
    assert "-50.0 pts" in why and "B = 512 makes 21 updates in the run against 375" in why
    _, ours, ok, why = _trend(unstable, "B = 128 (4x)")
    assert "80 % of the loss back" in ours and ok is True and "peak rate 0.2" in why
    _, ours, ok, why = _trend(unstable, "B = 512 (16x)")
    assert "10 % of the loss back" in ours and ok is False
    assert "training loss rose at epoch 3 (1.000 → 1.600)" in why and "peak rate 0.8" in why
    assert "12.8 % of the training set" in why  # 512 / 4000
    _, ours, ok, why = _trend(unstable, "growing the batch instead")
    assert ours == "80.0 % vs 90.0 % (decay), -10.0 pts; 155 vs 375 updates (0.41x)"  # 125+25+5
    assert ok is False and "32 → 160 → 800" in why and "0.05 → 0.01 → 0.002" in why
    _, ours, ok, _ = _trend(unstable, "growing B by the factor")
    assert ours.endswith("1.00, 0.97, 0.81") and ok is True  # (N/B - 1) ratios from the rows

    _, _, ok, why = _trend(_largebatch_rows([2.0, 1.7, 1.6]), "B = 512 (16x)")  # falls steadily
    assert ok is False and "rose" not in why and "fell every epoch but ended at 1.600" in why

    lagging = _largebatch_rows([2.0, 1.7, 1.6], train_gap=0.3)  # 75 % train, 45 % test
    _, _, ok, why = _trend(lagging, "B = 512 (16x)")
    assert "training accuracy 75.0 % against 45.0 % on the test set (+30.0 pts" in why
    assert "BatchNorm's running statistics" in why and "after 21 updates at rates up to 0.05" in why
    assert "the rule brings back 70 % of the loss (75.0 % vs 40.0 % unscaled" in why
