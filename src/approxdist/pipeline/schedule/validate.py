"""Check a schedule before any process runs it (seed 002; GPipe; PipeDream-Flush).

Rules, each named in the error it raises:
- `ranks`: the order has exactly ranks 0..P-1; rank s runs only stage s.
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
- `channel-order`: on each channel (one direction between neighbours) the k-th receive
  and the k-th send carry the same micro-batch (messages are matched FIFO).
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
from approxdist.pipeline.schedule.simulate import simulate


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


def check_schedule(order: Order, num_stages: int, num_microbatches: int) -> list[Violation]:
    """Every violation of the rules above; the deadlock check runs only if the rest pass."""
    found = _check_ranks(order, num_stages)
    for rank, actions in sorted(order.items()):
        if 0 <= rank < num_stages:
            found += _check_rank(rank, actions, num_stages, num_microbatches)
    if not found:
        found += _check_channels(order)
    if not found:
        found += _check_deadlock(order, num_stages)
    return found


def validate_schedule(order: Order, num_stages: int, num_microbatches: int) -> None:
    """Raise `ScheduleError` naming the first broken rule (and how many more there are)."""
    found = check_schedule(order, num_stages, num_microbatches)
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        stuck = simulate(order, num_stages).stuck if found[0].rule == "no-deadlock" else {}
        raise ScheduleError(f"invalid schedule: {found[0]}{more}", tuple(found), stuck)


def _check_ranks(order: Order, num_stages: int) -> list[Violation]:
    missing = [r for r in range(num_stages) if r not in order]
    extra = sorted(r for r in order if not 0 <= r < num_stages)
    return [_v("ranks", r, None, f"no action list for {num_stages} stages",
               "give one list per rank 0..P-1") for r in missing] + [
        _v("ranks", r, None, f"rank outside 0..{num_stages - 1}",
           f"use {num_stages} ranks, one per stage") for r in extra]


def _check_rank(rank: int, actions: list[Action], stages: int, mbs: int) -> list[Violation]:
    found: list[Violation] = []
    for a in actions:
        if a.stage != rank:
            found.append(_v("ranks", rank, a, f"{a} belongs to stage {a.stage}",
                            f"rank {rank} runs only stage {rank}"))
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
    found += _check_missing(rank, set(actions), stages, mbs)
    return found + _check_positions(rank, actions, stages)


def _check_missing(rank: int, have: set[Action], stages: int, mbs: int) -> list[Violation]:
    found: list[Violation] = []
    for m in range(mbs):
        for compute in _computes(rank, m, have):
            if compute not in have:
                found.append(_v("once", rank, compute, f"{compute} is missing",
                                f"every stage runs forward and backward (B, or I and W) of "
                                f"micro-batches 0..{mbs - 1} once"))
            for comm in inputs_of(compute, stages) + outputs_of(compute, stages):
                if comm not in have:
                    found.append(_v("matched", rank, comm, f"{comm} is missing",
                                    f"add it to pair with {comm.matching()} on rank "
                                    f"{comm.peer_stage}"))
        whole = Action(rank, Kind.BACKWARD, m)
        if whole in have and Action(rank, Kind.BACKWARD_INPUT, m) in have:
            found.append(_v("once", rank, whole, f"{whole} and a split backward "
                            f"(I, W) of micro-batch {m} are both there", "keep one of them"))
    return found


def _computes(rank: int, m: int, have: set[Action]) -> list[Action]:
    """The computes micro-batch m needs on `rank`: F, then B or (when split) I and W."""
    split = any(Action(rank, k, m) in have for k in (Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
    backward = [Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT] if split else [Kind.BACKWARD]
    return [Action(rank, k, m) for k in [Kind.FORWARD, *backward]]


def _check_positions(rank: int, actions: list[Action], stages: int) -> list[Violation]:
    at = {a: i for i, a in reversed(list(enumerate(actions)))}
    split = {a.microbatch for a in actions if is_split([a])}
    found: list[Violation] = []
    for a in actions:
        fwd = Action(rank, Kind.FORWARD, a.microbatch)
        grad_in = Action(rank, Kind.BACKWARD_INPUT, a.microbatch)
        producer = a.compute(a.microbatch in split) if a.is_send or a.is_recv else None
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


def _check_channels(order: Order) -> list[Violation]:
    """FIFO matching: the k-th send and the k-th receive of a channel agree."""
    sends: dict[tuple[int, int], list[Action]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, Action]]] = {}
    for rank, actions in sorted(order.items()):
        for a in actions:
            if a.is_send:
                sends.setdefault(a.channel, []).append(a)
            elif a.is_recv:
                recvs.setdefault(a.channel, []).append((rank, a))
    found: list[Violation] = []
    for channel, posted in sorted(recvs.items()):
        for k, ((rank, recv), send) in enumerate(zip(posted, sends.get(channel, []))):
            if send.microbatch != recv.microbatch:
                found.append(_v("channel-order", rank, recv,
                                f"{recv} is receive #{k} from stage {channel[0]} but would "
                                f"get the data of {send}, its send #{k}",
                                "post receives in the order the peer sends"))
                break
    return found


def _check_deadlock(order: Order, num_stages: int) -> list[Violation]:
    timeline = simulate(order, num_stages)
    if timeline.completed:
        return []
    waits = "; ".join(f"rank {r} blocked at {a} waiting for {timeline.waiting_for[r]}"
                      for r, a in sorted(timeline.stuck.items()))
    first = min(timeline.stuck)
    return [Violation("no-deadlock", first, timeline.stuck[first],
                      f"deadlock (rule no-deadlock): {waits}; reorder so that each "
                      "awaited send comes before its sender blocks")]
