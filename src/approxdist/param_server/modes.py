"""The `--ps-mode` string (pure): `sync`, `async`, `ssp:<s>` or `backup:<b>`.

* `sync` — every step averages one gradient from each worker (equals data parallelism);
* `async` — each gradient is applied on arrival (Hogwild-style asynchronous SGD);
* `ssp:<s>` — stale-synchronous parallel (Ho et al. 2013): applied on arrival, but no worker
  starts a step more than `s` steps ahead of the slowest;
* `backup:<b>` — N+b backup workers (Chen et al. 2016, seed 003): each step averages the
  first N = W - b fresh gradients to arrive and drops the b late ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from approxdist.errors import ConfigError

FORMS = "sync, async, ssp:<s> (s >= 0), backup:<b> (1 <= b < workers)"


@dataclass(frozen=True)
class PSMode:
    """A parsed mode; `bound` is SSP's s (inf for async), `backup` the b of N+b."""

    kind: str
    bound: float = 0.0
    backup: int = 0

    @property
    def any_source(self) -> bool:
        """Whether the server receives from whichever worker sends first (not NCCL)."""
        return self.kind != "sync"

    def delay(self, workers: int) -> int:
        """The optimiser steps between the parameters a gradient was computed on and those it
        updates, on average, with `workers` workers: in async and SSP the other W - 1
        workers each push once between a worker's pull and its push (measured: mean
        staleness 1.93 with W = 3, docs/param_server.md); none in sync and N+b."""
        return workers - 1 if self.kind in ("async", "ssp") else 0

    @property
    def spec(self) -> str:
        if self.kind == "ssp":
            return f"ssp:{int(self.bound)}"
        return f"backup:{self.backup}" if self.kind == "backup" else self.kind


def parse_mode(text: str, workers: int, name: str = "--ps-mode") -> PSMode:
    """`text` for a run of `workers` workers; `ConfigError` naming the value and the forms.
    `name` is what the user set (`--ps-mode`, or the API's `mode`)."""
    shown = f"{name} {text!r}" if name.startswith("-") else f"{name}={text!r}"
    kind, _, arg = text.strip().partition(":")
    if kind in ("sync", "async") and not arg:
        return PSMode(kind, 0.0 if kind == "sync" else math.inf)
    if kind in ("ssp", "backup") and arg:
        try:
            n = int(arg)
        except ValueError:
            n = -1
        if kind == "ssp" and n >= 0:
            return PSMode("ssp", float(n))
        if kind == "backup" and 1 <= n < workers:
            return PSMode("backup", 0.0, n)
        if kind == "backup" and n >= workers >= 1:
            more = "--workers" if name.startswith("-") else "workers"
            raise ConfigError(f"{shown}: b = {n} backup workers leaves no gradient "
                              f"of the {workers} worker(s) to use; use b <= {workers - 1}"
                              + ("" if workers > 1 else f" (add {more})"))
    raise ConfigError(f"{shown} is not one of: {FORMS}")
