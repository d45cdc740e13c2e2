"""Check a schedule before any process runs it (seed 002; GPipe; PipeDream-Flush).

Rules, each named in the error it raises:
- `ranks`: the order has exactly ranks 0..P-1; rank s runs only stage s (with a chunk
  placement, `topology.dealing.Dealing.v` for ZB-V: only the chunks placed on it).
- `range`: micro-batch indices are 0..M-1; sends/receives have a neighbour stage.
- `once`: every forward, backward, send and receive appears exactly once; a split
  backward (zero-bubble schedules) is one `I` and one `W` in place of the `B`.
- `matched`: every receive has its send on the neighbour with the same micro-batch,
  and every send its receive.
- `forward-before-backward`: on each stage, forward of m runs before backward (or `I`) of m.
- `weight-after-input`: a split backward's `W` of m runs after its `I` of m (the weight
  gradient needs the gradient `I` propagated; `W` never communicates).
- `send-after-compute`: a send comes after the forward/backward producing its data.
- `recv-before-compute`: a receive is posted before the forward/backward consuming it.
- `channel-order`: on each channel (one direction between neighbours; with chunks, between
  two ranks, whichever chunks talk) the k-th receive and the k-th send carry the same
  micro-batch (messages are matched FIFO).
- `no-deadlock`: `simulate` runs to the end under the executor contract (non-blocking
  buffered sends, non-blocking receive posts, compute blocks until its input arrived).
Together they imply that backward of m on stage s follows backward of m on stage s+1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind, Order, is_split
from approxdist.pipeline.schedule.comm import inputs_of, outputs_of
from approxdist.pipeline.schedule.routes import slot_route
from approxdist.pipeline.schedule.simulate import Route, simulate, stage_route
from approxdist.topology.dealing import Dealing


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (rank, action), which rule, and a one-line message."""

    rule: str
    rank: int
    action: Action | None
    message: str

    def __str__(self) -> str:
        return self.message


def _v(rule: str, rank: int, action: Action | None, what: str, fix: str) -> Violation:
    return Violation(rule, rank, action, f"rank {rank}: {what} (rule {rule}); {fix}")


def check_schedule(order: Order, num_stages: int, num_microbatches: int,
                   placement: Dealing | None = None) -> list[Violation]:
    """Every violation of the rules above; the deadlock check runs only if the rest pass.
    `num_stages` counts stages (chunks); `placement` puts several on a rank (None: rank s
    runs stage s)."""
    place = placement if placement is not None else Dealing.single(num_stages)
    found = _check_ranks(order, place)
    for rank, actions in sorted(order.items()):
        if 0 <= rank < place.num_slots:
            found += _check_rank(rank, actions, num_stages, num_microbatches, place)
    route = stage_route if placement is None else slot_route(placement)
    if not found:
        found += _check_channels(order, route, "stage" if placement is None else "rank")
    if not found:
        found += _check_deadlock(order, num_stages, route)
    return found


def validate_schedule(order: Order, num_stages: int, num_microbatches: int,
                      placement: Dealing | None = None) -> None:
    """Raise `ScheduleError` naming the first broken rule (and how many more there are)."""
    found = check_schedule(order, num_stages, num_microbatches, placement)
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        route = stage_route if placement is None else slot_route(placement)
        stuck = simulate(order, num_stages, route=route).stuck \
            if found[0].rule == "no-deadlock" else {}
        raise ScheduleError(f"invalid schedule: {found[0]}{more}", tuple(found), stuck)


def _check_ranks(order: Order, place: Dealing) -> list[Violation]:
    n = place.num_slots
    missing = [r for r in range(n) if r not in order]
    extra = sorted(r for r in order if not 0 <= r < n)
    unit = "ranks" if place.ranks is not None else "stages"
    return [_v("ranks", r, None, f"no action list for {n} {unit}",
               "give one list per rank 0..P-1") for r in missing] + [
        _v("ranks", r, None, f"rank outside 0..{n - 1}",
           f"use {n} ranks, one per stage") for r in extra]


def _check_rank(rank: int, actions: list[Action], stages: int, mbs: int,
                place: Dealing) -> list[Violation]:
    found: list[Violation] = []
    mine = place.stages_of(rank)
    for a in actions:
        if a.stage not in mine:
            found.append(_v("ranks", rank, a, f"{a} belongs to stage {a.stage}",
                            f"rank {rank} runs only stage {' and '.join(map(str, mine))}"))
        elif not 0 <= a.microbatch < mbs:
            found.append(_v("range", rank, a, f"{a} has micro-batch {a.microbatch}",
                            f"use 0..{mbs - 1}"))
        elif not a.is_compute and not 0 <= a.peer_stage < stages:
            found.append(_v("range", rank, a, f"{a} talks to stage {a.peer_stage}",
                            f"stages are 0..{stages - 1}; remove it"))
    if found:
        return found
    counts = Counter(actions)
    found += [_v("once", rank, a, f"{a} appears {n} times", "keep exactly one")
              for a, n in counts.items() if n > 1]
    for chunk in mine:
        found += _check_missing(rank, chunk, set(actions), stages, mbs, place)
    return found + _check_positions(rank, actions, stages)


def _check_missing(rank: int, chunk: int, have: set[Action], stages: int,
                   mbs: int, place: Dealing) -> list[Violation]:
    found: list[Violation] = []
    for m in range(mbs):
        for compute in _computes(chunk, m, have):
            if compute not in have:
                found.append(_v("once", rank, compute, f"{compute} is missing",
                                f"every stage runs forward and backward (B, or I and W) of "
                                f"micro-batches 0..{mbs - 1} once"))
            for comm in inputs_of(compute, stages) + outputs_of(compute, stages):
                if comm not in have:
                    found.append(_v("matched", rank, comm, f"{comm} is missing",
                                    f"add it to pair with {comm.matching()} on rank "
                                    f"{place.slot(comm.peer_stage, m)}"))
        whole = Action(chunk, Kind.BACKWARD, m)
        if whole in have and Action(chunk, Kind.BACKWARD_INPUT, m) in have:
            found.append(_v("once", rank, whole, f"{whole} and a split backward "
                            f"(I, W) of micro-batch {m} are both there", "keep one of them"))
    return found


def _computes(stage: int, m: int, have: set[Action]) -> list[Action]:
    """The computes micro-batch m needs on `stage`: F, then B or (when split) I and W."""
    split = any(Action(stage, k, m) in have for k in (Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
    backward = [Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT] if split else [Kind.BACKWARD]
    return [Action(stage, k, m) for k in [Kind.FORWARD, *backward]]


def _check_positions(rank: int, actions: list[Action], stages: int) -> list[Violation]:
    at = {a: i for i, a in reversed(list(enumerate(actions)))}
    split = {(a.stage, a.microbatch) for a in actions if is_split([a])}
    found: list[Violation] = []
    for a in actions:
        fwd = Action(a.stage, Kind.FORWARD, a.microbatch)
        grad_in = Action(a.stage, Kind.BACKWARD_INPUT, a.microbatch)
        producer = a.compute((a.stage, a.microbatch) in split) \
            if a.is_send or a.is_recv else None
        if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT) and fwd in at and at[fwd] > at[a]:
            found.append(_v("forward-before-backward", rank, a, f"{a} runs before {fwd}",
                            f"move {a} after {fwd}"))
        elif a.kind is Kind.BACKWARD_WEIGHT and grad_in in at and at[grad_in] > at[a]:
            found.append(_v("weight-after-input", rank, a, f"{a} runs before {grad_in}",
                            f"move {a} after {grad_in}"))
        elif a.is_send and producer in at and at[producer] > at[a]:
            found.append(_v("send-after-compute", rank, a,
                            f"{a} is posted before {producer} produced its data",
                            f"move {a} after {producer}"))
        elif a.is_recv and producer in at and at[producer] < at[a]:
            found.append(_v("recv-before-compute", rank, a,
                            f"{a} is posted after {producer} needed its data",
                            f"move {a} before {producer}"))
    return found


def _check_channels(order: Order, route: Route = stage_route,
                    unit: str = "stage") -> list[Violation]:
    """FIFO matching: the k-th send and the k-th receive of a channel agree."""
    sends: dict[tuple[int, int], list[Action]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, Action]]] = {}
    for rank, actions in sorted(order.items()):
        for a in actions:
            if a.is_send:
                sends.setdefault(route(rank, a), []).append(a)
            elif a.is_recv:
                recvs.setdefault(route(rank, a), []).append((rank, a))
    found: list[Violation] = []
    for channel, posted in sorted(recvs.items()):
        for k, ((rank, recv), send) in enumerate(zip(posted, sends.get(channel, []))):
            if (send.stage, send.microbatch) != (recv.peer_stage, recv.microbatch):
                found.append(_v("channel-order", rank, recv,
                                f"{recv} is receive #{k} from {unit} {channel[0]} but would "
                                f"get the data of {send}, its send #{k}",
                                "post receives in the order the peer sends"))
                break
    return found


def _check_deadlock(order: Order, num_stages: int, route: Route) -> list[Violation]:
    timeline = simulate(order, num_stages, route=route)
    if timeline.completed:
        return []
    waits = "; ".join(f"rank {r} blocked at {a} waiting for {timeline.waiting_for[r]}"
                      for r, a in sorted(timeline.stuck.items()))
    first = min(timeline.stuck)
    return [Violation("no-deadlock", first, timeline.stuck[first],
                      f"deadlock (rule no-deadlock): {waits}; reorder so that each "
                      "awaited send comes before its sender blocks")]
