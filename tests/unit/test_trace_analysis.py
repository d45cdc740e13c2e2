"""Bottleneck analysis: interval arithmetic, a hand-built trace, simulated schedules as oracle."""

from __future__ import annotations

from typing import Any

import pytest

from approxdist.analysis.bottleneck import analyze
from approxdist.analysis.intervals import IntervalSet, self_time
from approxdist.pipeline.schedule.grid import theoretical_bubble
from approxdist.trace import TraceError
from tests.helpers.schedule_trace import schedule_trace


def test_interval_sets_union_intersect_subtract() -> None:
    a = IntervalSet.of([(5, 7), (0, 2), (1, 3), (4, 4)])
    assert a.spans == ((0, 3), (5, 7)) and a.length == 5
    b = IntervalSet.of([(2, 6)])
    assert (a & b).spans == ((2, 3), (5, 6))
    assert (a - b).spans == ((0, 2), (6, 7))
    assert (a | b).spans == ((0, 7),)
    assert a.complement((0, 10)).spans == ((3, 5), (7, 10))


def test_self_time_charges_the_innermost_span() -> None:
    # 0: [0, 10] holds 1: [2, 5] (which holds 2: [3, 4]) and 3: [6, 8]
    own = self_time([(0, 10, 0), (2, 5, 1), (3, 4, 2), (6, 8, 3)])
    assert own[0][0].spans == ((0, 2), (5, 6), (8, 10)) and own[0][1] is None
    assert own[1][0].spans == ((2, 3), (4, 5)) and own[1][1] == 0
    assert own[2][0].spans == ((3, 4),) and own[2][1] == 1
    # equal bounds: the span recorded later (higher id) is the outer one
    tied = self_time([(0, 1, 0), (0, 1, 1)])
    assert tied[0][0].length == 1 and tied[1][0].length == 0 and tied[0][1] == 1


def _x(pid: int, tid: int, name: str, t0: float, t1: float, **args: Any) -> dict[str, Any]:
    """A complete event from milliseconds."""
    cat = "transfer" if "src" in args else None
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": t0 * 1e3, "dur": (t1 - t0) * 1e3,
          "args": args}
    return {**ev, "cat": cat} if cat else ev


def _hand_built() -> dict[str, Any]:
    """Two ranks, one 10 ms step each; expected figures worked out in the comments."""
    rank0 = [_x(0, 0, "step", 0, 10), _x(0, 0, "run_for", 0, 3), _x(0, 0, "send_for", 3, 4),
             _x(0, 0, "wait", 5, 8), _x(0, 0, "receive_back", 4, 8), _x(0, 0, "run_back", 8, 9),
             _x(0, 1, "sync", 8.5, 9.5),  # comm thread: only [9, 9.5] is not compute
             _x(0, 1000, "send 0->1", 3.5, 9, src=0, dst=1, bytes=1000),
             _x(0, 1001, "recv 1->0", 4, 7, src=1, dst=0, bytes=2000)]
    rank1 = [_x(1, 0, "step", 0, 10), _x(1, 0, "receive_for", 0, 0.5),
             _x(1, 0, "wait", 1, 4.5), _x(1, 0, "receive_for", 1, 4.5),
             _x(1, 0, "run_for", 4.5, 6), _x(1, 0, "wait", 6.5, 10), _x(1, 0, "send_back", 6, 10),
             _x(1, 1000, "recv 0->1", 1, 4.5, src=0, dst=1, bytes=1000),
             _x(1, 1001, "send 1->0", 6, 10, src=1, dst=0, bytes=2000)]
    return {"traceEvents": rank0 + rank1}


def test_hand_built_trace_gives_the_worked_out_figures() -> None:
    result = analyze(_hand_built())
    r0, r1 = result.ranks
    # rank 0: compute [0,3]+[8,9]; comm [3,5]+[9,9.5]; idle [5,8]+[9.5,10], of which the
    # incoming 1->0 (in flight [6,7]: posted at 6, sender done at 10, receiver at 7) is waiting
    assert (r0.compute, r0.comm, r0.waiting, r0.bubble) == pytest.approx((0.4, 0.25, 0.1, 0.25))
    # rank 1: compute [4.5,6]; comm [0,0.5]+[6,6.5]; waiting: incoming 0->1 in flight
    # [3.5,4.5], its own send 1->0 in flight [6.5,7]; the rest of [0.5,4.5]+[6.5,10] is bubble
    assert (r1.compute, r1.comm, r1.waiting, r1.bubble) == pytest.approx((0.15, 0.1, 0.15, 0.6))
    assert r1.stalls == pytest.approx({"wait in receive_for": 3.5e-3, "wait in send_back": 3.5e-3})
    assert r1.waits_on == pytest.approx({"0->1": 1e-3, "1->0": 0.5e-3})
    assert result.slowest == 0 and r0.busy_per_step_s == pytest.approx(6.5e-3)
    links = {(k.src, k.dst): k for k in result.links}
    assert links[(0, 1)].nbytes == 1000 and links[(0, 1)].matched
    assert links[(0, 1)].time_s == pytest.approx(1e-3)
    assert links[(1, 0)].bandwidth_bps == pytest.approx(2000 / 1e-3)
    assert result.bubble is None  # not told it is a pipeline


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8), (3, 1)])
def test_simulated_schedule_bubble_equals_theory(schedule: str, stages: int,
                                                 microbatches: int) -> None:
    result = analyze(schedule_trace(schedule, stages, microbatches), stages, microbatches)
    assert result.bubble is not None
    assert result.bubble.theory == theoretical_bubble(stages, microbatches)
    assert result.bubble.measured == pytest.approx(result.bubble.theory)
    for r in result.ranks:
        assert r.compute + r.comm + r.waiting + r.bubble == pytest.approx(1.0)
        assert r.comm == 0 and r.waiting == 0  # communication is free on paper


def test_slow_backward_stage_and_link_time_on_a_simulated_pipeline() -> None:
    trace = schedule_trace("1f1b", 3, 4, comm_s=0.25e-3, nbytes=5000)
    result = analyze(trace, 3, 4)
    for r in result.ranks:
        assert r.compute + r.comm + r.waiting + r.bubble == pytest.approx(1.0)
    for link in result.links:  # every message is 0.25 ms on the wire, none overlap
        assert link.matched and link.messages == 4 and link.nbytes == 20000
        assert link.time_s <= 4 * 0.25e-3 + 1e-12
    assert result.bubble is not None and result.bubble.measured > 0


def test_unmatched_transfers_use_their_own_intervals() -> None:
    events = [_x(0, 0, "run_for", 0, 2), _x(0, 1000, "send 0->1", 2, 6, src=0, dst=1, bytes=8)]
    result = analyze({"traceEvents": events})
    (link,) = result.links
    assert not link.matched and link.time_s == pytest.approx(4e-3)
    (r0,) = result.ranks  # no step span: the window is the whole trace, [0, 6] ms
    assert (r0.window_s, r0.compute, r0.waiting) == pytest.approx((6e-3, 1 / 3, 2 / 3))


def test_a_trace_without_spans_is_refused() -> None:
    with pytest.raises(TraceError, match="no spans"):
        analyze({"traceEvents": [_x(0, 1000, "send 0->1", 0, 1, src=0, dst=1, bytes=1)]})


def test_skipping_warm_up_steps_drops_their_time_and_transfers() -> None:
    events = [_x(0, 0, "step", 0, 10), _x(0, 0, "run_for", 0, 10),
              _x(0, 0, "step", 10, 14), _x(0, 0, "run_for", 10, 11),
              _x(0, 1000, "send 0->1", 1, 2, src=0, dst=1, bytes=100),
              _x(0, 1001, "send 0->1", 11, 12, src=0, dst=1, bytes=7)]
    (r0,) = analyze({"traceEvents": events}, skip=1).ranks
    assert (r0.steps, r0.window_s, r0.compute) == pytest.approx((1, 4e-3, 0.25))
    assert [k.nbytes for k in analyze({"traceEvents": events}, skip=1).links] == [7]
    with pytest.raises(TraceError, match="traced 2 steps; skipping 2 leaves none"):
        analyze({"traceEvents": events}, skip=2)


def test_transfers_outside_the_steps_of_their_rank_are_left_out() -> None:
    """Start-up and evaluation traffic of a trainer is not part of the link figures."""
    def move(pid: int, name: str, t0: float, t1: float, nbytes: int) -> dict[str, Any]:
        return _x(pid, 1000, name, t0, t1, src=0, dst=1, bytes=nbytes)

    events = [_x(0, 0, "step", 1, 5), _x(1, 0, "step", 1, 5), _x(0, 0, "step", 7, 9),
              move(0, "send 0->1", 0, 0.5, 80), move(1, "recv 0->1", 0, 0.6, 80),  # start-up
              move(0, "send 0->1", 2, 3, 10), move(1, "recv 0->1", 1.5, 3, 10),
              move(0, "send 0->1", 4.5, 5.5, 20), move(1, "recv 0->1", 4, 6, 20),  # overlaps
              move(0, "send 0->1", 6, 6.5, 7), move(1, "recv 0->1", 6, 6.6, 7)]  # evaluation
    (link,) = analyze({"traceEvents": events}).links
    assert link.matched and (link.messages, link.nbytes) == (2, 30)
    assert link.time_s == pytest.approx(2e-3)  # [2, 3] and [4.5, 5.5]


def test_transfers_are_matched_within_their_stream() -> None:
    def move(pid: int, name: str, t0: float, t1: float, stream: str) -> dict[str, Any]:
        return _x(pid, 1000, name, t0, t1, src=0, dst=1, bytes=10, lane=stream)

    events = [_x(0, 0, "run_for", 0, 6),
              move(0, "send 0->1", 0, 1, "a"), move(1, "recv 0->1", 5, 6, "a"),
              move(0, "send 0->1", 2, 3, "b"), move(1, "recv 0->1", 1, 2.5, "b")]
    (link,) = analyze({"traceEvents": events}).links
    # a: in flight [0, 1]; b: [2, 2.5] (matched across streams it would be [0,1] + [2,3])
    assert link.matched and link.messages == 2 and link.nbytes == 20
    assert link.time_s == pytest.approx(1.5e-3)


def test_bubble_line_of_an_asynchronous_run_uses_the_stream_length() -> None:
    from approxdist.analysis.bottleneck import Analysis, BubbleFigures
    from approxdist.analysis.report import RunInfo, _bubble

    analysis = Analysis([], [], None, BubbleFigures(2, 4, 0.2, 0.15, 0.5))
    line = _bubble(analysis, RunInfo(2, 4, "2bw", {"epoch": 2, "step": 20}))[0]
    assert line.startswith("pipeline bubble (2bw, P=2, M=4, a stream of K=10 mini-batches per "
                           "epoch): theory (P-1)/(K*M+P-1) = 1/41 = 0.024 (a flush per "
                           "mini-batch: 0.200); measured bubble 0.150")
    flushed = _bubble(analysis, RunInfo(2, 4, "1f1b", {"epoch": 2, "step": 20}))[0]
    assert "theory (P-1)/(M+P-1) = 1/5 = 0.200; measured bubble 0.150" in flushed
    hybrid = _bubble(analysis, RunInfo(2, 4, "2bw", {"epoch": 2, "step": 20}, replicated=True))
    assert ("(a flush per mini-batch: 0.200); with one rank per stage: replicated stages step "
            "in lockstep and remove less (docs/pipeline.md); measured bubble 0.150") in hybrid[0]


def test_phase_times_split_each_step_by_its_innermost_span() -> None:
    from approxdist.analysis.phase_times import format_phase_times, phase_times
    times = phase_times(_hand_built())
    # rank 0 (one 10 ms step): run_for [0,3], send_for [3,4], receive_back [4,5] (wait is
    # innermost in [5,8]), run_back [8,9], the comm thread's sync [8.5,9.5]; `step` keeps
    # what nothing inside covers on its thread: [9,10]
    assert times[0] == pytest.approx({"run_for": 3e-3, "wait": 3e-3, "send_for": 1e-3,
                                      "receive_back": 1e-3, "run_back": 1e-3, "sync": 1e-3,
                                      "step": 1e-3})
    assert list(times[1])[0] == "wait" and sum(times[1].values()) == pytest.approx(10e-3)
    assert format_phase_times(times).splitlines()[1].startswith("  rank 0: run_for 3.00 (27%)")
