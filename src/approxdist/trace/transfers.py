"""What a link reports per finished transfer: `TransferEvent`, through a `TraceHook`.

The link layer (`comm/link.py`) calls the hook, the recorder (`trace/recorder.py`) turns
each event into a `transfer` span with its bytes. Times are `time.perf_counter` of this
process (posted and finished); with no hook installed the link takes no timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class TransferEvent:
    """One finished send or receive as seen by this rank."""

    direction: Literal["send", "recv"]
    rank: int
    peer: int
    nbytes: int
    start_s: float
    end_s: float


class TraceHook(Protocol):
    """Called once per completed transfer; must be cheap and must not raise."""

    def __call__(self, event: TransferEvent) -> None: ...
