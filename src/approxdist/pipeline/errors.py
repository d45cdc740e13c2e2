"""Errors of the pipeline layer: bad schedules, splits, balances and micro-batch counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from approxdist.errors import ApproxDistError

if TYPE_CHECKING:
    from approxdist.pipeline.schedule.action import Action
    from approxdist.pipeline.schedule.validate import Violation


class PipelineError(ApproxDistError):
    """A pipeline request is impossible (split, balance, stage or micro-batch count), or
    a stage lost a neighbour; `peer` is then the neighbour's global rank."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class ScheduleError(PipelineError):
    """A schedule breaks a rule; `violations` lists every broken rule, `stuck` a deadlock."""

    def __init__(
        self,
        message: str,
        violations: tuple[Violation, ...] = (),
        stuck: dict[int, Action] | None = None,
    ) -> None:
        super().__init__(message)
        self.violations = violations
        self.stuck = dict(stuck or {})
