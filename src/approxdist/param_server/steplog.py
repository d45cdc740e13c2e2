"""What one server step did, push by push (pure): the step record of metrics.jsonl.

Besides the per-gradient figures (staleness, lead, the workers applied and dropped), a
step keeps its pushes in arrival order, each as `[worker, read, at]`: the worker, the
parameter version its gradient was computed on (the version word it pushed) and the
version the update that used it was applied to (None: dropped, N+b). A gradient's
staleness is `at - read`. The orders of a run's steps, one after the other, are all a
replay needs to recompute the server's parameters in one process (the arrival order is
the one thing an asynchronous run does not fix in advance): tests/helpers/ps_replay.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from approxdist.param_server.rules import Verdict

#: one push: [worker, version read, version applied to (None: dropped)]
Push = list[int | None]


@dataclass
class StepLog:
    """What one server step did (the step record of metrics.jsonl)."""

    staleness: list[int] = field(default_factory=list)  # per applied gradient
    lead: list[int] = field(default_factory=list)       # per arrival
    applied: list[int] = field(default_factory=list)    # worker of each applied gradient
    dropped: list[int] = field(default_factory=list)    # worker of each dropped gradient
    lost: list[int] = field(default_factory=list)       # global ranks found dead
    order: list[Push] = field(default_factory=list)     # every push, in arrival order
    #: the pushes kept and not yet applied, by worker (their `at` is filled in on update)
    waiting: dict[int, Push] = field(default_factory=dict)

    def arrived(self, worker: int, read: int, verdict: Verdict) -> None:
        """A push of `worker`'s gradient computed on version `read`, and what became of it
        (an update it is part of is reported by `updated`)."""
        push: Push = [worker, read, None]
        self.order.append(push)
        self.lead.append(verdict.lead)
        if verdict.keep:
            self.waiting[worker] = push
        else:
            self.dropped.append(worker)

    def updated(self, verdict: Verdict) -> None:
        """The update of `verdict`: its gradients' staleness; each push's version applied to."""
        self.staleness.extend(verdict.staleness)
        self.applied.extend(verdict.apply)
        for w, stale in zip(verdict.apply, verdict.staleness):
            push = self.waiting.pop(w)
            read = push[1]
            assert read is not None
            push[2] = read + stale

    def record(self, version: int) -> dict[str, object]:
        return {"staleness": self.staleness, "lead": self.lead, "applied_from": self.applied,
                "dropped_from": self.dropped, "version": version, "lost": self.lost,
                "order": self.order}
