"""`transformer-wire`'s arithmetic and verdicts from fabricated rows (no training)."""

from __future__ import annotations

import pytest

from approxdist.experiments.base import Settings
from approxdist.experiments.transformer_wire import PLACES, changes, runs, trend_rows


def _row(place: str, codec: str, bits: int, seed: int, loss: float) -> dict[str, object]:
    return {"place": place, "codec": codec, "bits_per_value": bits, "seed": seed, "epochs": 1,
            "val_loss": loss, "val_accuracy": 0.3, "train_loss": loss, "bytes_sent": 0}


def test_changes_are_against_the_same_place_and_seed() -> None:
    rows = [_row("activations", "fp32", 32, 0, 2.0), _row("activations", "fp32", 32, 1, 4.0),
            _row("activations", "bf16", 16, 0, 2.02), _row("activations", "bf16", 16, 1, 4.0),
            _row("weight gradients", "fp32", 32, 0, 3.0),
            _row("weight gradients", "fp8-e5m2", 8, 0, 3.3)]
    ch = changes(rows)
    assert ch[("activations", "bf16")]["change"] == pytest.approx((0.01 + 0.0) / 2)
    assert ch[("activations", "bf16")]["worst"] == pytest.approx(0.01)
    assert ch[("weight gradients", "fp8-e5m2")]["change"] == pytest.approx(0.1)
    trends = {t[0]: t for t in trend_rows(ch)}
    act = next(t for k, t in trends.items() if "activations" in k)
    assert act[2] is True and "within 1 %: bf16" in act[3]
    wg = next(t for k, t in trends.items() if "weight gradients" in k)
    assert wg[2] is None and wg[1] == "-"  # no 16-bit format ran there: not measured
    assert "the dearest is fp8-e5m2 (+10.00 %)" in wg[3]


def test_a_16_bit_format_over_budget_fails_the_trend() -> None:
    rows = [_row("activation gradients", "fp32", 32, 0, 2.0),
            _row("activation gradients", "fp16", 16, 0, 2.1)]
    (trend,) = trend_rows(changes(rows))
    assert trend[2] is False and "within 1 %: none" in trend[3]


def test_every_size_has_a_reference_per_place(tmp_path) -> None:
    for size in ("smoke", "quick"):
        plan = runs(Settings(tmp_path, size=size))
        places = {r.place for r in plan}
        assert all(any(r.place == p and r.codec == "fp32" for r in plan) for p in places)
    assert {r.place for r in runs(Settings(tmp_path, size="quick"))} == set(PLACES)
