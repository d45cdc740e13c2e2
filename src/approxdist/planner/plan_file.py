"""The plan file (docs/planner.md, "Planning"): what `approxdist plan` writes and `train --plan` runs.

    {
     "format": "approxdist-plan", "version": 1,
     "model": "mlp", "model_options": {"hidden": 256, "depth": 3, ...},
     "data": {"dataset": "digits", "data_dir": "", ...}, "input_shape": [1, 8, 8],
     "micro_batch_size": 32, "world_size": 4, "mode": "hybrid",
     "stages": [{"blocks": [0, 13], "replicas": 3}, {"blocks": [13, 22], "replicas": 1}],
     "tp_plan": "1.attn=heads,1.mlp.0=colwise,1.mlp.2=rowwise",     (tensor plans only)
     "schedule": "1f1b", "microbatches": 12,
     "fwd_codec": "fp32", "bwd_codec": "fp32", "grad_codec": "fp32", "algorithm": "auto",
     "link": {"intra": "bw=8gbit", "inter": null, "per_node": null, "nodes": null},
     "objective": "ours",
     "predicted": {"time_per_step_s": 0.19, "time_per_sample_s": 0.0005,
                   "memory_per_stage_bytes": [..], "time": {"bubble_fraction": 0.3, ...}}
    }

Pure data: a hand-written plan is as valid as a generated one. `read_plan` needs only
`stages` (each `replicas`, and `blocks` [first, end) on every stage or on none; `ranks`
as `topology.plan` reads them); every other key is optional and checked when present.
A pure data-parallel run is one stage with `replicas = world_size`; a tensor-parallel one
is one stage whose `tp` (shards per replica) is above 1, with `tp_plan` the layers split
(`layer.path=style,...`, as `--tp-plan` takes it; absent: the model's own plan). `model`,
`model_options` (the `[model]` keys but `name`), `data` (the `[data]` keys in `DATA_KEYS`:
which samples) and `input_shape` (one sample's, as profiled) say what was planned for:
`train --plan` trains that and refuses a flag that contradicts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from approxdist.comm.collectives.registry import algorithm_names
from approxdist.config.loader import section_dict
from approxdist.config.schema import DataConfig, ModelConfig
from approxdist.errors import ConfigError
from approxdist.text import read_json, write_json
from approxdist.topology import Mesh, TopologyError, from_plan

FORMAT = "approxdist-plan"
VERSION = 1
_STRINGS = ("model", "schedule", "fwd_codec", "bwd_codec", "grad_codec", "algorithm", "mode",
            "objective", "tp_plan")
_INTS = ("micro_batch_size", "microbatches", "world_size")
#: the [data] keys that say which samples a plan was made for (not how they are batched)
DATA_KEYS = ("dataset", "data_dir", "synthetic_shape", "synthetic_classes",
             "synthetic_samples", "seq_len")
#: the [model] keys a plan's `model_options` may hold (`name` is the plan's `model`)
MODEL_KEYS = tuple(f.name for f in fields(ModelConfig) if f.name != "name")


def planned_for(model: ModelConfig, data: DataConfig) -> dict[str, dict[str, Any]]:
    """`model_options` and `data` of a plan (and of the profile it came from): what
    `train --plan` must train."""
    options, samples = section_dict(model), section_dict(data)
    return {"model_options": {k: v for k, v in options.items() if k in MODEL_KEYS},
            "data": {k: samples[k] for k in DATA_KEYS}}


def check_table(key: str, table: Any) -> dict[str, Any]:
    """`table` as the object of `model_options` or `data` (`ConfigError` naming the bad
    key otherwise)."""
    known = MODEL_KEYS if key == "model_options" else DATA_KEYS
    if not isinstance(table, dict):
        raise ConfigError(f"{key} = {table!r} must be an object of {', '.join(known)}")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{key} has unknown key {unknown[0]!r}; known: {', '.join(known)}")
    return dict(table)


@dataclass(frozen=True)
class PlanFile:
    """A plan as `train` needs it: its mesh (stages, replicas, tp shards), block ranges,
    schedule and wire formats (None where the file does not say). Which mode runs it is the
    mode registry's to say (`train.mode.plan_mode`), from the mesh."""

    mesh: Mesh
    blocks: tuple[tuple[int, int], ...] | None
    ranks: tuple[int, ...] | None  # stage-major placement, when the file gives one
    model: str | None = None
    micro_batch_size: int | None = None
    microbatches: int | None = None
    schedule: str | None = None
    fwd_codec: str | None = None
    bwd_codec: str | None = None
    grad_codec: str | None = None
    algorithm: str | None = None
    model_options: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    input_shape: tuple[int, ...] | None = None
    tp_plan: str | None = None

    @property
    def replicas(self) -> tuple[int, ...]:
        """Replica count of each stage."""
        return self.mesh.replicas

    @property
    def tp(self) -> int:
        """Tensor-parallel shards of every replica."""
        return self.mesh.extent("tp")

    @property
    def world_size(self) -> int:
        return self.mesh.world_size


def write_plan(plan: Mapping[str, Any], path: str | Path) -> Path:
    """Write a plan object (`format` and `version` first) as JSON."""
    return write_json(path, {"format": FORMAT, "version": VERSION, **plan})


def read_plan(path: str | Path) -> PlanFile:
    """The plan in `path`; one `ConfigError` line naming the file, the key and the value."""
    data = read_plan_object(path)
    try:
        return parse_plan(data)
    except (ConfigError, TopologyError) as exc:
        raise ConfigError(f"plan file {str(path)!r}: {exc}") from None


def read_plan_object(path: str | Path) -> dict[str, Any]:
    """The JSON object in the plan file `path`, unparsed (`plan show` prints it as written);
    one `ConfigError` line where it is missing, not JSON or another format's."""
    where = f"plan file {str(path)!r}"
    data = read_json(path, "plan file", "write one with approxdist plan --json FILE", ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold one JSON object with 'stages'")
    if "format" in data and (data["format"], data.get("version")) != (FORMAT, VERSION):
        raise ConfigError(f"{where} has format {data['format']!r} version "
                          f"{data.get('version')!r}; this approxdist reads {FORMAT!r} "
                          f"version {VERSION}")
    return data


def parse_plan(data: Mapping[str, Any]) -> PlanFile:
    """A plan object's `PlanFile` (`ConfigError` / `TopologyError` naming the bad value)."""
    mesh = from_plan(data)
    stages = data["stages"]
    blocks = [entry.get("blocks") for entry in stages]
    if any(b is None for b in blocks) and not all(b is None for b in blocks):
        raise ConfigError("'blocks' is given for some stages only; give [first, end) for every "
                          "stage or for none")
    ranges = None if blocks[0] is None else tuple(_range(s, b) for s, b in enumerate(blocks))
    if ranges is not None:
        for s in range(1, len(ranges)):
            if ranges[s][0] != ranges[s - 1][1]:
                raise ConfigError(f"stages[{s}].blocks = {list(ranges[s])} must start where "
                                  f"stage {s - 1} ends (block {ranges[s - 1][1]})")
        if ranges[0][0] != 0:
            raise ConfigError(f"stages[0].blocks = {list(ranges[0])} must start at block 0")
    for key in _STRINGS:
        if key in data and not (isinstance(data[key], str) and data[key]):
            raise ConfigError(f"{key} = {data[key]!r} must be a non-empty string")
    if "algorithm" in data and data["algorithm"] not in algorithm_names():
        raise ConfigError(f"algorithm = {data['algorithm']!r} is not an all-reduce algorithm; "
                          f"valid: {', '.join(sorted(algorithm_names()))}")
    for key in _INTS:
        value = data.get(key)
        if key in data and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key} = {value!r} must be an integer >= 1")
    given = stages[0].get("ranks") is not None
    shape = data.get("input_shape")
    tp = mesh.extent("tp")
    if tp > 1 and len(mesh.replicas) > 1:
        raise ConfigError(f"stages give tp = {tp} on {len(mesh.replicas)} stages; tensor "
                          f"parallelism with pipeline stages (tp x pp) is not built: give one "
                          f"stage with tp, or stages without it")
    if "tp_plan" in data and tp == 1:
        raise ConfigError(f"tp_plan = {data['tp_plan']!r} but no stage has tp > 1; give the "
                          f"stage its \"tp\" shards, or drop tp_plan")
    return PlanFile(mesh, ranges,
                    mesh.ranks if given else None,
                    **{k: data.get(k) for k in ("model", "micro_batch_size", "microbatches",
                                                "schedule", "fwd_codec", "bwd_codec",
                                                "grad_codec", "algorithm")},
                    model_options=_table(data, "model_options"),
                    data=_table(data, "data"),
                    input_shape=None if shape is None else _shape(shape),
                    tp_plan=data.get("tp_plan"))


def _table(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """`data[key]`: an object of its known keys (None when absent)."""
    return check_table(key, data[key]) if key in data else None


def _shape(value: Any) -> tuple[int, ...]:
    ok = isinstance(value, list) and value and \
        all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    if not ok:
        raise ConfigError(f"input_shape = {value!r} must be a non-empty list of sizes >= 1, "
                          f"e.g. [3, 32, 32]")
    return tuple(value)


def _range(stage: int, value: Any) -> tuple[int, int]:
    ok = isinstance(value, list) and len(value) == 2 and \
        all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok or not 0 <= value[0] < value[1]:
        raise ConfigError(f"stages[{stage}].blocks = {value!r} must be [first, end) with "
                          f"0 <= first < end")
    return value[0], value[1]
