"""The `[dp]` config section: which data-parallel reducer and how it runs (seeds 001, 004).

`reducer = "approxdist"` is `approxdist.DataParallel` (buckets, overlap, threads, codecs,
early forward); `reducer = "plain"` is the one-flat-`dist.all_reduce` baseline, which
takes none of the other options. How the gradients travel (codec, rules, error feedback)
is the gradient wire's (`[wire.grad]`, `config/wire.py`). Sizes are checked here
(`check_sizes`, also what `DataParallel` checks its arguments with); the algorithm name
against its registry where the reducer is built (`approxdist.train.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from approxdist.config.checks import one_of
from approxdist.errors import ConfigError

DP_REDUCERS = ("approxdist", "plain")


def check_sizes(bucket_mb: float, first_bucket_mb: float, chunk_kb: float, threads: int) -> None:
    """Reject sizes that cannot work, naming the value and a working one."""
    if bucket_mb < 0 or first_bucket_mb < 0:
        raise ConfigError(f"bucket sizes must be >= 0 MB (0 = one parameter per bucket); got "
                          f"bucket_mb={bucket_mb}, first_bucket_mb={first_bucket_mb}")
    if chunk_kb < 0:
        raise ConfigError(f"chunk_kb = {chunk_kb} must be >= 0 (0 = no fragmentation); e.g. 1024")
    if threads < 1:
        raise ConfigError(f"threads = {threads} must be >= 1 communication thread; e.g. 2")


@dataclass(frozen=True)
class DPConfig:
    """Data-parallel reducer options; see docs/data_parallel.md for what each one does."""

    reducer: str = "approxdist"
    algorithm: str = "auto"
    bucket_mb: float = 1.0
    first_bucket_mb: float = 0.25
    threads: int = 2
    chunk_kb: float = 0.0
    overlap: bool = True
    early_forward: bool = False
    find_unused: bool = False
    calibration: str = ""
    gil_switch_ms: float = 0.5  # 0: leave Python's GIL switch interval (5 ms) alone

    def __post_init__(self) -> None:
        one_of("dp", "reducer", self.reducer, DP_REDUCERS)
        if self.reducer == "plain":
            self._check_plain()
            return
        check_sizes(self.bucket_mb, self.first_bucket_mb, self.chunk_kb, self.threads)
        if self.calibration not in ("", "off", "measure") and not Path(self.calibration).is_file():
            raise ConfigError(f"dp.calibration = {self.calibration!r} is not a file; give off, "
                              f"measure, or a file written by approxdist bench allreduce "
                              f"--calibrate")
        if self.gil_switch_ms < 0:
            raise ConfigError(f"dp.gil_switch_ms = {self.gil_switch_ms} must be >= 0 "
                              f"(0 leaves Python's 5 ms); e.g. 0.5")

    def _check_plain(self) -> None:
        default = DPConfig()
        changed = [f.name for f in fields(self)
                   if f.name != "reducer" and getattr(self, f.name) != getattr(default, f.name)]
        if changed:
            raise ConfigError(f"dp.reducer = 'plain' takes none of dp.{', dp.'.join(changed)}; "
                              f"use dp.reducer = 'approxdist' (--dp-reducer approxdist)")
