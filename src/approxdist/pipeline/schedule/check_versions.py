"""Check an asynchronous schedule's weight versions (PipeDream, SOSP'19; PipeDream-2BW, ICML'21).

First the rules of every schedule (`validate.check_schedule` over the stream's K*M
micro-batches: each forward and backward once, sends matched, FIFO channels, no deadlock
under `simulate`), then the version rules, each named in the error it raises:
- `versioned`: every forward and backward has a version, and only they have one.
- `version-exists`: an action uses a version its stage has made already (0..steps so far).
- `stash`: a backward uses the version its forward used (weight stashing).
- `update`: each optimizer step follows a backward of its stage, makes the next version,
  applies gradients whose backwards ran already and were computed at the version it
  states; every gradient is applied exactly once.
- `versions-alive`: no stage holds more versions at once than the schedule's limit
  (PipeDream: P - s on stage s; PipeDream-2BW: 2).
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.schedule.validate import Violation, check_schedule
from approxdist.pipeline.schedule.versions import AsyncSchedule, Update, versions_alive


def _v(rule: str, rank: int, action: Action | None, what: str, fix: str) -> Violation:
    return Violation(rule, rank, action, f"rank {rank}: {what} (rule {rule}); {fix}")


def check_versions(schedule: AsyncSchedule) -> list[Violation]:
    """Every violation of the schedule rules and of the version rules above."""
    s = schedule
    found = check_schedule(s.order, s.num_stages, s.stream.items) + _check_versioned(s)
    if any(v.rule == "versioned" for v in found):
        return found
    for rank in sorted(s.order):
        found += _check_rank(s, rank)
    if not found:
        found += _check_alive(s)
    return found


def validate_versions(schedule: AsyncSchedule) -> None:
    """Raise `ScheduleError` naming the first broken rule (and how many more there are)."""
    found = check_versions(schedule)
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise ScheduleError(f"invalid asynchronous schedule {schedule.name!r}: {found[0]}{more}",
                            tuple(found))


def _check_versioned(s: AsyncSchedule) -> list[Violation]:
    found: list[Violation] = []
    for rank, actions in sorted(s.order.items()):
        for i, a in enumerate(actions):
            if a.is_compute and (rank, i) not in s.versions:
                found.append(_v("versioned", rank, a, f"{a} has no weight version",
                                f"give versions[({rank}, {i})] the version {a} uses"))
    for (rank, i), version in sorted(s.versions.items()):
        actions = s.order.get(rank, [])
        if not 0 <= i < len(actions) or not actions[i].is_compute:
            what = str(actions[i]) if 0 <= i < len(actions) else f"no action {i}"
            found.append(_v("versioned", rank, None,
                            f"versions[({rank}, {i})] = {version} is on {what}",
                            "give versions to forwards and backwards only"))
    return found


def _check_rank(s: AsyncSchedule, rank: int) -> list[Violation]:
    """Walk one rank's list: versions exist when used, backwards stash, steps are sound."""
    steps = s.updates.get(rank, [])
    found = _misplaced(rank, steps, len(s.order[rank]))
    by_after: dict[int, list[Update]] = {}
    for u in steps:
        if u.stage == rank:
            by_after.setdefault(u.after, []).append(u)
    newest = 0
    forward: dict[int, int] = {}
    backward: dict[int, int | None] = {}  # micro-batch -> its backward's version (None: broken)
    applied: set[int] = set()
    for i, a in enumerate(s.order[rank]):
        if a.is_compute:
            version = s.versions[(rank, i)]
            broken = _check_use(rank, a, version, newest, forward)
            found += broken
            if a.kind is Kind.FORWARD:
                forward.setdefault(a.microbatch, version)
            else:  # a broken backward is reported once, not again by its step
                backward.setdefault(a.microbatch, None if broken else version)
        for u in by_after.get(i, []):
            found += _check_update(rank, a, u, newest, backward, applied)
            newest += 1
    return found + [
        _v("update", rank, Action(rank, Kind.BACKWARD, n),
           f"the gradient of {Action(rank, Kind.BACKWARD, n)} is never applied",
           "add it to the optimizer step after it") for n in sorted(set(backward) - applied)]


def _misplaced(rank: int, steps: list[Update], length: int) -> list[Violation]:
    return [_v("update", rank, None, f"step {u} sits after action {u.after} of stage "
               f"{u.stage}, outside rank {rank}'s {length} actions",
               f"place it after a backward of rank {rank}")
            for u in steps if u.stage != rank or not 0 <= u.after < length]


def _check_use(rank: int, a: Action, version: int, newest: int,
               forward: dict[int, int]) -> list[Violation]:
    if not 0 <= version <= newest:
        return [_v("version-exists", rank, a, f"{a} uses version {version} but stage "
                   f"{rank} has made versions 0..{newest} so far",
                   f"use a version in 0..{newest}, or step the optimizer before {a}")]
    fwd = forward.get(a.microbatch)
    if a.kind is Kind.BACKWARD and fwd is not None and fwd != version:
        return [_v("stash", rank, a, f"{a} uses version {version} but "
                   f"{Action(rank, Kind.FORWARD, a.microbatch)} ran with version {fwd}",
                   f"a backward uses its forward's weights (weight stashing): give {a} "
                   f"version {fwd}")]
    return []


def _check_update(rank: int, a: Action, u: Update, newest: int,
                  backward: dict[int, int | None], applied: set[int]) -> list[Violation]:
    found: list[Violation] = []
    if a.kind is not Kind.BACKWARD:
        found.append(_v("update", rank, a, f"step {u} follows {a}, not a backward",
                        "step right after the backward that completes the gradient"))
    if u.version != newest + 1:
        found.append(_v("update", rank, a, f"step {u} after {a} makes version {u.version} "
                        f"but the newest is {newest}", f"number it {newest + 1}"))
    for n in u.items:
        bwd = Action(rank, Kind.BACKWARD, n)
        if n not in backward:
            found.append(_v("update", rank, a, f"step {u} applies the gradient of {bwd} "
                            "before it ran", f"move the step after {bwd}"))
        elif backward[n] not in (None, u.computed_at):
            found.append(_v("update", rank, a, f"step {u} says its gradients were computed "
                            f"at version {u.computed_at} but {bwd} used {backward[n]}",
                            "one step applies gradients of one version; split it"))
        if n in applied:
            found.append(_v("update", rank, a, f"step {u} applies the gradient of {bwd} "
                            "a second time", f"apply each gradient once; drop {n}"))
        applied.add(n)
    return found


def _check_alive(s: AsyncSchedule) -> list[Violation]:
    found: list[Violation] = []
    for rank, points in sorted(versions_alive(s).items()):
        limit = s.version_limit.get(rank, 1)
        actions = s.order[rank]
        for j, alive in enumerate(points):
            if len(alive) > limit:
                where = actions[j - 1] if j > 0 else None
                found.append(_v("versions-alive", rank, where,
                                f"{len(alive)} weight versions alive "
                                f"{f'after {where}' if where else 'at the start'} "
                                f"({', '.join(map(str, alive))}), more than {s.name}'s "
                                f"limit of {limit} on stage {rank}",
                                "hold fewer: fewer micro-batches in flight across an "
                                "optimizer step, fewer steps (2BW: one per mini-batch), or "
                                "forwards that share a version"))
                break
    return found
