"""`train --plan FILE`: a plan file (docs/planner.md, "Planning") as a layer of config values.

The plan says which mode runs (the record whose `plan` is the kind of its mesh,
`planner.kinds`: one stage of one rank: single; one stage of N: dp; stages of one rank
each: pipeline; a stage with tp shards: tensor; otherwise hybrid), the world size,
where stages start (`pipeline.split`), their replicas and placement, the tp size and
plan (`tp.size`, `tp.plan`), the schedule, micro-batches and the codecs of the three wires its mode has
(`fwd_codec` and `bwd_codec` as the mode's `--fwd-codec` / `--bwd-codec` set them:
`wire.fwd.codec` in a pipeline, `wire.tp_fwd.codec` in tensor parallelism;
`wire.grad.codec` with `dp.algorithm` for the replicas' all-reduce). With
`micro_batch_size` the mini-batch is M micro-batches of it (data and tensor parallel: one
per replica). The layer sits above the config
file and below the flags, so `--microbatches` or `--set` still override it; but what the
plan was made for (`model`, `model_options`, `data`) is binding: a flag or `--set` that
contradicts it is a `ConfigError` (`check_agrees`), and `check_input_shape` compares the
data set's samples with the profiled `input_shape`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from approxdist.errors import ConfigError
from approxdist.planner.plan_file import PlanFile
from approxdist.train.mode import plan_mode

#: the flags that set a binding key (others are named as `--set section.key=value`)
FLAGS = {("model", "name"): "--model", ("data", "dataset"): "--dataset",
         ("data", "data_dir"): "--data-dir"}


def plan_sections(plan: PlanFile) -> dict[str, dict[str, Any]]:
    """The config sections `plan` sets (only what it says)."""
    mode = plan_mode(plan.mesh)
    out: dict[str, dict[str, Any]] = {
        "train": {"parallel": mode.name, "world_size": plan.world_size}, "model": {},
        "pipeline": {}, "dp": {}, "data": {}, "wire": {}}
    reads = mode.reads
    out["model"].update(binding(plan)["model"])
    out["data"].update(binding(plan)["data"])
    staged = reads("pipeline.stages")
    if staged:
        pipe = out["pipeline"]
        pipe["stages"] = len(plan.replicas)
        if plan.blocks is not None:
            pipe["split"] = ",".join(str(first) for first, _ in plan.blocks[1:])
        if reads("pipeline.replicas"):
            pipe["replicas"] = list(plan.replicas)
        if plan.ranks is not None:
            pipe["placement"] = list(plan.ranks)
        for key in ("microbatches", "schedule"):
            if getattr(plan, key) is not None:
                pipe[key] = getattr(plan, key)
    if reads("tp.size") and plan.tp > 1:
        out["tp"] = {"size": plan.tp, **({"plan": plan.tp_plan} if plan.tp_plan else {})}
    flag_keys = mode.flag_keys
    for name, codec in (("fwd", plan.fwd_codec), ("bwd", plan.bwd_codec),
                        ("grad", plan.grad_codec)):
        key = flag_keys.get(f"{name}_codec", f"wire.{name}.codec")
        if codec is not None and reads(key):
            out["wire"][key.split(".")[1]] = {"codec": codec}
    if plan.algorithm is not None and reads("dp.algorithm"):
        out["dp"]["algorithm"] = plan.algorithm
    if plan.micro_batch_size is not None:
        # a pipeline's ranks share one batch of M micro-batches; replicas each take one
        per_step = (plan.microbatches or 1) if staged else sum(plan.replicas)
        out["data"]["batch_size"] = per_step * plan.micro_batch_size
    return {section: keys for section, keys in out.items() if keys}


def binding(plan: PlanFile) -> dict[str, dict[str, Any]]:
    """What the plan was made for, as config values: `model.name`, its options, the data."""
    model = {"name": plan.model} if plan.model is not None else {}
    return {"model": {**model, **(plan.model_options or {})}, "data": dict(plan.data or {})}


def check_agrees(plan: PlanFile, path: str, flags: Mapping[str, Mapping[str, Any]],
                 overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """One `ConfigError` line if a flag (`flags`) or `--set` (`overrides`) sets a key the
    plan in `path` binds to another value."""
    for section, planned in binding(plan).items():
        for layer, from_set in ((flags, False), (overrides, True)):
            for key, value in layer.get(section, {}).items():
                if key in planned and _plain(value) != _plain(planned[key]):
                    flag = f"--set {section}.{key}={_text(value)}" if from_set else \
                        f"{FLAGS.get((section, key), '--' + key)} {_text(value)}"
                    raise ConfigError(
                        f"{flag} contradicts plan file {path!r}, made for {section}.{key} = "
                        f"{_text(planned[key])}; drop the flag to train what was planned, or "
                        f"plan again with it (approxdist plan ... --json {path})")


def check_input_shape(plan: PlanFile, path: str, dataset: str, shape: tuple[int, ...]) -> None:
    """One `ConfigError` line if the data set's samples are not the shape profiled."""
    if plan.input_shape is not None and tuple(shape) != plan.input_shape:
        raise ConfigError(f"data set {dataset!r} has samples of shape {list(shape)}; plan file "
                          f"{path!r} was profiled on {list(plan.input_shape)}; train on the "
                          f"data set it names, or plan again on this one")


def _plain(value: Any) -> Any:
    """Tuples as lists, so a flag's value compares with the file's."""
    return json.loads(json.dumps(value))


def _text(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)
