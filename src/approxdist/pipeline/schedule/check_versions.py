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

Replicated stages (`schedule.dealing`; ranks are slots): instead of the one-rank-per-stage
rules, `dealt` (each slot runs only its stage's actions, and stage s's forward and
backward of item n run once, on replica n mod r_s) and `deadlock` (`routes.check_replicated`:
run on paper with messages routed between slots, the k-th `AR`s of a stage's replicas one
all-reduce, FIFO channels); then the version rules per slot, and `lockstep`: the replicas
of a stage take the same number of steps, and a slot's k-th `AR` carries its k-th step:
after the step's backward, naming its micro-batch, before the first forward or backward
that uses the version the step makes.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.schedule.routes import check_replicated
from approxdist.pipeline.schedule.validate import Violation, check_schedule
from approxdist.pipeline.schedule.versions import AsyncSchedule, Update, versions_alive


def _v(rule: str, rank: int, action: Action | None, what: str, fix: str) -> Violation:
    return Violation(rule, rank, action, f"rank {rank}: {what} (rule {rule}); {fix}")


def check_versions(schedule: AsyncSchedule) -> list[Violation]:
    """Every violation of the schedule rules and of the version rules above."""
    s = schedule
    base = _check_slots(s) if s.dealing is not None else check_schedule(
        s.order, s.num_stages, s.stream.items)
    found = base + _check_versioned(s)
    if any(v.rule in ("versioned", "dealt") for v in found):
        return found
    for rank in sorted(s.order):
        found += _check_rank(s, rank)
    if s.dealing is not None:
        found += _check_lockstep(s)
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
    stage = s.stage_of(rank)
    found = _misplaced(rank, stage, steps, len(s.order[rank]))
    by_after: dict[int, list[Update]] = {}
    for u in steps:
        if u.stage == stage:
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
        _v("update", rank, Action(stage, Kind.BACKWARD, n),
           f"the gradient of {Action(stage, Kind.BACKWARD, n)} is never applied",
           "add it to the optimizer step after it") for n in sorted(set(backward) - applied)]


def _misplaced(rank: int, stage: int, steps: list[Update], length: int) -> list[Violation]:
    return [_v("update", rank, None, f"step {u} sits after action {u.after} of stage "
               f"{u.stage}, outside rank {rank}'s {length} actions",
               f"place it after a backward of rank {rank}")
            for u in steps if u.stage != stage or not 0 <= u.after < length]


def _check_use(rank: int, a: Action, version: int, newest: int,
               forward: dict[int, int]) -> list[Violation]:
    if not 0 <= version <= newest:
        return [_v("version-exists", rank, a, f"{a} uses version {version} but stage "
                   f"{a.stage} has made versions 0..{newest} so far",
                   f"use a version in 0..{newest}, or step the optimizer before {a}")]
    fwd = forward.get(a.microbatch)
    if a.kind is Kind.BACKWARD and fwd is not None and fwd != version:
        return [_v("stash", rank, a, f"{a} uses version {version} but "
                   f"{Action(a.stage, Kind.FORWARD, a.microbatch)} ran with version {fwd}",
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
        bwd = Action(u.stage, Kind.BACKWARD, n)
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
                                f"limit of {limit} on stage {s.stage_of(rank)}",
                                "hold fewer: fewer micro-batches in flight across an "
                                "optimizer step, fewer steps (2BW: one per mini-batch), or "
                                "forwards that share a version"))
                break
    return found


def _check_slots(s: AsyncSchedule) -> list[Violation]:
    """Replicated stages: `dealt` (every item once per stage, on its replica), then `deadlock`."""
    placement = s.placement
    found: list[Violation] = []
    seen: dict[tuple[int, Kind, int], int] = {}
    for slot, actions in sorted(s.order.items()):
        stage = s.stage_of(slot)
        for a in actions:
            if a.stage != stage:
                found.append(_v("dealt", slot, a, f"{a} is stage {a.stage}'s action on a slot "
                                f"of stage {stage}", "run each stage's actions on its slots"))
            elif a.is_compute:
                key = (a.stage, a.kind, a.microbatch)
                seen[key] = seen.get(key, 0) + 1
                if placement.slot(a.stage, a.microbatch) != slot:
                    found.append(_v("dealt", slot, a, f"{a} runs on slot {slot}, but replica "
                                    f"{placement.replica(a.stage, a.microbatch)} of stage "
                                    f"{a.stage} (slot {placement.slot(a.stage, a.microbatch)}) "
                                    f"handles micro-batch {a.microbatch}",
                                    "deal micro-batch n to replica n mod r_s"))
    for stage in range(s.num_stages):
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            for n in range(s.stream.items):
                count = seen.get((stage, kind, n), 0)
                if count != 1:
                    a = Action(stage, kind, n)
                    found.append(_v("dealt", placement.slot(stage, n), a,
                                    f"{a} runs {count} times", "run it exactly once"))
    if found:
        return found
    try:
        check_replicated(s.order, placement)
    except ScheduleError as exc:
        stuck = exc.stuck or {}
        slot = min(stuck) if stuck else min(s.order)
        found.append(_v("deadlock", slot, stuck.get(slot), str(exc),
                        "keep each replica's actions in its stage's order"))
    return found


def _check_lockstep(s: AsyncSchedule) -> list[Violation]:
    """Replicas of a stage step together: as many steps each, one `AR` after each."""
    found: list[Violation] = []
    for stage, count in enumerate(s.placement.replicas):
        if count == 1:
            continue
        slots = s.slots_of(stage)
        steps = {slot: len(s.updates.get(slot, [])) for slot in slots}
        if len(set(steps.values())) > 1:
            found.append(_v("lockstep", slots[0], None, f"the replicas of stage {stage} take "
                            f"{', '.join(f'{n} (slot {q})' for q, n in steps.items())} "
                            f"optimizer steps", "step every replica of a stage equally often"))
        for slot in slots:
            found += _reduces_after_steps(s, slot)
    return found


def _reduces_after_steps(s: AsyncSchedule, slot: int) -> list[Violation]:
    """The k-th `AR` of a slot carries its k-th step: after the step's backward, naming its
    micro-batch, before the first forward or backward that uses the version it makes."""
    actions = s.order[slot]
    reduces = [i for i, a in enumerate(actions) if a.kind is Kind.ALL_REDUCE]
    steps = s.updates.get(slot, [])
    found: list[Violation] = []
    for u, at in zip(steps, reduces):
        want = Action(u.stage, Kind.ALL_REDUCE, actions[u.after].microbatch)
        first_use = next((i for i in range(u.after + 1, len(actions))
                          if s.versions.get((slot, i), -1) >= u.version), len(actions))
        if actions[at] != want or not u.after < at < first_use:
            found.append(_v("lockstep", slot, actions[u.after], f"step {u} after "
                            f"{actions[u.after]} needs {want} between it and the first use of "
                            f"version {u.version}, found {actions[at]} at {at}",
                            "sum the replicas' gradients before the version is used"))
    if len(reduces) != len(steps):
        found.append(_v("lockstep", slot, None, f"{len(reduces)} all-reduce(s) for "
                        f"{len(steps)} optimizer step(s)", "one AR per step of a replicated stage"))
    return found
