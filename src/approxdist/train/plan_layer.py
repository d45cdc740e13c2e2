"""`train --plan FILE`: a plan file (DESIGN.md "Plan file") as a layer of config values.

The plan says which mode runs (one stage of one rank: single; one stage of N: dp; stages
of one rank each: pipeline; otherwise hybrid), the world size, where stages start
(`pipeline.split`), their replicas and placement, the schedule, micro-batches and the
three wire formats (`pipeline.fwd_codec`, `pipeline.bwd_codec`, `dp.codec` with
`dp.algorithm` for the replicas' all-reduce). With `micro_batch_size` the mini-batch is
M micro-batches of it (data parallel: one per rank). The layer sits above the config
file and below the flags, so `--microbatches` or `--set` still override it.
"""

from __future__ import annotations

from typing import Any

from approxdist.planner.plan_file import PlanFile


def plan_sections(plan: PlanFile) -> dict[str, dict[str, Any]]:
    """The config sections `plan` sets (only what it says)."""
    mode = plan.mode
    out: dict[str, dict[str, Any]] = {
        "train": {"parallel": mode, "world_size": plan.world_size}, "model": {},
        "pipeline": {}, "dp": {}, "data": {}}
    if plan.model is not None:
        out["model"]["name"] = plan.model
    if mode in ("pipeline", "hybrid"):
        pipe = out["pipeline"]
        pipe["stages"] = len(plan.replicas)
        if plan.blocks is not None:
            pipe["split"] = ",".join(str(first) for first, _ in plan.blocks[1:])
        if mode == "hybrid":
            pipe["replicas"] = list(plan.replicas)
        if plan.ranks is not None:
            pipe["placement"] = list(plan.ranks)
        for key in ("microbatches", "schedule", "fwd_codec", "bwd_codec"):
            if getattr(plan, key) is not None:
                pipe[key] = getattr(plan, key)
    if plan.grad_codec is not None:
        out["dp"]["codec"] = plan.grad_codec
    if plan.algorithm is not None:
        out["dp"]["algorithm"] = plan.algorithm
    if plan.micro_batch_size is not None:
        per_step = plan.world_size if mode == "dp" else (plan.microbatches or 1)
        out["data"]["batch_size"] = per_step * plan.micro_batch_size
    return {section: keys for section, keys in out.items() if keys}
