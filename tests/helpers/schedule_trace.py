"""A trace of a pipeline schedule run on paper: the oracle of the analysis tests (seed 002).

`schedule_trace("1f1b", P, M)` simulates the schedule (`pipeline.schedule.simulate`,
the executor contract) and records what each rank would: run_for / run_back for F / B,
send_* / receive_* for the comm actions, a `wait` span where a compute action blocks on
its input, one `step` span per rank over the whole makespan, and a send and a receive
transfer event per message (receive posted at RF/RB, done when its consumer starts).
Every event goes through the real `Recorder` and `rank_trace`, so the result is exactly
what a traced run writes. With zero communication time and equal forward and backward
times, its measured bubble is the theory (P-1)/(M+P-1).
"""

from __future__ import annotations

from approxdist.pipeline.schedule import Action, Durations, Kind, build_schedule, simulate
from approxdist.trace import phases as ph
from approxdist.trace.chrome import TraceDict, merge_traces, rank_trace
from approxdist.trace.recorder import Recorder
from approxdist.trace.transfers import TransferEvent

PHASE_OF_KIND = {Kind.FORWARD: ph.RUN_FOR, Kind.BACKWARD: ph.RUN_BACK, Kind.SEND_ACT: ph.SEND_FOR,
                 Kind.SEND_GRAD: ph.SEND_BACK, Kind.RECV_ACT: ph.RECEIVE_FOR,
                 Kind.RECV_GRAD: ph.RECEIVE_BACK}


def schedule_trace(schedule: str, stages: int, microbatches: int, *, forward_s: float = 1e-3,
                   backward_s: float = 1e-3, comm_s: float = 0.0, nbytes: int = 1024) -> TraceDict:
    """The merged Chrome trace of one simulated step of `schedule` (one stage per rank)."""
    order = build_schedule(schedule, stages, microbatches)
    timeline = simulate(order, stages, Durations(forward_s, backward_s, comm_s))
    if not timeline.completed:
        raise ValueError(f"schedule {schedule} deadlocks on paper: {timeline.stuck}")
    traces = []
    for rank, actions in order.items():
        rec = Recorder(rank, profiler="never", label=f"stage {rank}")
        rec.origin_ns = 0
        rec.meta["pipeline"] = {"stages": stages, "microbatches": microbatches,
                                "schedule": schedule}
        starts, ends = timeline.start[rank], timeline.end[rank]
        rec.complete(ph.STEP, 0, _ns(timeline.makespan), step=0)
        for i, action in enumerate(actions):
            _record_action(rec, action, starts[i], ends[i], ends[i - 1] if i else 0.0)
            if action.is_send:
                _transfer(rec, "send", action, starts[i], ends[i], nbytes)
            elif action.is_recv:
                consumer = actions.index(action.compute())
                _transfer(rec, "recv", action, starts[i], starts[consumer], nbytes)
        traces.append(rank_trace(rec))
    return merge_traces(traces)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _record_action(rec: Recorder, action: Action, start: float, end: float,
                   previous_end: float) -> None:
    if action.is_compute and start > previous_end:
        rec.complete(ph.WAIT, _ns(previous_end), _ns(start))
    if end > start or action.is_compute:
        rec.complete(PHASE_OF_KIND[action.kind], _ns(start), _ns(end), mb=action.microbatch)


def _transfer(rec: Recorder, direction: str, action: Action, start: float, end: float,
              nbytes: int) -> None:
    hook = rec.transfer_hook()
    assert hook is not None
    hook(TransferEvent("send" if direction == "send" else "recv", rec.rank,
                       action.peer_stage, nbytes, start, end))
