"""Zero-bubble pipelines in one process: the split backward (I, then W) against a whole
backward, with recomputation and on shared weights; a stage that cannot be split; the
ZB-H1 / ZB-H2 schedules on paper (bubble, idle steps, memory, W never communicates) and
the validator's split rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import Action, Kind, build_schedule, parse_actions
from approxdist.pipeline.schedule.grid import idle_within, split_bubble, timeline_of
from approxdist.pipeline.schedule.simulate import simulate
from approxdist.pipeline.schedule.validate import check_schedule
from approxdist.pipeline.schedule.zero_bubble import check_microbatches
from approxdist.pipeline.split_backward import SplitBackwardError
from approxdist.pipeline.stage import StageCompute
from tests.helpers.user_models import Scale

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 9)]


def _stage(shared: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    first = nn.Linear(6, 16)
    layers = [first, nn.BatchNorm1d(16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 6), nn.ReLU()]
    if shared:  # the first layer's weights used twice: one parameter, two joints
        layers.append(first)
    return nn.Sequential(*layers, nn.Linear(16 if shared else 6, 4))


def _run(split: bool, is_first: bool, is_last: bool, recompute: bool, shared: bool = False,
         fuse: str = "auto", batched: bool = False
         ) -> tuple[nn.Module, list[torch.Tensor | None], float, StageCompute]:
    """Two micro-batches through one stage: forwards, then (split) I of both and W of both
    (`batched`: the two Ws' fused GEMMs as one), or whole backwards; returns the module, the
    input gradients and the loss."""
    model = _stage(shared)
    c = StageCompute(model, is_first=is_first, is_last=is_last, loss_fn=F.cross_entropy,
                     recompute=recompute, split=split, fuse_accumulation=fuse)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 6, generator=gen) for _ in range(2)]
    ys = [torch.randint(0, 4, (5,), generator=gen) for _ in range(2)]
    grads = [None if is_last else torch.randn(5, 4, generator=gen) for _ in range(2)]
    torch.manual_seed(3)
    for m in range(2):
        c.forward(m, xs[m], ys[m], 0.5)
    if split:
        dx = [c.backward_input(m, grads[m]) for m in range(2)]
        assert all(p.grad is None for p in model.parameters()), "I touched a weight gradient"
        for m in range(2):
            c.backward_weight(m, flush=not batched or m == 1)
    else:
        dx = [c.backward(m, grads[m]) for m in range(2)]
    return model, dx, float(c.loss_sum), c


@pytest.mark.parametrize("is_first, is_last", [(False, True), (False, False), (True, True),
                                               (True, False)])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("fuse, batched", [("off", False), ("all", False), ("all", True)])
def test_split_backward_equals_the_whole_backward(is_first: bool, is_last: bool,
                                                   recompute: bool, shared: bool, fuse: str,
                                                   batched: bool) -> None:
    """Against an unfused whole backward; `all`: the split stage's linear layers defer
    their weight GEMMs to W (`batched`: both micro-batches' in one GEMM)."""
    whole, dx_whole, loss_whole, _ = _run(False, is_first, is_last, recompute, shared, "off")
    split, dx_split, loss_split, c = _run(True, is_first, is_last, recompute, shared, fuse,
                                          batched)
    assert loss_split == loss_whole
    for a, b in zip(dx_whole, dx_split):
        if is_first:
            assert b is None
        else:
            assert a is not None and b is not None
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    for (name, p), q in zip(whole.named_parameters(), split.parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-6, msg=name)
    assert c.in_flight == 0 and c.memory.live == 0


def test_input_gradient_is_there_before_weights_and_memory_waits_for_w() -> None:
    c = StageCompute(_stage(), is_first=False, is_last=True, loss_fn=F.cross_entropy, split=True)
    c.forward(0, torch.randn(4, 6), torch.randint(0, 4, (4,)), 1.0)
    held = c.memory.live
    dx = c.backward_input(0, None)
    assert dx is not None and dx.shape == (4, 6)
    assert c.in_flight == 1 and c.memory.live == held  # the graph waits for W
    c.backward_weight(0)
    assert c.in_flight == 0 and c.memory.live == 0


def test_a_backward_that_writes_weight_gradients_itself_is_refused() -> None:
    scale = nn.Sequential(Scale(6), nn.Linear(6, 4))
    c = StageCompute(scale, is_first=False, is_last=True, loss_fn=F.cross_entropy, split=True)
    c.forward(0, torch.randn(4, 6), torch.randint(0, 4, (4,)), 1.0)
    with pytest.raises(SplitBackwardError, match=r"wrote the gradient of a parameter of shape "
                                                 r"\(6,\) while computing only its input "
                                                 r"gradient .* use a schedule with whole "
                                                 r"backwards \(1f1b, gpipe\)"):
        c.backward_input(0, None)


def test_a_stage_without_parameters_splits() -> None:
    c = StageCompute(nn.Sequential(nn.ReLU()), is_first=False, is_last=False,
                     loss_fn=F.cross_entropy, split=True)
    c.forward(0, torch.randn(3, 4), None, 1.0)
    dx = c.backward_input(0, torch.ones(3, 4))
    c.backward_weight(0)
    assert dx is not None and c.in_flight == 0


def test_a_split_stage_defers_its_fused_weight_gemms_to_w() -> None:
    """I keeps (x, g) per fused layer and leaves .grad alone; W of several micro-batches
    without a flush holds them (and their memory) until one GEMM per layer runs."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    c = StageCompute(model, is_first=False, is_last=True, loss_fn=F.cross_entropy,
                     fuse_accumulation="all", split=True)
    assert c.deferred is not None
    for m in range(3):
        c.forward(m, torch.randn(4, 8), torch.randint(0, 3, (4,)), 1.0)
        c.backward_input(m, None)
    assert [len(c.deferred.pending[m]) for m in range(3)] == [2, 2, 2]
    assert all(p.grad is None for p in model.parameters())
    c.backward_weight(0, flush=False)
    c.backward_weight(1, flush=False)
    assert all(p.grad is None for p in model.parameters()) and c.memory.live > 0
    c.backward_weight(2)
    assert c.deferred.pending == {} and c.in_flight == 0 and c.memory.live == 0
    assert all(p.grad is not None and not p.grad.requires_grad for p in model.parameters())


# -- schedules on paper ---------------------------------------------------------------------

@pytest.mark.parametrize("p, m", SIZES)
def test_zbh1_bubble_is_a_third_of_1f1b_per_microbatch(p: int, m: int) -> None:
    """Unit F, I and W: from M >= P on ZB-H1's step is 3M + P - 1 slots, idle
    (P-1)/(3M+P-1); never longer than 1F1B's with its backward as long as I + W."""
    from approxdist.pipeline.schedule import Durations

    t = timeline_of(build_schedule("zbh1", p, m), p)
    flush = simulate(build_schedule("1f1b", p, m), p, Durations(backward=2.0))
    assert t.makespan <= flush.makespan
    if m >= p:
        assert t.makespan == 3 * m + p - 1
        assert t.bubble_fraction() == pytest.approx(split_bubble(p, m))


@pytest.mark.parametrize("p, m", [(p, m) for p, m in SIZES if m >= 2 * p - 1])
def test_zbh2_leaves_no_idle_step_inside_any_rank(p: int, m: int) -> None:
    order = build_schedule("zbh2", p, m)
    assert set(idle_within(timeline_of(order, p)).values()) == {0.0}
    assert idle_within(timeline_of(build_schedule("zbh1", p, m), p))[0] == (p - 1 if m > 1 else 0)


@pytest.mark.parametrize("p, m", SIZES)
def test_memory_zbh1_within_1f1b_peak_zbh2_within_twice(p: int, m: int) -> None:
    from approxdist.pipeline.schedule import peak_in_flight

    one_f_one_b = max(peak_in_flight(build_schedule("1f1b", p, m)).values())
    assert max(peak_in_flight(build_schedule("zbh1", p, m)).values()) <= one_f_one_b
    assert max(peak_in_flight(build_schedule("zbh2", p, m)).values()) <= min(2 * p - 1, m)


@pytest.mark.parametrize("name", ["zbh1", "zbh2"])
@pytest.mark.parametrize("p, m", SIZES)
def test_w_never_communicates_and_follows_its_i(name: str, p: int, m: int) -> None:
    order = build_schedule(name, p, m)
    for r, actions in order.items():
        assert not any(a.kind is Kind.BACKWARD for a in actions)
        at = {a: i for i, a in enumerate(actions)}
        for mb in range(m):
            w, i = Action(r, Kind.BACKWARD_WEIGHT, mb), Action(r, Kind.BACKWARD_INPUT, mb)
            assert at[i] < at[w]
            if r > 0:  # the gradient goes back right after I, not after W
                assert at[Action(r, Kind.SEND_GRAD, mb)] == at[i] + 1


def test_validator_rules_for_split_backwards() -> None:
    def rules(text0: str, text1: str) -> list[str]:
        order = {0: parse_actions(text0), 1: parse_actions(text1)}
        return [v.rule for v in check_schedule(order, 2, 1)]

    good = ("0F0 0SF0 0RB0 0I0 0W0", "1RF0 1F0 1I0 1SB0 1W0")
    assert rules(*good) == []
    assert rules("0F0 0SF0 0RB0 0W0 0I0", good[1]) == ["weight-after-input"]
    assert rules("0F0 0SF0 0RB0 0I0", good[1]) == ["once"]  # W missing
    assert rules("0F0 0SF0 0RB0 0I0 0W0 0B0", good[1]) == ["once"]  # both kinds
    assert rules(good[0], "1RF0 1F0 1W0 1SB0 1I0") == ["weight-after-input",
                                                       "send-after-compute"]
    assert Action.parse("1W3") == Action(1, Kind.BACKWARD_WEIGHT, 3) and str(Action.parse("0I2"))
    assert simulate({0: parse_actions(good[0]), 1: parse_actions(good[1])}, 2).completed


def test_zbh2_needs_2p_minus_1_microbatches() -> None:
    check_microbatches("zbh2", 3, 5)
    check_microbatches("zbh1", 3, 1)
    with pytest.raises(ScheduleError, match=r"^zbh2 at 3 stages needs at least 5 micro-batches "
                                            r"\(2P - 1, to fill its warm-up\) but got 4; use "
                                            r"--microbatches 5 or more, or zbh1$"):
        check_microbatches("zbh2", 3, 4)


def test_replicated_stages_all_reduce_after_their_last_w() -> None:
    from approxdist.pipeline.schedule.replicated import replicated_schedule
    from approxdist.topology.dealing import Dealing

    order = replicated_schedule("zbh1", Dealing((2, 1)), 4)
    for slot in (0, 1):
        actions = order[slot]
        last_w = [a for a in actions if a.kind is Kind.BACKWARD_WEIGHT][-1]
        assert actions[-1] == Action(0, Kind.ALL_REDUCE, last_w.microbatch)
    assert not any(a.kind is Kind.ALL_REDUCE for a in order[2])
