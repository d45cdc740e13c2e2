"""What an experiment preset is: settings of one invocation, and the preset's two halves.

A preset reproduces a table or figure of one of five studies (`experiments.studies`,
described in docs/studies.md). Its `collect` half executes the runs (training runs or
benchmark calls) and writes CSV files with documented columns into the output directory;
its `render` half reads only those CSVs (and `experiment.json`) and writes PNG plots plus
the Markdown body of the report, so `approxdist report DIR` can regenerate everything
without re-running.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from approxdist.experiments.catalog import Listing
from approxdist.experiments.csvio import CsvFile

#: run sizes: `smoke` checks the machinery in seconds (tests), `quick` is CI-size,
#: `full` is the documented reproduction
SIZES = ("smoke", "quick", "full")

Meta = dict[str, Any]


@dataclass(frozen=True)
class Settings:
    """One invocation: `approxdist experiment NAME [--quick] --out DIR [--data-dir D] [--seeds N]
    [--link SPEC] [--link-shaper inproc|kernel]`."""

    out: Path
    size: str = "full"
    data_dir: str = ""
    seeds: int = 0  # 0: the preset's default for the size (1 for smoke/quick, 3 for full)
    #: who shapes the link of presets that vary it or take `link`: "inproc" (our emulator,
    #: `comm.netem`) or "kernel" (tc on namespaced hosts, `experiments.shaping`)
    link_shaper: str = "inproc"
    #: the link every measurement of a preset that takes one goes through (`--link`, e.g.
    #: "bw=100mbit"; "" for none); who shapes it is `link_shaper`
    link: str = ""

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ConfigError(f"experiment size {self.size!r} is not one of: {', '.join(SIZES)}")
        if self.link_shaper not in ("inproc", "kernel"):
            raise ConfigError(f"--link-shaper {self.link_shaper!r} is not one of: inproc, kernel")
        if self.seeds < 0:
            raise ConfigError(f"--seeds {self.seeds} must be >= 1 (or 0 for the default)")
        parse_link(self.link)  # a bad spec fails here (SpecError), before anything runs

    def seed_list(self, full_default: int = 3) -> list[int]:
        """Training seeds 0..n-1: `--seeds`, else 1 (smoke, quick) or `full_default`."""
        n = self.seeds or (full_default if self.size == "full" else 1)
        return list(range(n))

    def pick(self, smoke: Any, quick: Any, full: Any) -> Any:
        """The value for this size."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.size]

    def as_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "size": self.size, "data_dir": self.data_dir,
                "seeds": self.seeds, "link_shaper": self.link_shaper, "link": self.link}


@dataclass(frozen=True)
class Preset:
    """A named experiment: its entry in the catalog, how to run it, how to report it, what
    its CSVs hold."""

    listing: Listing  # name, study, title, summary, run times (`experiments.catalog`)
    files: tuple[CsvFile, ...]  # the CSV files it writes, with their documented columns
    collect: Callable[[Settings], Meta]  # runs; writes the CSVs into settings.out
    render: Callable[[Path, Meta], str]  # CSVs -> PNGs, returns the report's Markdown body
    #: why this machine cannot run the preset ("" when it can); `experiment all` skips it
    unavailable: Callable[[], str] = field(default=lambda: "")
    #: the link shapers it runs with (`--link-shaper`); only presets that vary the link
    #: rate offer "kernel"
    shapers: tuple[str, ...] = ("inproc",)
    #: whether it takes `--link SPEC`, one link for all its measurements (presets that
    #: vary the rate themselves take none); under the kernel shaper it needs one
    takes_link: bool = False

    @property
    def name(self) -> str:
        return self.listing.name


def expected_s(run_time: str) -> float:
    """The seconds a `run_time` text starts with: "~1.5 min (...)" -> 90.0, "~20 s" -> 20.0."""
    match = re.match(r"~?\s*(\d+(?:\.\d+)?)\s*(s|min|h)\b", run_time)
    if match is None:
        raise ConfigError(f"run time {run_time!r} must start with a duration, e.g. '~2 min' "
                          f"or '~20 s'")
    return float(match[1]) * {"s": 1, "min": 60, "h": 3600}[match[2]]


def cores_of(meta: Meta) -> int:
    """The CPU cores of the machine the experiment ran on, from experiment.json (0: unknown);
    reports quote it instead of assuming this machine's."""
    return int(meta.get("machine", {}).get("cpus") or 0)
