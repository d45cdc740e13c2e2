"""Start N local workers of one run and return what each returned.

The ranks are forked from the process's fork server (`launch/forkserver.py`, torch and the
entry's module imported already) and watched by the one rank pool (`launch/ranks.py`):
torchrun's environment, the run's store on 127.0.0.1 with a free port (nothing listens on
a public address by default). When any worker fails the others are stopped and a
`LaunchError` names the failed rank(s), a rank killed by a signal with the signal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from approxdist.launch.ranks import RankPool

#: how long the ranks may take to meet at the store and to exit once finished
TIMEOUT_S = 120.0


def _rank_name(rank: int) -> str:
    return f"rank {rank}"


def launch_local(entry: Callable[..., Any], world_size: int, *args: Any,
                 describe: Callable[[int], str] | None = None,
                 timeout_s: float = TIMEOUT_S) -> dict[int, Any]:
    """Run `entry(*args)` on `world_size` local ranks; return each rank's return value.

    `describe(rank)` names a failed rank in the error (e.g. with its place in the
    topology: "rank 2 (stage 1, replica 0)"); default "rank N".
    """
    with RankPool(world_size, timeout_s) as pool:
        pool.start(entry, args)
        return pool.watch(describe or _rank_name).results
