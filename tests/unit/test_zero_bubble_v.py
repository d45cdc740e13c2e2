"""ZB-V on paper: two chunks per rank in a V (rank r holds chunks r and 2P-1-r), no idle step
inside any rank once M >= 2P - 1, 1F1B's activation memory, receives re-posted in the
sender's order on the one link between two ranks; its refusals (odd chunks, a placement
that is not a V, too few micro-batches)."""

from __future__ import annotations

import pytest

from approxdist.config.pipeline import PipelineConfig
from approxdist.errors import ConfigError
from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.runtime import check_run
from approxdist.pipeline.schedule import Kind, build_schedule, parse_actions, peak_in_flight
from approxdist.pipeline.schedule.grid import idle_within
from approxdist.pipeline.schedule.registry import num_chunks, placement_of
from approxdist.pipeline.schedule.routes import slot_route
from approxdist.pipeline.schedule.simulate import simulate
from approxdist.pipeline.schedule.validate import check_schedule
from approxdist.pipeline.schedule.zero_bubble import check_microbatches
from approxdist.topology.dealing import Dealing, check_v

SIZES = [(p, m) for p in range(1, 5) for m in range(1, 10)]


@pytest.mark.parametrize("p, m", SIZES)
def test_zbv_is_valid_and_a_v(p: int, m: int) -> None:
    order = build_schedule("zbv", p, m)  # validated on the V placement
    assert placement_of("zbv", p) == Dealing.v(p) and num_chunks("zbv", p) == 2 * p
    for r, actions in order.items():
        assert {a.stage for a in actions} == {r, 2 * p - 1 - r}
        assert not any(a.kind is Kind.BACKWARD for a in actions)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in SIZES if m >= 2 * p - 1])
def test_zbv_leaves_no_idle_step_inside_a_rank_at_1f1bs_memory(p: int, m: int) -> None:
    """Unit F, I and W per chunk (half a stage each): a rank computes 6M slots in a step of
    6M + P - 1 (only the start and end are staggered), holding at most 2P chunk
    micro-batches, P stages' worth: 1F1B's peak."""
    order = build_schedule("zbv", p, m)
    t = simulate(order, 2 * p, route=slot_route(Dealing.v(p)))
    assert t.makespan == 6 * m + p - 1
    assert set(idle_within(t).values()) == {0.0}
    one_f_one_b = max(peak_in_flight(build_schedule("1f1b", p, m)).values())
    assert max(peak_in_flight(order).values()) <= 2 * one_f_one_b


def test_receives_follow_the_senders_order_on_the_link_between_two_ranks() -> None:
    """Rank 1 gets chunk 0's activations and chunk 3's gradients from rank 0 on one link:
    its receives are posted in the order rank 0 sends, each before its consumer."""
    order = build_schedule("zbv", 2, 4)
    sent = [a.matching() for a in order[0] if a.is_send]
    posted = [a for a in order[1] if a.is_recv and a.peer_stage in (0, 3)]
    assert posted == sent


def test_a_placement_that_is_not_a_v_is_refused() -> None:
    check_v((0, 1, 1, 0))
    with pytest.raises(ConfigError, match=r"^zbv needs the V placement chunk -> rank 0,1,1,0 "
                                          r"\(rank r holds chunks r and 2P-1-r\) but got "
                                          r"0,1,0,1; use Dealing.v\(2\)$"):
        check_v((0, 1, 0, 1))
    with pytest.raises(ConfigError, match=r"^zbv places two chunks per rank in a V but got 3 "
                                          r"chunks \(an odd number\); cut the model into 4 or 2"):
        check_v((0, 1, 0))
    # an order that puts a chunk on the wrong rank breaks the validator's `ranks` rule
    order = build_schedule("zbv", 2, 1)
    swapped = {0: order[1], 1: order[0]}
    rules = {v.rule for v in check_schedule(swapped, 4, 1, Dealing.v(2))}
    assert rules == {"ranks"}


def test_zbv_needs_2p_minus_1_microbatches_and_an_even_split() -> None:
    check_microbatches("zbv", 2, 3)
    with pytest.raises(ScheduleError, match=r"^zbv at 4 stages needs at least 7 micro-batches "
                                            r"\(2P - 1, to fill its warm-up\) but got 4"):
        check_microbatches("zbv", 4, 4)
    with pytest.raises(ConfigError, match=r"^zbv places two chunks per rank in a V but got 3"):
        check_run(PipelineConfig(stages=2, microbatches=4, schedule="zbv", split="2,4"), 8, 16)
    check_run(PipelineConfig(stages=2, microbatches=4, schedule="zbv", split="2,4,6"), 8, 16)
    with pytest.raises(PipelineError, match=r"^split '2,4,6' makes 4 stages but 6 chunks "
                                            r"\(zbv on 3 stages\); give 5 boundaries in 1..7$"):
        check_run(PipelineConfig(stages=3, microbatches=5, schedule="zbv", split="2,4,6"), 8, 15)
    with pytest.raises(PipelineError, match=r"^zbv places two chunks per rank and runs no "
                                            r"replicated stages"):
        check_run(PipelineConfig(stages=2, microbatches=4, schedule="zbv", replicas=(2, 1)),
                  8, 16)


def test_parse_of_a_chunked_list() -> None:
    assert [str(a) for a in parse_actions("0F0 3F0 3I0")] == ["0F0", "3F0", "3I0"]
