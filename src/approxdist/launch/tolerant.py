"""Start N local ranks that survive the loss of some of them (`--tolerate-worker-loss`).

The run's ranks are the one rank pool's (`launch/ranks.py`), as `launch_local`'s; here a
rank that `expendable` allows to die may end without finishing (killed, crashed): the
launcher posts it on the store's loss board (`launch/lost_ranks.py`), prints a warning line
naming it and lets the others go on; when any other rank fails it stops the rest and raises
a `LaunchError` naming the failed rank(s), as `launch_local` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from approxdist.launch.lost_ranks import LossBoard
from approxdist.launch.ranks import Outcome, RankPool

__all__ = ["Outcome", "launch_tolerant"]


def launch_tolerant(entry: Callable[..., Any], world_size: int, *args: Any,
                    expendable: Callable[[int], bool], describe: Callable[[int], str],
                    timeout_s: float = 120.0) -> Outcome:
    """Run `entry(*args, board)` on `world_size` local ranks, `board` being the `host:port`
    of the store holding the loss board; each surviving rank's return value.

    A rank with `expendable(rank)` may die: it is posted as lost and the run goes on.
    """
    with RankPool(world_size, timeout_s, survivors=True) as pool:
        board = LossBoard(pool.store)

        def lost(rank: int, why: str) -> None:
            board.post(rank, why)
            print(f"approxdist: warning: lost {describe(rank)} ({why}); the others go on "
                  f"without it (--tolerate-worker-loss)", file=sys.stderr, flush=True)

        pool.start(entry, (*args, pool.address))
        return pool.watch(describe, expendable, on_lost=lost)
