"""Fit a link level's alpha, beta and gamma to measurements: `bench allreduce` rows and p2p times.

Each `bench allreduce --json` row (algorithm, codec, size_bytes, world_size, median_s,
link) is one equation of the model in `collectives.py`:

    median_s = load(N) (alpha m + beta w + gamma a) + load(N) (e E + d D)

with m, w, a, E, D the step totals of that algorithm, world and size (the segments an
emulated link uses, `wire.link_segment`, when the row's link is not "none"), and the codec
term known (`CodecCost`). A p2p row (`size_bytes`, `median_s`: one message one way) is
`median_s = load(2) (alpha + beta size_bytes)`. `fit_level` solves all of them for
alpha, beta, gamma >= 0 by least squares on the *relative* error (sizes span 4 KiB to
64 MiB; each row weighs as much as any other), exactly: it solves every support of the
three unknowns and keeps the best one that is non-negative (ties: fewer unknowns, then
alpha, beta, gamma order). With rows of one algorithm only, bytes sent and bytes added
grow together and gamma cannot be told from beta: it is left 0 and beta carries both
(add `brd` rows, which add as many bytes as they send, to separate them).

Used: rows of `ring`, `brb`, `brd`, `vhd` (our implementations, which the model counts);
`native` (gloo's C++ ring) and `auto` (a choice, not an algorithm) are skipped, and rows
of a codec whose costs were not given, and worlds of 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives.wire import link_segment
from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32, allreduce_steps, total
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.cost.nnls import nonnegative_lstsq

FITTED = ("ring", "brb", "brd", "vhd")
_ROW_KEYS = ("algorithm", "codec", "size_bytes", "world_size", "median_s")


@dataclass(frozen=True)
class Fit:
    """A fitted level and how well it fits: rows used, rms and worst relative error (of
    each measured time less its known codec time)."""

    level: LinkLevel
    rows: int
    rms_rel_error: float
    max_rel_error: float
    world_sizes: tuple[int, ...]
    link: str
    source: str = ""


def fit_level(name: str, allreduce_rows: Sequence[Mapping[str, Any]] = (),
              p2p_rows: Sequence[Mapping[str, Any]] = (), *, cores: int | None = None,
              codecs: Mapping[str, CodecCost] | None = None, link: str | None = None,
              source: str = "") -> Fit:
    """alpha, beta, gamma of level `name` from `bench allreduce` rows and p2p rows.

    `codecs`: the codecs whose rows count, with their coding costs (default fp32 only);
    `link`: the rows' link to use when they were measured on several; `cores`: the shared
    cores of a `loopback` level (each row's load is max(1, world / cores))."""
    probe = LinkLevel(name, 0.0, 0.0, 0.0, cores)
    costs = dict(codecs) if codecs is not None else {"fp32": FP32}
    rows, chosen = _select(allreduce_rows, costs, link)
    x, t = [], []
    for r in rows:
        features, time = _equation(r, costs[r["codec"]], probe, chosen)
        x.append(features)
        t.append(time)
    for i, row in enumerate(p2p_rows):
        p2p = _checked(i, row, "p2p")
        x.append([probe.load(2), probe.load(2) * p2p["size_bytes"], 0.0])
        t.append(p2p["median_s"])
    if len(t) < 2:
        raise DataError(f"{len(t)} usable measurement(s) for level {name!r} (link {chosen!r}, "
                        f"codecs {', '.join(sorted(costs))}); need >= 2, e.g. approxdist bench "
                        f"allreduce --world-size 2 --sizes 4K,1M,16M --algorithms ring,brd "
                        f"--json FILE")
    coef = _nnls_relative(np.array(x, dtype=float), np.array(t, dtype=float))
    level = LinkLevel(name, float(coef[0]), float(coef[1]), float(coef[2]), cores)
    errors = [abs(float(np.dot(xi, coef)) - ti) / ti for xi, ti in zip(x, t)]
    worlds = tuple(sorted({r["world_size"] for r in rows}))
    return Fit(level, len(t), math.sqrt(sum(e * e for e in errors) / len(errors)),
               max(errors), worlds, chosen, source)


def _select(rows: Sequence[Mapping[str, Any]], costs: Mapping[str, CodecCost],
            link: str | None) -> tuple[list[dict[str, Any]], str]:
    """The checked rows the model counts, all of one link (`link`, or the only one)."""
    kept = [r for r in (_checked(i, r, "allreduce") for i, r in enumerate(rows))
            if r["algorithm"] in FITTED and r["codec"] in costs and r["world_size"] > 1]
    links = sorted({str(r.get("link", "none")) for r in kept})
    if link is None and len(links) > 1:
        raise ConfigError(f"the all-reduce rows were measured on links {', '.join(links)}; "
                          f"fit one level at a time with link=<one of them>")
    chosen = link if link is not None else (links[0] if links else "none")
    return [r for r in kept if str(r.get("link", "none")) == chosen], chosen


def _equation(row: Mapping[str, Any], codec: CodecCost, probe: LinkLevel,
              link: str) -> tuple[list[float], float]:
    """load (messages, wire bytes, bytes added) and the time less the known codec time."""
    seg = None if link == "none" else link_segment(get_codec(codec.spec).bits_per_value)
    s = total(allreduce_steps(row["algorithm"], row["world_size"], row["size_bytes"] // 4,
                              codec, seg))
    load = probe.load(row["world_size"])
    coding = codec.encode_s(s.encode_bytes) + codec.decode_s(s.decode_bytes)
    return ([load * s.messages, load * s.wire_bytes, load * s.reduce_bytes],
            row["median_s"] - load * coding)


def _nnls_relative(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """argmin over c >= 0 of sum ((x c - t) / t)^2, by trying every support (3 unknowns)."""
    if np.any(t <= 0):
        bad = float(t[t <= 0][0])
        raise DataError(f"a measured time less the known codec time is {bad!r} s; times must "
                        f"be > 0 (the codec costs given may be too high)")
    coef = nonnegative_lstsq(x / t[:, None], np.ones_like(t))
    if coef is None:
        raise DataError("no non-negative alpha, beta, gamma fits these measurements (every "
                        "row has zero messages and bytes?); measure sizes above 0")
    return coef


def _checked(i: int, row: Any, kind: str) -> dict[str, Any]:
    """The row if its keys hold the right types; `DataError` naming row, key and value."""
    keys = _ROW_KEYS if kind == "allreduce" else ("size_bytes", "median_s")
    writer = "approxdist bench allreduce --json FILE" if kind == "allreduce" else \
        "one {\"size_bytes\": ..., \"median_s\": ...} object per message size"
    if not isinstance(row, Mapping):
        raise DataError(f"{kind} row {i} = {row!r} is not an object; write rows with {writer}")
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{kind} row {i} lacks {', '.join(map(repr, missing))}; rows need "
                        f"{', '.join(keys)} ({writer})")
    for key in ("size_bytes", "world_size"):
        value = row.get(key, 2)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key ==
                                                                              "world_size" else 0):
            raise DataError(f"{kind} row {i} {key} = {value!r} must be a whole number "
                            f"{'>= 1' if key == 'world_size' else 'of bytes >= 0'}")
    value = row["median_s"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise DataError(f"{kind} row {i} median_s = {value!r} must be a number of seconds > 0")
    return dict(row)
