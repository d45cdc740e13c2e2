"""`compressors`' plan, time to accuracy and verdicts from fabricated rows (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.experiments.base import Settings
from approxdist.experiments.compressors import WIRES, plan, sections
from approxdist.experiments.compressors_report import cells, report, trend_rows

SLOW = "bw=100mbit"


def _runs(wire: str, acc: list[float], times: list[float], task: str = "mnist1d",
          nbytes: float = 100.0) -> tuple[dict[str, object], list[dict[str, object]]]:
    """A run of 1 seed: its final row and its per-epoch curve."""
    keys = {"task": task, "link": SLOW, "wire": wire, "seed": 0}
    curve = [{**keys, "epoch": e + 1, "elapsed_s": t, "test_accuracy": a}
             for e, (a, t) in enumerate(zip(acc, times))]
    row = {**keys, "final_accuracy": acc[-1], "final_loss": 1.0, "wall_time_s": times[-1],
           "bytes_sent": nbytes, "lr": 0.05}
    return row, curve


def _table() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    made = [_runs("fp32", [0.5, 0.7, 0.80], [10, 20, 30], nbytes=1000),
            _runs("powersgd:2", [0.6, 0.795, 0.80], [4, 8, 12], nbytes=20),
            _runs("topk:0.01", [0.5, 0.6, 0.70], [5, 10, 15], nbytes=50),
            _runs("qsgd:7", [0.6, 0.792, 0.795], [6, 12, 18], nbytes=150),
            _runs("sign+ef", [0.5, 0.7, 0.79], [5, 10, 15], nbytes=40),
            _runs("signsgd", [0.4, 0.5, 0.60], [5, 10, 15], nbytes=32)]
    return [r for r, _ in made], [c for _, cs in made for c in cs]


def test_time_to_fp32s_accuracy_minus_one_point() -> None:
    rows, curves = _table()
    cs = cells(rows, curves)
    assert cs[("mnist1d", SLOW, "fp32")].time == 30  # 0.80 - 0.01 first reached at epoch 3
    assert cs[("mnist1d", SLOW, "powersgd:2")].time == 8  # 0.795 >= 0.79 at epoch 2
    assert cs[("mnist1d", SLOW, "qsgd:7")].time == 12
    assert cs[("mnist1d", SLOW, "topk:0.01")].time != cs[("mnist1d", SLOW, "topk:0.01")].time


def test_each_claim_gets_a_computed_verdict() -> None:
    rows, curves = _table()
    verdicts = {claim.split(": ", 1)[1][:20]: (ours, ok)
                for claim, ours, ok, _ in trend_rows(cells(rows, curves))}
    assert verdicts["rank-2 PowerSGD reac"][1] is True
    assert verdicts["99 % of the gradient"] == ("70.0 % vs fp32 80.0 % (-10.0 pts)", False)
    assert verdicts["4-bit QSGD trains to"][1] is True       # 12 s < 30 s, -0.5 pts
    assert verdicts["ternary gradients wi"][1] is None       # not run: not measured
    assert verdicts["error feedback makes"][1] is True        # -1.0 pt, above signsgd
    assert verdicts["signSGD with majorit"][1] is False       # never reached the target
    ours, ok = verdicts["at least one compres"]
    assert ok is True and ours.startswith("fastest: powersgd:2, 0.27x")


def test_a_diverged_run_is_named_not_reported_as_an_accuracy() -> None:
    rows, curves = _table()
    row, curve = _runs("terngrad", [0.1, 0.0, 0.0], [5, 10, 15])
    rows.append({**row, "final_loss": float("nan")})
    cs = cells(rows, [*curves, *curve])
    assert cs[("mnist1d", SLOW, "terngrad")].accuracy() == "0.0 % (n=1) (1 of 1 diverged)"
    (claim,) = [t for t in trend_rows(cs) if "ternary" in t[0]]
    assert claim[2] is False and claim[3] == ("diverged in 1 of 1 run(s): the loss became "
                                              "non-finite")
    assert cs[("mnist1d", SLOW, "fp32")].accuracy() == "80.0 % (n=1)"


def test_the_report_is_built_from_the_rows_alone(tmp_path: Path) -> None:
    rows, curves = _table()
    meta = {"seeds": [0], "sign_lr": 0.01, "tasks": {"mnist1d": {
        "data": {"batch_size": 64}, "model": {"name": "mlp", "hidden": 256}, "optim": {"lr": 0.05},
        "epochs": 3, "fp32": ["*.bias"]}}}
    body = report(tmp_path, meta, rows, curves, [w.label for w in WIRES])
    assert (tmp_path / "compressors.png").is_file()
    assert "mnist1d (mlp hidden 256, batch 64, lr 0.05, 3 epoch(s); in fp32: *.bias)" in body
    assert "| mnist1d | 100mbit | `powersgd:2` | 80.0 % (n=1) | 8.0 | 0.27x | 12.0 | 0.020 |" \
        in body
    assert "/tmp" not in body and "docs/compressors.md" in body


@pytest.mark.parametrize("size", ["smoke", "quick", "full"])
def test_every_task_and_link_has_its_fp32_reference(size: str, tmp_path: Path) -> None:
    runs = plan(Settings(tmp_path, size=size))
    for task, link in {(t.name, lk) for t, lk, _ in runs}:
        assert any((t.name, lk, w.label) == (task, link, "fp32") for t, lk, w in runs)
    if size != "smoke":
        assert len(runs) == 2 * 2 * len(WIRES)


def test_a_compressor_sends_the_vectors_in_fp32_and_signsgd_its_own_rate(tmp_path: Path) -> None:
    runs = plan(Settings(tmp_path, size="quick"))
    by = {(t.name, w.label): (t, w) for t, _, w in runs}
    gpt = sections(*by[("gpt-tiny", "powersgd:2")][:1], SLOW, by[("gpt-tiny", "powersgd:2")][1], 0)
    assert gpt["wire"]["grad"]["rules"] == ["*.bias=fp32", "type:LayerNorm=fp32"]
    assert gpt["comm"]["link"] == SLOW and gpt["train"]["world_size"] == 2
    base = sections(by[("mnist1d", "fp32")][0], SLOW, by[("mnist1d", "fp32")][1], 0)
    sign = sections(by[("mnist1d", "signsgd")][0], SLOW, by[("mnist1d", "signsgd")][1], 0)
    assert "rules" not in base["wire"]["grad"]
    assert sign["optim"]["lr"] == pytest.approx(base["optim"]["lr"] * 0.01)
    four = sections(by[("mnist1d", "bits4+ef")][0], SLOW, by[("mnist1d", "bits4+ef")][1], 0)
    assert four["wire"]["grad"] == {"codec": "bits:auto4", "error_feedback": True}
