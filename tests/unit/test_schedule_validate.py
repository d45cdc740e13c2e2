"""The schedule validator catches deliberately broken schedules and names action and rule."""

from __future__ import annotations

import pytest

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import (
    Action,
    Order,
    build_schedule,
    check_schedule,
    parse_actions,
    validate_schedule,
)


def _order(*ranks: str) -> Order:
    return {r: parse_actions(text) for r, text in enumerate(ranks)}


def _rules(order: Order, p: int, m: int) -> list[tuple[str, int, str]]:
    return [(v.rule, v.rank, str(v.action)) for v in check_schedule(order, p, m)]


GOOD = ("0F0 0SF0 0RB0 0B0", "1RF0 1F0 1B0 1SB0")


def test_hand_written_schedule_is_valid() -> None:
    validate_schedule(_order(*GOOD), 2, 1)


def test_missing_send_names_the_send_and_its_receive() -> None:
    order = _order("0F0 0RB0 0B0", GOOD[1])
    assert _rules(order, 2, 1) == [("matched", 0, "0SF0")]
    with pytest.raises(ScheduleError, match=r"rank 0: 0SF0 is missing \(rule matched\); "
                                            r"add it to pair with 1RF0 on rank 1"):
        validate_schedule(order, 2, 1)


def test_missing_receive_is_caught() -> None:
    assert _rules(_order(GOOD[0], "1F0 1B0 1SB0"), 2, 1) == [("matched", 1, "1RF0")]


def test_backward_before_forward() -> None:
    order = _order("0RB0 0B0 0F0 0SF0", "1RF0 1B0 1F0 1SB0")
    rules = _rules(order, 2, 1)
    assert ("forward-before-backward", 0, "0B0") in rules
    assert ("forward-before-backward", 1, "1B0") in rules
    with pytest.raises(ScheduleError, match=r"0B0 runs before 0F0 \(rule forward-before-backward"
                                            r"\); move 0B0 after 0F0 \(\+\d+ more\)"):
        validate_schedule(order, 2, 1)


def test_send_before_its_data_exists_and_receive_after_its_use() -> None:
    order = _order("0SF0 0F0 0RB0 0B0", "1F0 1RF0 1B0 1SB0")
    assert _rules(order, 2, 1) == [("send-after-compute", 0, "0SF0"),
                                   ("recv-before-compute", 1, "1RF0")]


def test_swapped_order_deadlocks_and_reports_stuck_ranks() -> None:
    # rank 0 waits for gradient 0 before sending activation 1; rank 1 needs activation 1
    # before it runs backward 0: each waits for the other.
    order = _order("0F0 0SF0 0RB0 0B0 0F1 0SF1 0RB1 0B1",
                   "1RF0 1F0 1RF1 1F1 1B0 1SB0 1B1 1SB1")
    assert _rules(order, 2, 2) == [("no-deadlock", 0, "0B0")]
    with pytest.raises(ScheduleError) as info:
        validate_schedule(order, 2, 2)
    assert str(info.value) == (
        "invalid schedule: deadlock (rule no-deadlock): rank 0 blocked at 0B0 waiting for "
        "1SB0; rank 1 blocked at 1F1 waiting for 0SF1; reorder so that each awaited send "
        "comes before its sender blocks")
    assert info.value.stuck == {0: Action.parse("0B0"), 1: Action.parse("1F1")}
    assert "\n" not in str(info.value)


def test_receives_posted_out_of_send_order_would_swap_data() -> None:
    order = _order("0F0 0SF0 0F1 0SF1 0RB0 0RB1 0B0 0B1",
                   "1RF1 1RF0 1F0 1F1 1B0 1SB0 1B1 1SB1")
    assert _rules(order, 2, 2) == [("channel-order", 1, "1RF1")]
    with pytest.raises(ScheduleError, match="1RF1 is receive #0 from stage 0 but would get "
                                            "the data of 0SF0"):
        validate_schedule(order, 2, 2)


def test_duplicate_and_missing_compute() -> None:
    order = {0: parse_actions("0F0 0F0 0B1"), 1: []}
    rules = _rules(order, 1, 2)
    assert ("once", 0, "0F0") in rules and ("once", 0, "0F1") in rules
    assert ("once", 0, "0B0") in rules
    assert ("ranks", 1, "None") in rules


def test_wrong_stage_microbatch_and_peer() -> None:
    order = _order("1F0", "1F5 1SF0")
    rules = _rules(order, 2, 2)
    assert ("ranks", 0, "1F0") in rules
    assert ("range", 1, "1F5") in rules
    assert ("range", 1, "1SF0") in rules


def test_missing_rank() -> None:
    with pytest.raises(ScheduleError, match=r"rank 1: no action list for 2 stages \(rule ranks\)"):
        validate_schedule({0: parse_actions("0F0 0B0")}, 2, 1)


def test_every_built_schedule_reports_no_violation() -> None:
    assert check_schedule(build_schedule("1f1b", 3, 2), 3, 2) == []
