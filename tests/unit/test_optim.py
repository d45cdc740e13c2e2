"""Learning-rate rules: step (Caffe), cosine, linear scaling with warm-up."""

from __future__ import annotations

import math

import pytest

from approxdist.config.schema import OptimConfig
from approxdist.train.optim import LRRule


def test_step_rule_is_caffes() -> None:
    rule = LRRule(OptimConfig(lr=0.1, schedule="step", step_size=10, gamma=0.5), 64, 5, 10)
    assert [rule(s) for s in (0, 9, 10, 25)] == pytest.approx([0.1, 0.1, 0.05, 0.025])


def test_cosine_ends_at_zero() -> None:
    rule = LRRule(OptimConfig(lr=0.2, schedule="cosine"), 64, 10, 4)
    assert rule(0) == pytest.approx(0.2)
    assert rule(20) == pytest.approx(0.1)
    assert rule(40) == pytest.approx(0.0, abs=1e-12)
    assert rule(30) == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.75)))


def test_linear_scaling_with_warmup() -> None:
    cfg = OptimConfig(lr=0.1, schedule="constant", scale_lr=True, base_batch=256, warmup_epochs=2)
    rule = LRRule(cfg, 1024, 10, 10)  # k = 4, 20 warm-up steps from 0.1 to 0.4
    assert rule(0) == pytest.approx(0.1)
    assert rule(10) == pytest.approx(0.25)
    assert rule(20) == pytest.approx(0.4)
    assert rule(99) == pytest.approx(0.4)


def test_warmup_without_scaling_starts_at_a_tenth() -> None:
    rule = LRRule(OptimConfig(lr=1.0, schedule="constant", warmup_epochs=1), 64, 10, 3)
    assert rule(0) == pytest.approx(0.1) and rule(10) == pytest.approx(1.0)


def test_noise_scale_follows_smith_and_le() -> None:
    from approxdist.train.optim import noise_scale

    # g = lr / (1 - m) * (N / B - 1)
    assert noise_scale(0.1, 0.9, 50_000, 128) == pytest.approx(1.0 * (50_000 / 128 - 1))
    # doubling the batch at the same lr about halves it, as halving lr does
    g = noise_scale(0.1, 0.9, 50_000, 128)
    assert noise_scale(0.1, 0.9, 50_000, 256) == pytest.approx(0.5 * g, rel=0.01)
    assert noise_scale(0.05, 0.9, 50_000, 128) == pytest.approx(0.5 * g)
    assert noise_scale(0.1, 0.0, 1000, 1000) == 0.0


def test_batch_growth_replaces_decay_until_the_cap_then_decays() -> None:
    from approxdist.config.schema import OptimConfig
    from approxdist.train.optim import BatchGrowth

    cfg = OptimConfig(schedule="grow", grow_every_epochs=2, gamma=0.2, max_batch=1000)
    g = BatchGrowth(cfg, batch=40, train_size=5000, multiple=4)
    assert [g.batch_at(e) for e in range(8)] == [40, 40, 200, 200, 1000, 1000, 1000, 1000]
    assert [g.lr_factor(e) for e in range(8)] == pytest.approx(
        [1, 1, 1, 1, 1, 1, 0.2, 0.2])
    assert not BatchGrowth(OptimConfig(), 40, 5000).active
    assert BatchGrowth(OptimConfig(), 40, 5000).batch_at(9) == 40
    # the cap defaults to the training set and batches stay multiples of the shards
    assert BatchGrowth(OptimConfig(schedule="grow", grow_every_epochs=1, gamma=0.5),
                       batch=6, train_size=30, multiple=4).batch_at(3) == 24


def test_batch_growth_bad_settings_name_the_key() -> None:
    from approxdist.config.schema import OptimConfig
    from approxdist.errors import ConfigError

    with pytest.raises(ConfigError, match=r"optim.schedule = 'grow' grows the batch by 1/gamma "
                       r"every optim.grow_every_epochs epochs: give grow_every_epochs >= 1"):
        OptimConfig(schedule="grow")


def test_modes_with_fixed_steps_refuse_a_growing_batch() -> None:
    from approxdist.config.loader import load_config
    from approxdist.errors import ConfigError
    from approxdist.train.check import check_parts

    grow = {"schedule": "grow", "grow_every_epochs": 1}
    for sections, what in (({"train": {"parallel": "pipeline"}, "pipeline": {"schedule": "2bw"}},
                            "the asynchronous schedule '2bw'"),
                           ({"train": {"parallel": "ps", "world_size": 2}}, "--parallel ps")):
        cfg = load_config(None, {**sections, "optim": grow})
        with pytest.raises(ConfigError, match=f"which {what} fixes when it starts"):
            check_parts(cfg)
