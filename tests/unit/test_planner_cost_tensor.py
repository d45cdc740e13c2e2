"""The cost of a tp axis (`planner.cost.tensor`, `planner.tp_layout`): bytes per step equal
a hand count from the layer shapes and the codec's bits, the compute divided by tp, and the
plan's choice among data, pipeline and tensor splits as the link and model make it."""

from __future__ import annotations

import pytest

from approxdist.config.loader import load_config
from approxdist.errors import ConfigError
from approxdist.planner.cost import CodecCost, LinkLevel, Network, allreduce_time
from approxdist.planner.cost.tensor import (
    TPBlock,
    TPLayout,
    TPOptions,
    TPSite,
    shard_profile,
    site_costs,
    tp_time,
)
from approxdist.planner.objective import SolverSettings
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.search import TensorSpace, search
from approxdist.planner.tp_layout import layout_of

HEADER = 16  # bytes of a framed codec's header (bf16, fp8): per message
FP8_SCALE = 4  # fp8's per-tensor power-of-two scale, after the header
LINK = Network(LinkLevel.from_link("inter", "bw=1gbit,lat=10us"))


def layout(model: str, dataset: str, micro_batch: int, sizes: tuple[int, ...] = (2, 4)
           ) -> TPLayout:
    cfg = load_config(None, {"model": {"name": model}, "data": {"dataset": dataset}}, {})
    return layout_of(cfg.model, cfg.data, micro_batch, "", sizes)


def ring_bytes(values: int, tp: int, bytes_per_value: float, header: int) -> int:
    """One rank's bytes in a ring all-reduce of `values` on `tp` ranks: 2 (tp - 1) messages
    of values / tp each (reduce-scatter, then all-gather)."""
    return 2 * (tp - 1) * (header + int(values // tp * bytes_per_value))


def sent(lay: TPLayout, micro_batch: int, options: TPOptions) -> dict[str, int]:
    costs = site_costs(lay, micro_batch, options, LINK.level(range(options.tp)), options.tp)
    return {d: sum(c.wire_bytes for c in costs if c.site.direction == d) for d in ("fwd", "bwd")}


@pytest.mark.parametrize("tp", [2, 4])
def test_mlp_wire_bytes_equal_a_hand_count(tp: int) -> None:
    """mlp (64 inputs, 3 hidden layers of 256, 10 classes) in its column-row pairs:
    0.1 colwise (its input is the data: no backward all-reduce), 1.0 rowwise (forward: 256
    outputs), 2.0 colwise (backward: its 256 inputs' gradient), 3.0 rowwise (forward: 10
    logits); 16 samples; forward on bf16 (2 bytes a value + the header), backward fp32."""
    lay = layout("mlp", "digits", 16)
    assert [(s.layer, s.direction, s.values) for s in lay.sites] == [
        ("1.0", "fwd", 256), ("2.0", "bwd", 256), ("3.0", "fwd", 10)]
    options = TPOptions(tp, CodecCost.of("bf16"), CodecCost.of("fp32"), "ring")
    assert sent(lay, 16, options) == {
        "fwd": ring_bytes(16 * 256, tp, 2, HEADER) + ring_bytes(16 * 10, tp, 2, HEADER),
        "bwd": ring_bytes(16 * 256, tp, 4, 0)}
    # every split layer's weight is split, a row-parallel bias is whole on each shard
    assert [p for b in lay.blocks for p in b.params] == [
        (256 * 64 * 4, True), (256 * 4, True), (256 * 256 * 4, True), (256 * 4, False),
        (256 * 256 * 4, True), (256 * 4, True), (10 * 256 * 4, True), (10 * 4, False)]


def test_gpt_tiny_costs_four_all_reduces_of_the_activation_per_block() -> None:
    """gpt-tiny (2 blocks, 64 tokens of width 64): attention by heads and the MLP's column-
    row pair each all-reduce T x d values forward and backward; fp8 forward (1 byte a value,
    the header and its scale)."""
    lay = layout("gpt-tiny", "stdlib-text", 2, (2, 3, 4))
    values = 64 * 64
    assert [(s.block, s.direction, s.values) for s in lay.sites] == \
        [(b, d, values) for b in (1, 2) for d in ("fwd", "fwd", "bwd", "bwd")]
    options = TPOptions(2, CodecCost.of("fp8-e5m2"), CodecCost.of("fp32"), "ring")
    assert sent(lay, 2, options) == {"fwd": 4 * ring_bytes(2 * values, 2, 1, HEADER + FP8_SCALE),
                                     "bwd": 4 * ring_bytes(2 * values, 2, 4, 0)}
    assert dict(lay.refused)[3].startswith("tp size 3 does not divide the 4 attention heads")
    with pytest.raises(ConfigError, match="tp size 3 does not divide"):
        lay.check(3)


def toy(params: int, values: int, blocks: int = 4) -> tuple[Profile, TPLayout]:
    """`blocks` blocks of 10 ms forward, 20 ms backward on 32 samples, each wholly split
    (one colwise-rowwise pair: an all-reduce of `values` per sample each way, none backward
    in the first block, whose input is the data)."""
    profile = Profile("toy", (8,), 32, 1, "test", "test", tuple(
        BlockProfile(f"b{i}", 0.01, 0.02, 4 * values * 32, params, 0, 0.0, (params,))
        for i in range(blocks)))
    sites = tuple(TPSite(i, f"{i}.fc", d, values) for i in range(blocks)
                  for d in ("fwd", "bwd") if i or d == "fwd")
    return profile, TPLayout("toy", (("fc", "colwise"),),
                             tuple(TPBlock(1.0, ((params, True),)) for _ in range(blocks)),
                             sites)


def test_a_shard_computes_a_tp_th_and_waits_for_each_all_reduce() -> None:
    profile, lay = toy(1 << 20, 256)
    shard = shard_profile(profile, lay, 4)
    assert [(b.fwd_s, b.bwd_s, b.param_bytes) for b in shard.blocks] == \
        [(pytest.approx(0.0025), pytest.approx(0.005), 1 << 18)] * 4
    options = TPOptions(4, algorithm="ring")
    t = tp_time(profile, lay, 1, LINK, options)  # one replica: no gradient all-reduce
    one = allreduce_time(LINK.level(range(4)), "ring", 4, 256 * 32)
    assert t.collectives == 7 and t.compute_s == pytest.approx(4 * 0.0075)
    assert t.collective_s == {"fwd": pytest.approx(4 * one), "bwd": pytest.approx(3 * one)}
    assert t.step_s == pytest.approx(t.compute_s + 7 * one)
    assert t.samples_per_step == 32
    # two replicas of tp = 2: each shard's half of the gradients crosses the dp group
    t2 = tp_time(profile, lay, 2, LINK, TPOptions(2, algorithm="ring"))
    assert t2.samples_per_step == 64 and t2.dp.buckets and t2.step_s > t2.compute_s


def test_a_layout_of_another_model_is_refused() -> None:
    profile, lay = toy(1 << 20, 256)
    other, _ = toy(1 << 20, 256, blocks=3)
    with pytest.raises(ConfigError, match="has 4 blocks but profile 'toy' has 3"):
        shard_profile(other, lay, 2)


def best_per_mode(params: int, values: int, link: str, sizes: tuple[int, ...] = (2, 4),
                  refused: tuple[tuple[int, str], ...] = ()) -> list[tuple[str, int]]:
    profile, lay = toy(params, values)
    if refused:
        lay = TPLayout(lay.model, lay.plan, lay.blocks, lay.sites, refused)
    ranked = search(profile, SolverSettings(4, Network(LinkLevel.from_link("inter", link))),
                    ("1f1b", "gpipe"), (4, 8, 16), TensorSpace(lay, sizes, "ring"))
    return [(p.mode, p.tp) for p in ranked]


@pytest.mark.parametrize(("params", "values", "link", "chosen"), [
    # little to all-reduce between replicas, a 2 MB activation per split layer: data
    (1 << 10, 1 << 14, "bw=1gbit,lat=1us", ("dp", 1)),
    # 64 MB of gradients per block, 64 B activations on a fast link: tensor over 4 ranks
    (64 << 20, 16, "bw=10gbit,lat=1us", ("tensor", 4)),
    # the same gradients, 512 KB activations on 100 Mbit/s: a pipeline sends one per cut
    (64 << 20, 1 << 12, "bw=100mbit,lat=1ms", ("pipeline", 1)),
])
def test_the_plan_flips_with_the_link_and_the_model(params: int, values: int, link: str,
                                                     chosen: tuple[str, int]) -> None:
    ranked = best_per_mode(params, values, link)
    assert ranked[0] == chosen
    assert {m for m, _ in ranked} >= {"dp", "tensor", "pipeline"}  # every mode was priced


def test_tp_times_dp_where_the_plan_cannot_split_over_every_rank() -> None:
    assert best_per_mode(8 << 20, 256, "bw=10gbit,lat=1us")[0] == ("tensor", 4)
    ranked = best_per_mode(8 << 20, 256, "bw=10gbit,lat=1us",
                           refused=((4, "tp size 4 does not divide the 6 heads"),))
    assert ranked[0] == ("tensor", 2) and ("tensor", 4) not in ranked
