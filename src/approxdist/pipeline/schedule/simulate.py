"""Run a schedule on paper: start/end time of every action, or the ranks that deadlock.

The execution model is the executor contract of docs/pipeline.md (seed 002's
"precomputed send/receive order"): each rank runs its list in order; sends are
non-blocking and buffered (never wait for the receiver); posting a receive never
blocks; a forward/backward that consumes received data blocks until the matching send
has completed. On each channel (stage -> neighbour, one direction) messages are FIFO:
the k-th receive posted gets the k-th message sent. An `AR` (a replicated stage's
gradient all-reduce) is a collective: it starts when every replica of its stage has
reached its own. When no rank can move and some are unfinished, the schedule deadlocks
and `Timeline.stuck` names where each rank waits.

Durations say how long each action keeps its rank busy (`of`) and, for a send, how long
its message then spends on the link (`transfer`: seconds the channel is occupied, then
the latency); the consumer of a message waits until it has arrived. Messages on one
channel cross it one after another (netem's `LinkClock`: FIFO, one clock per directed
link). `Durations` gives every kind one time and messages no link time;
`durations.StageDurations` gives each stage its own times and link costs.

With `cores`, the ranks share that many cores (more ranks than cores on one machine):
forwards and backwards running at the same moment share them equally (processor
sharing), so an action's duration is its time on a core of its own; a rank waiting for
a message holds no core.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import inputs_of

Slot = tuple[int, int]  # (rank, index in that rank's list)
#: (rank, send or receive) -> its channel (source, destination); default: stage numbers
Route = Callable[[int, Action], tuple[int, int]]


def stage_route(rank: int, action: Action) -> tuple[int, int]:
    """One rank per stage: a message's channel is (source stage, destination stage)."""
    return action.channel


class ActionTimes(Protocol):
    """What `simulate` asks of durations."""

    def of(self, action: Action) -> float:
        """Seconds `action` keeps its rank busy."""

    def transfer(self, action: Action) -> tuple[float, float]:
        """For a send: (seconds its channel is occupied, latency after that)."""


@dataclass(frozen=True)
class Durations:
    """How long each kind of action takes; the default counts compute steps only (a split
    backward's `I` and `W` a step each, the zero-bubble paper's T_F = T_B = T_W)."""

    forward: float = 1.0
    backward: float = 1.0
    comm: float = 0.0
    input_grad: float = 1.0
    weight_grad: float = 1.0

    def of(self, action: Action) -> float:
        return {Kind.FORWARD: self.forward, Kind.BACKWARD: self.backward,
                Kind.BACKWARD_INPUT: self.input_grad,
                Kind.BACKWARD_WEIGHT: self.weight_grad}.get(action.kind, self.comm)

    def transfer(self, action: Action) -> tuple[float, float]:
        """No link time: a message is there as soon as its send action ends."""
        return 0.0, 0.0


@dataclass(frozen=True)
class Timeline:
    """Start and end of each executed action per rank; `stuck` is empty when all ran."""

    order: Order
    start: dict[int, list[float]]
    end: dict[int, list[float]]
    stuck: dict[int, Action] = field(default_factory=dict)
    waiting_for: dict[int, Action] = field(default_factory=dict)

    @property
    def completed(self) -> bool:
        return not self.stuck

    @property
    def makespan(self) -> float:
        return max((max(e, default=0.0) for e in self.end.values()), default=0.0)

    def busy(self, rank: int) -> float:
        """Time rank `rank` spends in forwards and backwards (I and W included)."""
        return sum(e - s for a, s, e in zip(self.order[rank], self.start[rank], self.end[rank])
                   if a.is_compute)

    def bubble_fraction(self) -> float:
        """Share of rank-time not spent computing: 1 - busy / (ranks x makespan)."""
        total = len(self.order) * self.makespan
        return 0.0 if total == 0 else 1.0 - sum(map(self.busy, self.order)) / total


def simulate(order: Order, num_stages: int | None = None,
             durations: ActionTimes | None = None, route: Route = stage_route,
             cores: int | None = None) -> Timeline:
    """Execute `order` under the executor contract; never raises on a bad schedule.

    `route` names the channel of each send and receive: by default (source stage,
    destination stage); replicated stages route between ranks (`hybrid.schedule`).
    `cores`: the ranks share that many cores (processor sharing, `_shared` below); None:
    each rank has its own."""
    sim = _Simulation(order, len(order) if num_stages is None else num_stages, route)
    dur: ActionTimes = durations or Durations()
    if cores is not None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise PipelineError(f"cores = {cores!r} must be an integer >= 1, or None when "
                                f"every rank has a core of its own")
        return _shared(order, sim, dur, cores)
    clock = {r: 0.0 for r in order}
    start: dict[int, list[float]] = {r: [] for r in order}
    end: dict[int, list[float]] = {r: [] for r in order}
    moved = True
    while moved:
        moved = False
        for r, actions in order.items():
            while len(end[r]) < len(actions):
                i = len(end[r])
                ready = sim.ready(r, i, actions[i])
                if ready is None:
                    break
                start[r].append(max(clock[r], ready))
                clock[r] = start[r][-1] + dur.of(actions[i])
                end[r].append(clock[r])
                sim.ended[(r, i)] = clock[r]
                if actions[i].is_send:
                    sim.post(r, i, actions[i], clock[r], dur.transfer(actions[i]))
                moved = True
    stuck = {r: a[len(end[r])] for r, a in order.items() if len(end[r]) < len(a)}
    waiting = {r: sim.waiting_for(r, a) for r, a in stuck.items()}
    return Timeline(order, start, end, stuck, waiting)


class _Simulation:
    """Channel bookkeeping: FIFO index of each receive, sends per channel, what has run."""

    def __init__(self, order: Order, num_stages: int, route: Route) -> None:
        self.order, self.num_stages, self.route = order, num_stages, route
        self.ended: dict[Slot, float] = {}
        self.arrived: dict[Slot, float] = {}  # when a send's message reached its receiver
        self.link_free: dict[tuple[int, int], float] = {}  # channel -> end of its last message
        self.sends: dict[tuple[int, int], list[Slot]] = {}
        self.recv_k: dict[Slot, int] = {}
        self.recv_at: dict[tuple[int, Action], int] = {}
        #: (stage, k) -> rank -> index of that rank's k-th AR: the k-th ARs of a stage's
        #: replicas are one all-reduce (a stream has one per optimizer step)
        self.reduce_at: dict[tuple[int, int], dict[int, int]] = {}
        self.reduce_k: dict[Slot, int] = {}
        counts: dict[tuple[int, tuple[int, int]], int] = {}
        reduces: dict[int, int] = {}  # rank -> its ARs so far
        for r, actions in order.items():
            for i, a in enumerate(actions):
                if a.is_send:
                    self.sends.setdefault(route(r, a), []).append((r, i))
                elif a.is_recv:
                    key = (r, route(r, a))
                    self.recv_k[(r, i)] = counts.get(key, 0)
                    counts[key] = self.recv_k[(r, i)] + 1
                    self.recv_at.setdefault((r, a), i)
                elif a.kind is Kind.ALL_REDUCE:
                    k = self.reduce_k[(r, i)] = reduces.get(r, 0)
                    reduces[r] = k + 1
                    self.reduce_at.setdefault((a.stage, k), {})[r] = i

    def post(self, rank: int, i: int, send: Action, at: float,
             transfer: tuple[float, float]) -> None:
        """The message of send `i` of `rank`, posted at `at`, crosses its channel after
        the channel's previous message."""
        busy, latency = transfer
        channel = self.route(rank, send)
        leaves = max(at, self.link_free.get(channel, at))
        self.link_free[channel] = leaves + busy
        self.arrived[(rank, i)] = leaves + busy + latency

    def ready(self, rank: int, i: int, action: Action) -> float | None:
        """When `action` (`i`-th of `rank`) may start given its input, or None while the
        input is missing."""
        if action.kind is Kind.ALL_REDUCE:
            return self._all_arrived(action.stage, self.reduce_k[(rank, i)])
        recv = self._input_recv(action)
        if recv is None:
            return 0.0
        send = self._input_send(rank, recv)
        return None if send is None else self.arrived.get(send)

    def _all_arrived(self, stage: int, k: int) -> float | None:
        """When the last replica of `stage` reached its `k`-th `AR`, or None if one has not."""
        arrived = 0.0
        for r, i in self.reduce_at.get((stage, k), {}).items():
            if i == 0:
                continue
            if (r, i - 1) not in self.ended:
                return None
            arrived = max(arrived, self.ended[(r, i - 1)])
        return arrived

    def waiting_for(self, rank: int, action: Action) -> Action:
        """What a blocked `action` waits for: a send on the peer, or its own receive (an
        `AR` waits for the other replicas' `AR`s)."""
        if action.kind is Kind.ALL_REDUCE:
            return action
        recv = self._input_recv(action)
        if recv is None:
            return action
        if (rank, self.recv_at.get((rank, recv), -1)) not in self.ended:
            return recv  # the receive was never posted before its consumer
        send = self._input_send(rank, recv)
        return recv.matching() if send is None else self.order[send[0]][send[1]]

    def _input_recv(self, action: Action) -> Action | None:
        recvs = inputs_of(action, self.num_stages)
        return recvs[0] if recvs else None

    def _input_send(self, rank: int, recv: Action) -> Slot | None:
        """The send whose data the posted `recv` gets (FIFO), or None if none can come."""
        i = self.recv_at.get((rank, recv))
        if i is None or (rank, i) not in self.ended:
            return None
        k = self.recv_k[(rank, i)]
        channel = self.sends.get(self.route(rank, recv), [])
        return channel[k] if k < len(channel) else None


def _shared(order: Order, sim: _Simulation, dur: ActionTimes, cores: int) -> Timeline:
    """`simulate` on `cores` shared cores: processor sharing among the forwards and
    backwards running at each moment.

    While k ranks run a forward or backward, each progresses at min(1, cores / k) of its
    speed (its duration is its seconds on a core of its own); a rank that waits for a
    message holds no core. Other actions (posting sends, all-reduces) keep their
    durations: their costs are priced by their own load. Time advances from event to
    event: an action ends, a message arrives.
    """
    start: dict[int, list[float]] = {r: [] for r in order}
    end: dict[int, list[float]] = {r: [] for r in order}
    left: dict[int, float] = {}  # rank -> seconds of work its running action still needs
    now = 0.0

    def finish(r: int, at: float) -> None:
        i = len(end[r])
        end[r].append(at)
        sim.ended[(r, i)] = at
        if order[r][i].is_send:
            sim.post(r, i, order[r][i], at, dur.transfer(order[r][i]))

    def next_arrival() -> float:
        """When the earliest input not yet there arrives (inf: none is on its way)."""
        soonest = math.inf
        for r, actions in order.items():
            if r not in left and len(end[r]) < len(actions):
                ready = sim.ready(r, len(end[r]), actions[len(end[r])])
                if ready is not None and ready > now:
                    soonest = min(soonest, ready)
        return soonest

    while True:
        moved = True
        while moved:  # start what can start now; zero-length actions end at once
            moved = False
            for r, actions in order.items():
                if r in left or len(end[r]) == len(actions):
                    continue
                ready = sim.ready(r, len(end[r]), actions[len(end[r])])
                if ready is None or ready > now:
                    continue
                start[r].append(now)
                seconds = dur.of(actions[len(end[r])])
                if seconds > 0:
                    left[r] = seconds
                else:
                    finish(r, now)
                    moved = True
        arrival = next_arrival()
        if not left:
            if math.isinf(arrival):
                break
            now = arrival
            continue
        computing = [r for r in left if order[r][len(end[r])].is_compute]
        share = min(1.0, cores / len(computing)) if computing else 1.0
        speed = {r: share if r in computing else 1.0 for r in left}
        step = min(arrival - now, *(left[r] / speed[r] for r in left))
        now += step
        for r in list(left):
            left[r] -= step * speed[r]
            if left[r] <= _EPS * max(1.0, now):
                del left[r]
                finish(r, now)
    stuck = {r: a[len(end[r])] for r, a in order.items() if len(end[r]) < len(a)}
    waiting = {r: sim.waiting_for(r, a) for r, a in stuck.items()}
    return Timeline(order, start, end, stuck, waiting)


#: relative slack below which a running action's remaining work counts as done
_EPS = 1e-12
