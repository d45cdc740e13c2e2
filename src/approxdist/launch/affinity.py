"""Bind each rank's threads to cores: `train.bind_cores` / `--bind-cores` (none, rank, row).

Where ranks outnumber cores (4 ranks on 2 here), the kernel moves them between cores at
will, and which rank waits for a core changes from step to step. Ranks that must meet
(a stage's replicas at their all-reduce) then reach it at different times: the one that
got the core waits for the other, which is skew, not communication (docs/hybrid.md).
Binding fixes who shares a core with whom:

* `none` — the kernel decides (the default);
* `rank` — each rank of a machine its own slice of the cores (DeepSpeed's
  `--bind_cores_to_rank`); with more ranks than cores, rank i of the machine on core
  i mod C;
* `row` — the ranks of one pipeline row (one replica index) share cores and the rows are
  spread over them: a row's stages take turns by the schedule, while a stage's replicas
  run the same work at the same time on different cores and reach their all-reduce
  together. For data parallelism every rank is its own row (as `rank`); for a pipeline
  without replicas there is one row (as `none`, all cores).

`plan_cores` is pure; `bind_threads` applies a set of cores to every thread of this
process (gloo's were started with the process group; threads started later inherit the
binding of the thread that starts them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from approxdist.config.schema import BIND_POLICIES
from approxdist.errors import ConfigError

__all__ = ["BIND_POLICIES", "RANKS_PER_MACHINE_ENV", "available_cores", "bind_rank",
           "bind_threads", "check_policy", "plan_cores"]

#: how many ranks share this machine's cores, set by `approxdist cluster run` on every rank
#: (its hosts are namespaces of one machine, so torchrun's LOCAL_WORLD_SIZE counts too few);
#: a training rank's torch threads are the cores over it (`train.worker.set_threads`)
RANKS_PER_MACHINE_ENV = "APPROXDIST_RANKS_PER_MACHINE"


def plan_cores(keys: Sequence[int], cores: Sequence[int]) -> list[tuple[int, ...]]:
    """The cores of each rank of one machine, whose `keys` say which ranks share: equal
    keys get the same cores. The distinct keys, in order of first appearance, get equal
    contiguous slices of `cores` (the first ones one core more where they do not divide),
    or, with more keys than cores, key i core i mod C."""
    if not cores:
        raise ConfigError("no core to bind ranks to (the process's affinity is empty)")
    order = list(dict.fromkeys(keys))
    n, c = len(order), len(cores)
    slices: list[tuple[int, ...]]
    if n > c:
        slices = [(cores[i % c],) for i in range(n)]
    else:
        base, extra = divmod(c, n)
        slices, at = [], 0
        for i in range(n):
            size = base + (1 if i < extra else 0)
            slices.append(tuple(cores[at:at + size]))
            at += size
    where = {key: slices[i] for i, key in enumerate(order)}
    return [where[k] for k in keys]


def available_cores() -> list[int]:
    """The cores this process may run on, sorted; `ConfigError` where the platform cannot
    bind (no `sched_setaffinity`: not Linux)."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--bind-cores needs Linux (sched_setaffinity); use --bind-cores none")
    return sorted(os.sched_getaffinity(0))


def bind_threads(cores: Sequence[int]) -> None:
    """Bind every thread of this process to `cores`."""
    allowed = set(cores)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), allowed)
        except ProcessLookupError:  # the thread ended meanwhile
            continue


def check_policy(policy: str, name: str = "--bind-cores") -> None:
    """`ConfigError` naming `policy` unless it is one of `BIND_POLICIES` and, when it binds,
    the platform can."""
    if policy not in BIND_POLICIES:
        raise ConfigError(f"{name} {policy!r} is not one of: {', '.join(BIND_POLICIES)}")
    if policy != "none":
        available_cores()


def bind_rank(policy: str, rank: int, machine: Sequence[int], row_of: Sequence[int]
              ) -> tuple[int, ...] | None:
    """Bind this process (global `rank`) by `policy` among the ranks `machine` that share
    its machine; `row_of[i]` is the pipeline row (replica index) of `machine[i]`. The
    cores it got, or None for `none`. Once per process: the plan divides the cores the
    process may use, which a binding narrows."""
    check_policy(policy)
    if policy == "none":
        return None
    keys = list(machine) if policy == "rank" else list(row_of)
    cores = plan_cores(keys, available_cores())[list(machine).index(rank)]
    bind_threads(cores)
    return cores
