"""Per-rank timeline recorder: named phase spans per thread (seed 002's timeline analysis).

One `Recorder` belongs to one rank and is passed explicitly to whatever records (no
globals). Engines write

    with rec.span(RUN_FOR, mb=3):
        y = stage(x)

and the link layer reports finished transfers through `rec.transfer_hook()`. Times are
`time.perf_counter_ns()` of this process; `origin_ns` (set by `trace.clock.align_clock`)
maps them to the run's common time axis. Each Python thread gets its own row (`tid`),
named after the thread or by `rec.name_thread(...)`; link transfers go to virtual rows
per peer and direction. While a `torch.profiler` session is active, every span is also
a `record_function` range of the same name (`profiler="always"` opens one even without a
profiler, `"never"` not at all). `NULL_RECORDER` (`Recorder.off()`) records nothing:
`span()` returns one shared no-op context object and `transfer_hook()` returns None, so
an untraced link takes no timestamps at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch

from approxdist.trace.phases import TRANSFER, phase_class
from approxdist.trace.transfers import TraceHook, TransferEvent

ProfilerMode = Literal["auto", "always", "never"]
#: one recorded event: (name, cat, start_ns, end_ns or -1 for an instant, row, args)
Event = tuple[str, str, int, int, int | str, dict[str, Any] | None]
DEFAULT_MAX_EVENTS = 2_000_000
#: whether a torch.profiler session is recording on this thread (private torch API:
#: without it, "auto" opens no ranges)
_profiler_on: Callable[[], bool] = getattr(torch.autograd, "_profiler_enabled", lambda: False)


class _NullSpan:
    """The shared do-nothing context of a disabled recorder."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NULL_SPAN = _NullSpan()


class _Span:
    """An open span of an enabled recorder; appends its event on exit."""

    __slots__ = ("rec", "name", "cat", "args", "start", "rf")

    def __init__(self, rec: Recorder, name: str, cat: str, args: dict[str, Any] | None) -> None:
        self.rec, self.name, self.cat, self.args = rec, name, cat, args
        self.rf: Any = None

    def __enter__(self) -> _Span:
        if self.rec._profiled():
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        end = time.perf_counter_ns()
        if self.rf is not None:
            self.rf.__exit__(None, None, None)
        rec = self.rec
        known = rec._threads.get(threading.get_ident())  # the hot path of rec._tid()
        tid = known[0] if known is not None else rec._tid()
        rec._add((self.name, self.cat, self.start, end, tid, self.args))


class Recorder:
    """Timeline events of one rank; see the module docstring."""

    enabled = True

    def __init__(self, rank: int = 0, *, profiler: ProfilerMode = "auto",
                 max_events: int = DEFAULT_MAX_EVENTS, label: str = "") -> None:
        if profiler not in ("auto", "always", "never"):
            raise ValueError(f"profiler={profiler!r}; use 'auto', 'always' or 'never'")
        self.rank, self.label, self.max_events = rank, label, max_events
        self.profiler: ProfilerMode = profiler
        self.origin_ns = time.perf_counter_ns()
        self.clock: dict[str, Any] = {"method": "local", "error_bound_us": 0.0}
        self.meta: dict[str, Any] = {}
        self.dropped = 0
        self._events: list[Event] = []
        self._threads: dict[int, tuple[int, str]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def off() -> Recorder:
        """The disabled recorder (`NULL_RECORDER`)."""
        return NULL_RECORDER

    # -- recording --------------------------------------------------------------------
    def span(self, name: str, cat: str | None = None, **args: Any) -> AbstractContextManager[Any]:
        """Context manager timing one phase on the calling thread; `args` go to the event."""
        return _Span(self, name, cat or phase_class(name), args or None)

    def complete(self, name: str, start_ns: int, end_ns: int, cat: str | None = None,
                 row: str | None = None, **args: Any) -> None:
        """An event with explicit `perf_counter_ns` bounds, on this thread or a named `row`."""
        where: int | str = row if row is not None else self._tid()
        self._add((name, cat or phase_class(name), start_ns, end_ns, where, args or None))

    def instant(self, name: str, cat: str | None = None, **args: Any) -> None:
        """A zero-length marker at the current time on the calling thread."""
        self._add((name, cat or phase_class(name), time.perf_counter_ns(), -1, self._tid(),
                   args or None))

    def name_thread(self, name: str) -> None:
        """Name the calling thread's row (e.g. "comm 0"); call before or after recording."""
        tid = self._tid()
        self._threads[threading.get_ident()] = (tid, name)

    def transfer_hook(self, lane: str = "") -> TraceHook | None:
        """A link-layer hook turning each `TransferEvent` into a `transfer` event with bytes.

        Give every `Link` between the same two ranks its own `lane` name, the same on
        both ranks (e.g. "comm0"): messages are matched in order per link, not across links.
        """
        def hook(event: TransferEvent) -> None:
            self._on_transfer(event, lane)
        return hook

    def _on_transfer(self, ev: TransferEvent, lane: str) -> None:
        src, dst = (ev.rank, ev.peer) if ev.direction == "send" else (ev.peer, ev.rank)
        row = f"{ev.direction} {'to' if ev.direction == 'send' else 'from'} rank {ev.peer}"
        args: dict[str, Any] = {"bytes": ev.nbytes, "src": src, "dst": dst,
                                "direction": ev.direction}
        if lane:
            row, args["lane"] = f"{row} [{lane}]", lane
        self._add((f"{ev.direction} {src}->{dst}", TRANSFER, int(ev.start_s * 1e9),
                   int(ev.end_s * 1e9), row, args))

    def _add(self, event: Event) -> None:
        if len(self._events) < self.max_events:
            self._events.append(event)  # list.append is atomic: safe from any thread
        else:
            self.dropped += 1

    # -- threads and profiler ---------------------------------------------------------
    def _tid(self) -> int:
        ident = threading.get_ident()
        known = self._threads.get(ident)
        if known is not None:
            return known[0]
        with self._lock:
            if ident not in self._threads:
                self._threads[ident] = (len(self._threads), threading.current_thread().name)
            return self._threads[ident][0]

    def _profiled(self) -> bool:
        mode = self.profiler
        return mode == "always" or (mode == "auto" and bool(_profiler_on()))

    # -- export -----------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """The raw events recorded so far (a copy)."""
        return list(self._events)

    @property
    def thread_names(self) -> dict[int, str]:
        """Row id -> name of every thread that recorded."""
        return {tid: name for tid, name in self._threads.values()}

    def clear(self) -> None:
        self._events.clear()
        self.dropped = 0


class NullRecorder(Recorder):
    """Records nothing at (almost) no cost; every method is a no-op."""

    enabled = False

    def __init__(self) -> None:
        super().__init__(rank=-1, profiler="never", max_events=0)

    def span(self, name: str, cat: str | None = None, **args: Any) -> AbstractContextManager[Any]:
        return NULL_SPAN

    def complete(self, name: str, start_ns: int, end_ns: int, cat: str | None = None,
                 row: str | None = None, **args: Any) -> None:
        return None

    def instant(self, name: str, cat: str | None = None, **args: Any) -> None:
        return None

    def name_thread(self, name: str) -> None:
        return None

    def transfer_hook(self, lane: str = "") -> TraceHook | None:
        return None


#: the shared disabled recorder; it holds no state that recording could change
NULL_RECORDER = NullRecorder()
