"""`approxdist plan --load-probe`: the model probed on this machine's ranks before planning.

A plan's compute on N ranks sharing a machine's cores costs more than its profile taken
alone (each evicting the others' caches, all sharing the memory bus): the *load factor*,
measured, not fitted (`train/profile_probe.py`). With `--load-probe` the ranks of the
plan that share this machine (all of them, or `--per-node`) start before anything is
planned and take `ANTE_ROUNDS` probes: rank 0 profiles the model alone, then 1 .. N of
them run whole passes at once. The plans are searched on the median profile alone and
then each is priced at its own load (`candidates.at_load`: between the profiles with the
two whole numbers of busy ranks around its own) and ranked again: what `plan validate`
calls the ex-ante price. Without it a plan is priced on one profile taken alone.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from approxdist.cli.plan_profile import measure, model_config
from approxdist.cli.plan_validate_calibrate import PROBE_REPEAT
from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.planner.cluster import ClusterSpec
from approxdist.planner.objective import SolverSettings
from approxdist.planner.pipedream_format import read_any_profile
from approxdist.planner.profile import Profile
from approxdist.planner.search import RankedPlan, TensorSpace
from approxdist.planner.validation.candidates import Candidate, at_load
from approxdist.train.profile_probe import (
    ANTE_ROUNDS,
    ProbeRound,
    ProfileProbe,
    by_busy,
    probe_before,
)

Loads = tuple[tuple[Profile, ...], tuple[float, ...]]


def planned_profile(args: argparse.Namespace, cluster: ClusterSpec
                    ) -> tuple[Profile, Loads | None]:
    """The profile `plan` searches on (`--profile`'s, or the model profiled now at the
    threads each rank will have) and, with `--load-probe`, the measured loads."""
    if args.profile:
        if args.load_probe:
            raise ConfigError(f"--load-probe probes the model on this machine's ranks; "
                              f"--profile {args.profile!r} is a profile file: give --model "
                              f"instead, or drop --load-probe")
        profile = read_any_profile(args.profile)
        if args.model and args.model != profile.model:
            raise ConfigError(f"--profile {args.profile!r} is of model {profile.model!r}, not "
                              f"--model {args.model!r}; profile {args.model} with approxdist "
                              f"plan profile, or drop --model")
        return profile, None
    if not args.model:
        raise ConfigError("give --model M (profiled now) or --profile FILE")
    busy = cluster.network().busy(cluster.ranks)
    threads = args.threads or max(1, (os.cpu_count() or 1) // busy)
    if not args.load_probe:
        return measure(args, args.microbatch_size, threads), None
    loads = probe_load(args, busy, threads)
    return loads[0][0], loads


def probe_load(args: argparse.Namespace, ranks: int, threads: int) -> Loads:
    """The model the flags name probed on `ranks` local ranks: `by_busy`'s profiles and
    load factors for 1 .. `ranks` of them computing."""
    return by_busy(ante_probe(model_config(args), args.microbatch_size, threads, ranks)[1])


def ante_probe(cfg: Config, microbatch: int, threads: int, ranks: int
               ) -> tuple[ProfileProbe, list[ProbeRound]]:
    """`cfg`'s model's probe (`plan validate` takes it again in its timed rounds) and its
    `ANTE_ROUNDS` rounds on `ranks` local ranks, before anything else runs (rank 0's)."""
    probe = ProfileProbe(cfg.model, cfg.data, microbatch, threads, PROBE_REPEAT,
                         cfg.pipeline.fuse_accumulation, 2 * PROBE_REPEAT)
    return probe, run_on_ranks(probe_before, ranks, probe, ANTE_ROUNDS, timeout_s=600)[0]


def ranked_at_load(ranked: list[RankedPlan], loads: Loads, base: SolverSettings,
                   tensor: TensorSpace | None = None) -> list[RankedPlan]:
    """`ranked`, each plan's step priced at its load, fastest per sample first."""
    profiles, factors = loads
    out = [replace(r, step_s=at_load(Candidate(r, ()), profiles, factors, base, tensor)[0])
           for r in ranked]
    return sorted(out, key=lambda p: (p.per_sample_s, len(p.plan.stages)))


def load_line(loads: Loads) -> str:
    """One line: the measured load factors."""
    factors = ", ".join(f"{k} x{f:.3f}" for k, f in enumerate(loads[1], 1))
    return (f"priced at each plan's load: this machine's CPU per pass with 1 .. "
            f"{len(loads[1])} ranks computing against alone ({factors})")
