"""The profile file (docs/planner.md, "The profile file"): per-block times and sizes of one model.

A `Profile` is what a partitioner sees of a model: for each block of its `nn.Sequential`
(or each layer of a linearised graph), forward and backward seconds at the stated
micro-batch size and thread count, the seconds its backward adds when it accumulates into
gradients that already exist (`acc_s`: every micro-batch of a step after a rank's first;
optional in the file, 0 where a profile does not say, as PipeDream's do not), and the
bytes it outputs, holds as parameters and stashes for its backward pass. It is validated
on construction and round-trips through one JSON object:

    {
     "format": "approxdist-profile",
     "version": 1,
     "model": "alexnet",
     "input_shape": [3, 224, 224],
     "micro_batch_size": 256,
     "threads": null,
     "torch_version": "unknown (PipeDream graph.txt)",
     "machine": "unknown (PipeDream profile alexnet.txt)",
     "model_options": {...}, "data": {...},     (optional: what it was measured on)
     "blocks": [
      {"name": "node2 Conv2d(3, 64, ...)", "fwd_s": 0.022316, "bwd_s": 0.006405,
       "out_bytes": 198246400, "param_bytes": 93184, "stash_bytes": 154140672,
       "acc_s": 0.0, "param_sizes": [92928, 256]},
      ...
     ]
    }
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from approxdist.errors import ConfigError, DataError
from approxdist.pipeline.block_profile import BlockProfile
from approxdist.planner.plan_file import check_table
from approxdist.text import read_text

FORMAT = "approxdist-profile"
VERSION = 1
_BLOCK_KEYS = ("name", "fwd_s", "bwd_s", "out_bytes", "param_bytes", "stash_bytes", "acc_s",
               "param_sizes", "input_s", "weight_s")
_OPTIONAL_BLOCK_KEYS = ("acc_s", "param_sizes", "input_s", "weight_s")
_TOP_KEYS = ("format", "version", "model", "input_shape", "micro_batch_size", "threads",
             "torch_version", "machine", "blocks", "model_options", "data")
_OPTIONAL_TOP_KEYS = ("model_options", "data")
_HOW_TO_GET_ONE = ("write one with approxdist.planner.write_profile, or convert a PipeDream "
                   "graph.txt with approxdist.planner.read_pipedream_profile")


@dataclass(frozen=True)
class Profile:
    """A model's blocks in execution order, and the conditions they were measured under.

    `threads` is None where the profile does not say (e.g. measured on a GPU).
    """

    model: str
    input_shape: tuple[int, ...]
    micro_batch_size: int
    threads: int | None
    torch_version: str
    machine: str
    blocks: tuple[BlockProfile, ...]
    #: the model's options and data set it was measured on (the plan file's keys), None
    #: where unknown (PipeDream's profiles): `plan --profile` writes them into the plan
    model_options: dict[str, Any] | None = None
    data: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for field in ("model", "torch_version", "machine"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise DataError(f"profile {field} = {value!r} must be a non-empty string")
        shape = self.input_shape
        if not isinstance(shape, tuple) or not shape or not all(_positive_int(d) for d in shape):
            raise DataError(f"profile input_shape = {shape!r} must be a non-empty tuple of "
                            "positive integers (one sample's shape, e.g. (3, 224, 224))")
        if not _positive_int(self.micro_batch_size):
            raise DataError(f"profile micro_batch_size = {self.micro_batch_size!r} must be an "
                            "integer >= 1 (the batch the times were measured at)")
        if self.threads is not None and not _positive_int(self.threads):
            raise DataError(f"profile threads = {self.threads!r} must be an integer >= 1, or "
                            "None where unknown")
        for key in ("model_options", "data"):
            table = getattr(self, key)
            if table is not None:
                try:
                    check_table(key, table)
                except ConfigError as exc:
                    raise DataError(f"profile {exc}") from None
        self._check_blocks()

    @property
    def planned_for(self) -> dict[str, dict[str, Any]] | None:
        """The plan file's `model_options` and `data`, where the profile knows both."""
        if self.model_options is None or self.data is None:
            return None
        return {"model_options": dict(self.model_options), "data": dict(self.data)}

    def _check_blocks(self) -> None:
        if not isinstance(self.blocks, tuple) or not self.blocks:
            raise DataError(f"profile blocks = {self.blocks!r} must be a non-empty tuple of "
                            "BlockProfile; profile at least one block")
        seen: set[str] = set()
        for i, block in enumerate(self.blocks):
            if not isinstance(block, BlockProfile):
                raise DataError(f"profile blocks[{i}] = {block!r} must be a BlockProfile")
            if block.name in seen:
                raise DataError(f"profile blocks[{i}] repeats the name {block.name!r}; give "
                                "every block its own name")
            seen.add(block.name)

    @property
    def total_compute_s(self) -> float:
        """Forward plus backward seconds of the whole model on one worker."""
        return sum(b.compute_s for b in self.blocks)

    @property
    def total_param_bytes(self) -> int:
        return sum(b.param_bytes for b in self.blocks)


def median_profile(profiles: Sequence[Profile]) -> Profile:
    """One profile from several of the same model under the same conditions (taken at
    different moments): each block's seconds are the median of its seconds in `profiles`
    (`DataError` where they are not profiles of the same blocks, batch and threads)."""
    if not profiles:
        raise DataError("median_profile needs at least one profile")
    first = profiles[0]
    same = ("model", "input_shape", "micro_batch_size", "threads")
    shape = [(b.name, b.out_bytes, b.param_bytes, b.stash_bytes, b.param_sizes)
             for b in first.blocks]
    for i, other in enumerate(profiles[1:], 1):
        differs = [k for k in same if getattr(other, k) != getattr(first, k)]
        if differs or [(b.name, b.out_bytes, b.param_bytes, b.stash_bytes, b.param_sizes)
                       for b in other.blocks] != shape:
            what = ", ".join(differs) or "blocks"
            raise DataError(f"profiles[{i}] differs from profiles[0] in {what}: a median "
                            "profile is of one model measured the same way")
    mid = statistics.median
    split = all(b.split_known for p in profiles for b in p.blocks)
    blocks = tuple(replace(block, fwd_s=mid(p.blocks[i].fwd_s for p in profiles),
                           bwd_s=mid(p.blocks[i].bwd_s for p in profiles),
                           acc_s=mid(p.blocks[i].acc_s for p in profiles),
                           input_s=mid(_known(p.blocks[i].input_s) for p in profiles)
                           if split else None,
                           weight_s=mid(_known(p.blocks[i].weight_s) for p in profiles)
                           if split else None)
                   for i, block in enumerate(first.blocks))
    return replace(first, blocks=blocks)


def scale_times(profile: Profile, factor: float) -> Profile:
    """`profile` with every block's seconds (forward, backward, accumulate) times `factor`
    (e.g. what its compute costs under load against alone); sizes as they were."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not math.isfinite(factor) or factor <= 0:
        raise DataError(f"time factor = {factor!r} must be a finite number > 0")
    return replace(profile, blocks=tuple(b.scaled(factor) for b in profile.blocks))


def _known(seconds: float | None) -> float:
    assert seconds is not None, "checked by the caller"
    return seconds


def to_json(profile: Profile) -> str:
    """The profile as one JSON object (with `format` and `version`, so files are
    recognisable): a key per line, a block per line."""
    head = {"format": FORMAT, "version": VERSION, "model": profile.model,
            "input_shape": list(profile.input_shape), "micro_batch_size": profile.micro_batch_size,
            "threads": profile.threads, "torch_version": profile.torch_version,
            "machine": profile.machine,
            **{k: getattr(profile, k) for k in _OPTIONAL_TOP_KEYS
               if getattr(profile, k) is not None}}
    lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    blocks = ",\n".join("  " + json.dumps(_block_json(b)) for b in profile.blocks)
    return "{\n" + "\n".join(lines) + '\n "blocks": [\n' + blocks + "\n ]\n}"


def _block_json(block: BlockProfile) -> dict[str, Any]:
    """A block's keys (`param_sizes` as a list; it and the split backward's halves left
    out where unknown)."""
    out: dict[str, Any] = {k: getattr(block, k) for k in _BLOCK_KEYS
                           if k not in ("param_sizes", "input_s", "weight_s")}
    if block.param_sizes:
        out["param_sizes"] = list(block.param_sizes)
    if block.split_known:
        out.update(input_s=block.input_s, weight_s=block.weight_s)
    return out


def from_json(text: str, source: str = "profile") -> Profile:
    """The profile in `text`; `DataError` naming `source`, the bad key and its value."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (" (it looks like a PipeDream graph.txt: read it with "
                "approxdist.planner.read_pipedream_profile)") if looks_like_pipedream(text) else ""
        raise DataError(f"{source} is not JSON ({exc.msg} at line {exc.lineno}){hint}; "
                        f"{_HOW_TO_GET_ONE}") from None
    if not isinstance(data, dict) or "blocks" not in data:
        why = "no 'blocks' key" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise DataError(f"{source} is not an approxdist profile ({why}); {_HOW_TO_GET_ONE}")
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise DataError(f"{source} has format = {data.get('format')!r}, version = "
                        f"{data.get('version')!r}; this approxdist reads format {FORMAT!r} "
                        f"version {VERSION}")
    try:
        return _profile_from_dict(data)
    except DataError as exc:
        raise DataError(f"{source}: {exc}") from None


def write_profile(profile: Profile, path: str | Path) -> None:
    """Write `profile` as JSON to `path`."""
    Path(path).write_text(to_json(profile) + "\n")


def read_profile(path: str | Path) -> Profile:
    """The profile in the JSON file `path`; one `DataError` line if it is missing or foreign."""
    text = read_text(path, "profile file", _HOW_TO_GET_ONE)
    return from_json(text, source=f"profile file {str(path)!r}")


def _profile_from_dict(data: dict[str, Any]) -> Profile:
    _check_keys("profile", data, _TOP_KEYS, _OPTIONAL_TOP_KEYS)
    blocks, shape = data["blocks"], data["input_shape"]
    if not isinstance(blocks, list):
        raise DataError(f"profile blocks = {blocks!r} must be a list of block objects")
    return Profile(model=data["model"],
                   input_shape=tuple(shape) if isinstance(shape, list) else shape,
                   micro_batch_size=data["micro_batch_size"], threads=data["threads"],
                   torch_version=data["torch_version"], machine=data["machine"],
                   blocks=tuple(_block_from_dict(i, b) for i, b in enumerate(blocks)),
                   model_options=data.get("model_options"), data=data.get("data"))


def _block_from_dict(i: int, entry: Any) -> BlockProfile:
    if not isinstance(entry, dict):
        raise DataError(f"profile blocks[{i}] = {entry!r} must be an object with keys "
                        f"{', '.join(_BLOCK_KEYS)}")
    _check_keys(f"profile blocks[{i}]", entry, _BLOCK_KEYS, _OPTIONAL_BLOCK_KEYS)
    return BlockProfile(**entry)


def _check_keys(where: str, data: dict[str, Any], valid: tuple[str, ...],
                optional: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise DataError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; valid: "
                        f"{', '.join(valid)}")
    missing = [k for k in valid if k not in data and k not in optional]
    if missing:
        raise DataError(f"{where} lacks {', '.join(map(repr, missing))}; it needs all of "
                        f"{', '.join(k for k in valid if k not in optional)}")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def looks_like_pipedream(text: str) -> bool:
    """Whether `text` starts like a PipeDream graph.txt (`nodeN -- ... forward_compute_time=`)."""
    first = text.lstrip().split("\n", 1)[0]
    return " -- " in first and "forward_compute_time=" in first
