"""Measured all-reduce times per codec and size: what seed 004's "Fastest" chooses from.

Seed 004's Fastest sends each layer in whichever wire format all-reduces it fastest.
The times come from the rows `approxdist bench allreduce --json FILE` writes (one per
algorithm, codec and message size, measured on this world and link):

    approxdist bench allreduce --world-size 4 --algorithms auto \
        --codec fp32,fp8-e5m2,table4,table1 --sizes 4K,64K,1M,16M --link bw=100mbit \
        --json codec-times.json

`CodecTimes.load(path, algorithm)` keeps the rows of the all-reduce algorithm the run
uses; `fastest(nbytes)` interpolates each codec's median time at `nbytes` (fp32 message
bytes) linearly in log(size)-log(time), extrapolating the end segments, and returns the
codec with the lowest. The candidates are exactly the codecs the file measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.comm.collectives.registry import algorithm_names
from approxdist.errors import ConfigError

MEASURE = ("approxdist bench allreduce --algorithms {alg} --codec fp32,fp8-e5m2,table4,table1 "
           "--json {path}")


@dataclass(frozen=True)
class CodecTimes:
    """Per codec, (size_bytes, median_s) points in increasing size, for one algorithm."""

    algorithm: str
    world_size: int
    link: str
    points: Mapping[str, tuple[tuple[int, float], ...]]
    source: str = ""

    @staticmethod
    def from_rows(rows: Sequence[Mapping[str, Any]], algorithm: str,
                  source: str = "rows") -> CodecTimes:
        """The rows of `algorithm` (as `bench allreduce --json` writes them)."""
        mine = [r for r in rows if r.get("algorithm") == algorithm]
        if not mine:
            have = sorted({str(r.get("algorithm")) for r in rows})
            valid = sorted(algorithm_names())
            unknown = [a for a in have if a not in valid]
            raise ConfigError(f"codec times {source} have no rows with \"algorithm\": "
                              f"{algorithm!r} (theirs: {', '.join(have) or 'none'}"
                              + (f"; valid: {', '.join(valid)}" if unknown else "")
                              + "); measure them with " + MEASURE.format(alg=algorithm, path=source))
        worlds = {int(r["world_size"]) for r in mine}
        if len(worlds) > 1:
            raise ConfigError(f"codec times {source} mix world sizes {sorted(worlds)}; keep the "
                              f"rows of one world size")
        points: dict[str, list[tuple[int, float]]] = {}
        for r in mine:
            if not (int(r["size_bytes"]) > 0 and float(r["median_s"]) > 0):
                raise ConfigError(f"codec times {source}: row {dict(r)} needs size_bytes > 0 and "
                                  f"median_s > 0")
            points.setdefault(str(r["codec"]), []).append((int(r["size_bytes"]),
                                                           float(r["median_s"])))
        return CodecTimes(algorithm, worlds.pop(), str(mine[0].get("link", "none")),
                          {c: tuple(sorted(p)) for c, p in points.items()}, source)

    @staticmethod
    def load(path: str | Path, algorithm: str) -> CodecTimes:
        try:
            rows = json.loads(Path(path).read_text())
            if not isinstance(rows, list):
                raise TypeError("not a list of rows")
            return CodecTimes.from_rows(rows, algorithm, str(path))
        except OSError as exc:
            raise ConfigError(f"cannot read codec times {path} ({exc.strerror}); write them "
                              f"with " + MEASURE.format(alg=algorithm, path=path)) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"codec times {path} are not `approxdist bench allreduce --json` "
                              f"rows ({exc}); write them with "
                              + MEASURE.format(alg=algorithm, path=path)) from None

    @property
    def codecs(self) -> list[str]:
        return list(self.points)

    def time(self, codec: str, nbytes: int) -> float:
        """The median all-reduce time of `nbytes` fp32 bytes in `codec`, interpolated."""
        pts = self.points[codec]
        if len(pts) == 1:
            return pts[0][1] * max(nbytes, 1) / pts[0][0]  # one size: time proportional to bytes
        i = next((k for k in range(1, len(pts) - 1) if nbytes <= pts[k][0]), len(pts) - 1)
        (s0, t0), (s1, t1) = pts[i - 1], pts[i]
        slope = (math.log(t1) - math.log(t0)) / (math.log(s1) - math.log(s0))
        return math.exp(math.log(t0) + slope * (math.log(max(nbytes, 1)) - math.log(s0)))

    def fastest(self, nbytes: int) -> str:
        """The codec with the lowest interpolated time for a message of `nbytes` fp32 bytes."""
        return min(self.codecs, key=lambda c: self.time(c, nbytes))

    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ConfigError(f"codec times {self.source} were measured on {self.world_size} "
                              f"ranks, this run reduces over {world_size}; re-measure with "
                              f"--world-size {world_size}")


def load_times(times: CodecTimes | str | Path | None, algorithm: str,
               world_size: int) -> CodecTimes | None:
    """Measured codec times for `algorithm` over `world_size` ranks (a file is loaded)."""
    if times is None:
        return None
    loaded = times if isinstance(times, CodecTimes) else CodecTimes.load(times, algorithm)
    loaded.check_world(world_size)
    return loaded
