"""What a server does with each arriving gradient under a `PSMode` (pure, no torch).

The server engine reports each arrival — which worker, and the parameter version its
gradient was computed on — and gets a `Verdict`: keep or drop the gradient, which kept
gradients to average into one update now, and which workers to send the parameters to
(after that update). Versions count the updates a server has applied; a gradient's
*staleness* is the number of updates applied between its read and its use (0 in sync and
N+b); its *lead* is how many more gradients its worker had pushed than the slowest worker
(SSP bounds it by s).

A server step ends when `step_done`: W arrivals (sync, async, SSP: every worker pushes
once per step on average) or one update from N fresh gradients (N+b). At the end of an
epoch the server drains the pushes still due (`owed`) before the epoch's collectives. In
sync, async and SSP every worker pushes once per trainer step: W pushes per step. In N+b
a worker whose gradient was dropped goes on from the newest parameters and skips the
steps it missed (Chen et al. 2016), and it pushes to this server only while the version
it last got from it (`replied`) predates the epoch's last update: a worker owes one more
push exactly while that is so.

A worker that died (`lose`, `--tolerate-worker-loss`) is left out from then on: the
server expects no more pushes from it, the slowest worker (SSP's bound, the lead) is the
slowest of the others, and a step ends early once no live worker owes a push this epoch.
A gradient it pushed before dying counts if it was read before the loss was taken in.
N+b keeps N and goes on with one backup fewer; `short` says when fewer workers remain
than an update needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from approxdist.param_server.modes import PSMode


@dataclass(frozen=True)
class Verdict:
    """The answer to one arrival."""

    keep: bool                        # False: the gradient is dropped (late, N+b)
    apply: tuple[int, ...] = ()       # workers whose kept gradients make one update now
    replies: tuple[int, ...] = ()     # workers to send the parameters to, after the update
    staleness: tuple[int, ...] = ()   # per applied gradient, in `apply` order
    lead: int = 0                     # the arriving worker's pushes minus the slowest's


@dataclass
class ServerRules:
    """One server's bookkeeping for `workers` workers under `mode`."""

    mode: PSMode
    workers: int
    version: int = 0
    clocks: list[int] = field(default_factory=list)   # pushes seen per worker
    held: list[int] = field(default_factory=list)     # workers whose reply SSP holds back
    kept: dict[int, int] = field(default_factory=dict)  # worker -> version, awaiting update
    arrivals: int = 0          # in this server step
    updates: int = 0           # in this server step
    epoch_arrivals: int = 0
    dropped: int = 0           # in total
    base: int = 0              # the version at the start of this epoch
    replied: list[int] = field(default_factory=list)  # version last sent to each worker
    lost: set[int] = field(default_factory=set)       # workers that died
    started: list[int] = field(default_factory=list)  # each worker's pushes before this epoch

    def __post_init__(self) -> None:
        self.clocks = [0] * self.workers
        self.started = [0] * self.workers
        self.replied = [self.version] * self.workers

    @property
    def live(self) -> list[int]:
        return [w for w in range(self.workers) if w not in self.lost]

    @property
    def short(self) -> bool:
        """Fewer live workers than one update needs: the run cannot go on."""
        return len(self.live) < self.needed

    def lose(self, worker: int) -> tuple[int, ...]:
        """Worker `worker` died: expect nothing more from it; the held workers now free to
        go on (SSP: the slowest may have been the dead one)."""
        self.lost.add(worker)
        self.held = [w for w in self.held if w != worker]
        return self._release() if self.live else ()

    def _slowest(self) -> int:
        return min((self.clocks[w] for w in self.live), default=0)

    @property
    def needed(self) -> int:
        """Gradients averaged per update: W in sync, N = W - b with backups, 1 otherwise."""
        kind = self.mode.kind
        return self.workers - self.mode.backup if kind in ("sync", "backup") else 1

    def begin_step(self) -> None:
        self.arrivals = self.updates = 0

    def step_done(self, steps: int) -> bool:
        """Whether this server step is over (of an epoch of `steps` trainer steps): W
        arrivals, one N+b update, or (after a loss) no push owed any more this epoch."""
        if self.mode.kind == "backup":
            return self.updates == 1 or (bool(self.lost) and self.owed(steps) == 0)
        return self.arrivals >= len(self.live) or self.owed(steps) == 0

    def owes(self, worker: int, steps: int) -> bool:
        """Whether live `worker` has a push still due this epoch of `steps` steps."""
        if worker in self.lost:
            return False
        if self.mode.kind == "backup":
            return self.replied[worker] < self.base + steps
        return self.clocks[worker] - self.started[worker] < steps

    def owed(self, steps: int) -> int:
        """Pushes still due this epoch of `steps` trainer steps (drained before it ends):
        in N+b, one from each live worker whose last reply predates the epoch's last
        update; otherwise each live worker's `steps` minus its pushes this epoch."""
        if self.mode.kind == "backup":
            end = self.base + steps
            return sum(1 for w in self.live if self.replied[w] < end)
        return sum(max(0, steps - (self.clocks[w] - self.started[w])) for w in self.live)

    def end_epoch(self) -> None:
        """The epoch is over; every worker is sent the parameters (`Server.reply`)."""
        assert not self.held and not self.kept, "a reply is held past the end of the epoch"
        self.epoch_arrivals = 0
        self.started = list(self.clocks)
        self.base = self.version
        self.replied = [self.version] * self.workers

    def arrive(self, worker: int, version: int) -> Verdict:
        """Worker `worker` pushed a gradient computed on parameter version `version`."""
        assert worker not in self.held, f"worker {worker} pushed while its reply was held"
        lead = self.clocks[worker] - self._slowest()
        self.clocks[worker] += 1
        self.arrivals += 1
        self.epoch_arrivals += 1
        kind = self.mode.kind
        if kind == "backup" and (version != self.version or self.updates):
            self.dropped += 1  # late: its step has been taken without it
            return self._sent(Verdict(False, replies=(worker,), lead=lead))
        self.kept[worker] = version
        if len(self.kept) < self.needed:
            return Verdict(True, lead=lead)
        apply = tuple(sorted(self.kept)) if kind in ("sync", "backup") else (worker,)
        stale = tuple(self.version - self.kept.pop(w) for w in apply)
        self.version += 1
        self.updates += 1
        if kind in ("sync", "backup"):
            return self._sent(Verdict(True, apply, apply, stale, lead))
        self.held.append(worker)
        return self._sent(Verdict(True, apply, self._release(), stale, lead))

    def _sent(self, verdict: Verdict) -> Verdict:
        for w in verdict.replies:
            self.replied[w] = self.version
        return verdict

    def _release(self) -> tuple[int, ...]:
        """Held workers allowed to start their next step: at most `bound` pushes ahead."""
        slowest = self._slowest()
        free = tuple(w for w in self.held if self.clocks[w] - slowest <= self.mode.bound)
        self.held = [w for w in self.held if w not in free]
        return free
