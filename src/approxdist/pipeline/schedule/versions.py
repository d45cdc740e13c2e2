"""Weight versions of asynchronous schedules (PipeDream, SOSP'19; PipeDream-2BW, ICML'21).

A flushed schedule (GPipe, 1F1B) steps every optimizer once per mini-batch after the
pipeline drained, so all computations of a mini-batch use the same weights. An
asynchronous schedule streams mini-batches with no flush: a stage steps its optimizer
while later micro-batches are in flight, so which weights each computation uses is part
of the schedule, as data:

- the stream: K mini-batches of M micro-batches, numbered 0..K*M-1 across the stream
  (`Action.microbatch` is that number: n is micro-batch n % M of mini-batch n // M);
- version v of a stage: its weights after v optimizer steps (v = 0: the initial weights).
  Versions count per stage; version v of every stage holds the same updates;
- `versions[(rank, index)]`: the version the forward or backward `order[rank][index]`
  uses; a backward uses its forward's version (weight stashing);
- `updates[rank]`: the stage's optimizer steps, each right after the backward that
  completes its gradient, with the micro-batches it applies and the version their
  gradient was computed at (2BW's W(t+1) = W(t) - lr * grad f(W(t-1)) as data).

A version is *alive* on a stage between two of its actions if it is the newest, or a
later forward or backward of that stage uses it. `check_versions` holds a schedule to
these rules; nothing here runs it (docs/pipeline.md, "Asynchronous schedules").

Replicated stages (hybrid; `dealing`): the order is keyed by *slot* (stage-major position
of a rank, `topology.dealing`), stage s's items go round robin to its r_s replicas
(replica n mod r_s), and a stage steps in lockstep on all its replicas: where the
schedule steps *and* a whole round of r_s items (one per replica) is complete. Each
replica's `Update` follows its own last backward of the step's items; its `AR`, right
before the slot's first action that uses the version the step makes, sums the replicas'
gradients and applies it; version v means the same weights on every replica of a stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.topology.dealing import Dealing

Slot = tuple[int, int]  # (rank, index in that rank's list)


@dataclass(frozen=True)
class Stream:
    """K = `minibatches` mini-batches of M = `microbatches` micro-batches, no flush between."""

    microbatches: int
    minibatches: int

    def __post_init__(self) -> None:
        for what, value in (("micro-batches", self.microbatches),
                            ("mini-batches", self.minibatches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipelineError(f"{what} ({value!r}) must be an integer >= 1")

    @property
    def items(self) -> int:
        """Micro-batches in the whole stream, K * M."""
        return self.microbatches * self.minibatches

    def minibatch_of(self, item: int) -> int:
        return item // self.microbatches


@dataclass(frozen=True)
class Update:
    """One optimizer step of `stage`, right after `order[stage][after]` (a backward): it makes
    version `version` from `version - 1` with the gradients of micro-batches `items`, which
    their backwards computed at version `computed_at`."""

    stage: int
    after: int
    version: int
    items: tuple[int, ...]
    computed_at: int

    @property
    def delay(self) -> int:
        """Steps between the weights the gradient was computed on and those it updates."""
        return self.version - 1 - self.computed_at

    def __str__(self) -> str:
        span = (f"{self.items[0]}" if len(self.items) == 1
                else f"{self.items[0]}-{self.items[-1]}")
        return f"v{self.version} = v{self.version - 1} - lr*g({span} @ v{self.computed_at})"


@dataclass(frozen=True)
class AsyncSchedule:
    """An asynchronous schedule: the actions per rank (with sends and receives), the version
    each forward and backward uses, the optimizer steps, and the paper's bound on versions
    alive per stage. Rank s runs stage s; with `dealing` (replicated stages) the keys of
    `order`, `versions`, `updates` and `version_limit` are slots (`placement`)."""

    name: str
    num_stages: int
    stream: Stream
    order: Order
    versions: dict[Slot, int]
    updates: dict[int, list[Update]]
    version_limit: dict[int, int]
    dealing: Dealing | None = None

    @property
    def placement(self) -> Dealing:
        """Which slot runs which stage's items: `dealing`, or one slot per stage."""
        return self.dealing if self.dealing is not None else Dealing.single(self.num_stages)

    def stage_of(self, slot: int) -> int:
        return self.placement.place(slot)[0]

    def slots_of(self, stage: int) -> list[int]:
        """The slots of `stage`'s replicas, in replica order."""
        first = sum(self.placement.replicas[:stage])
        return list(range(first, first + self.placement.replicas[stage]))

    def version_of(self, rank: int, action: Action) -> int:
        """The version forward or backward `action` uses on `rank`."""
        return self.versions[(rank, self.order[rank].index(action))]

    def labels(self) -> dict[Slot, str]:
        """Grid cells: `1F3v1` is stage 1's forward of micro-batch 3 with version 1."""
        return {(r, i): f"{self.order[r][i]}v{v}" for (r, i), v in self.versions.items()}


#: (stage, micro-batch, newest version on that stage) -> the version its forward uses
ForwardVersion = Callable[[int, int, int], int]


def assign_versions(name: str, num_stages: int, stream: Stream, compute: Order,
                    forward_version: ForwardVersion, steps_after: Callable[[int], bool],
                    version_limit: dict[int, int],
                    dealing: Dealing | None = None) -> AsyncSchedule:
    """Deal each stage's compute-only order (keyed by stage) to its replicas (`dealing`,
    default one per stage), add communication (`with_comm`) and walk each slot's list: a
    forward gets `forward_version(stage, n, newest)`, a backward its forward's version,
    and the backward of micro-batch n is followed by an optimizer step when `steps_after(n)`
    (on a replicated stage: when the step's round is complete, `step_ends`), applying
    every gradient computed since the previous step. `version_limit` is per stage."""
    placement = dealing if dealing is not None else Dealing.single(num_stages)
    ends = {s: step_ends(steps_after, stream.items, r) for s, r in enumerate(placement.replicas)}
    dealt: Order = {}
    for s, actions in compute.items():
        for j, slot in enumerate(range(sum(placement.replicas[:s]),
                                       sum(placement.replicas[:s + 1]))):
            dealt[slot] = [a for a in actions if placement.replica(s, a.microbatch) == j]
    order = with_comm(dealt, num_stages)
    versions: dict[Slot, int] = {}
    updates: dict[int, list[Update]] = {}
    for rank, actions in order.items():
        forward: dict[int, int] = {}
        pending: list[int] = []
        steps: list[Update] = []
        for i, a in enumerate(actions):
            if a.kind is Kind.FORWARD:
                forward[a.microbatch] = forward_version(a.stage, a.microbatch, len(steps))
                versions[(rank, i)] = forward[a.microbatch]
            elif a.kind is Kind.BACKWARD:
                versions[(rank, i)] = forward[a.microbatch]
                pending.append(a.microbatch)
                if a.microbatch in ends[a.stage]:
                    at = {forward[n] for n in pending}
                    assert len(at) == 1, f"one step mixes gradients of versions {sorted(at)}"
                    steps.append(Update(a.stage, i, len(steps) + 1, tuple(pending), at.pop()))
                    pending = []
        updates[rank] = steps
    if max(placement.replicas) > 1:
        order, versions, updates = _with_reduces(order, versions, updates, placement)
    limits = {slot: version_limit[placement.place(slot)[0]] for slot in order}
    return AsyncSchedule(name, num_stages, stream, order, versions, updates, limits,
                         dealing if dealing is not None and max(dealing.replicas) > 1 else None)


def step_ends(steps_after: Callable[[int], bool], items: int, replicas: int) -> set[int]:
    """The items after whose backward a replica of a stage with `replicas` replicas steps:
    the stage steps after item e when `steps_after(e)` and e closes a round of `replicas`
    items ((e + 1) % replicas == 0), and each replica steps after its own last item of
    that step, one of e - replicas + 1 .. e (one replica: just e)."""
    closing = [e for e in range(items) if steps_after(e) and (e + 1) % replicas == 0]
    return {n for e in closing for n in range(e - replicas + 1, e + 1)}


def _with_reduces(order: Order, versions: dict[Slot, int], updates: dict[int, list[Update]],
                  dealing: Dealing) -> tuple[Order, dict[Slot, int], dict[int, list[Update]]]:
    """On a replicated stage, the k-th `AR` of each replica carries its k-th step: as late as
    the step allows, right before the slot's first forward or backward that uses the version
    the step makes (or at the end of the list), so the stage's all-reduce waits for no
    forward that does not need it (2BW's next mini-batch still runs one version back).
    Indices in `versions` and `updates` move with the inserted actions."""
    new_order: Order = {}
    new_versions: dict[Slot, int] = {}
    new_updates: dict[int, list[Update]] = {}
    for slot, actions in order.items():
        steps = updates.get(slot, [])
        if not steps or dealing.replicas[steps[0].stage] == 1:
            new_order[slot], new_updates[slot] = actions, steps
            new_versions.update({k: v for k, v in versions.items() if k[0] == slot})
            continue
        before: dict[int, list[Action]] = {}  # index -> ARs inserted before it
        for u in steps:
            uses = (i for i in range(u.after + 1, len(actions))
                    if versions.get((slot, i), -1) >= u.version)
            at = next(uses, len(actions))
            before.setdefault(at, []).append(Action(u.stage, Kind.ALL_REDUCE,
                                                    actions[u.after].microbatch))
        moved: dict[int, int] = {}
        out: list[Action] = []
        for i, a in enumerate([*actions, None]):
            out += before.get(i, [])
            if a is not None:
                moved[i] = len(out)
                out.append(a)
        new_order[slot] = out
        new_versions.update({(slot, moved[i]): v for (r, i), v in versions.items() if r == slot})
        new_updates[slot] = [Update(u.stage, moved[u.after], u.version, u.items, u.computed_at)
                             for u in steps]
    return new_order, new_versions, new_updates


def versions_alive(schedule: AsyncSchedule) -> dict[int, list[tuple[int, ...]]]:
    """Per rank, the versions alive before each action and after the last (len + 1 points):
    the newest, and any older one a later forward or backward of the rank uses."""
    alive: dict[int, list[tuple[int, ...]]] = {}
    for rank, actions in schedule.order.items():
        last_use: dict[int, int] = {}
        for i in range(len(actions)):
            if (rank, i) in schedule.versions:
                last_use[schedule.versions[(rank, i)]] = i
        afters = sorted(u.after for u in schedule.updates.get(rank, []))
        # version v is kept at points afters[v] + 1 .. its last use (older than the newest,
        # still used): one sweep adds and drops each once (linear in the actions)
        enter: dict[int, list[int]] = {}
        leave: dict[int, list[int]] = {}
        for v, last in last_use.items():
            if 0 <= v < len(afters) and afters[v] < last:
                enter.setdefault(afters[v] + 1, []).append(v)
                leave.setdefault(last + 1, []).append(v)
        points: list[tuple[int, ...]] = []
        kept: set[int] = set()
        newest = 0
        for j in range(len(actions) + 1):
            while newest < len(afters) and afters[newest] < j:
                newest += 1
            kept.update(enter.get(j, ()))
            kept.difference_update(leave.get(j, ()))
            points.append(tuple(sorted(kept | {newest})))
        alive[rank] = points
    return alive


def peak_versions(schedule: AsyncSchedule) -> dict[int, int]:
    """Per rank, the most versions alive at once."""
    return {r: max(map(len, points)) for r, points in versions_alive(schedule).items()}


def gradient_delays(schedule: AsyncSchedule) -> dict[int, int]:
    """Per rank, the largest delay of its updates (0: every gradient was computed on the
    weights it updates, as in synchronous SGD)."""
    return {r: max((u.delay for u in steps), default=0)
            for r, steps in schedule.updates.items()}
