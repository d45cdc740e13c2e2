"""The held-out configurations of `approxdist plan validate` (pure, fixed, documented).

A *setting* is a model on a world of local ranks joined by a link, with one wire format
for activations, their gradients and the replicas' all-reduce; in each setting several
plans are measured (`candidates`), so a configuration is a setting x a plan. The models
differ in what limits them: `mlp-wide` (6 x 1024-wide layers on 784 inputs) moves 24 MB
of gradients and 128 KiB per activation; `resnet20` holds 1 MB of parameters and moves
up to 1 MiB per activation, so data parallelism and pipelines trade places between them
and between links. The full set is every model x 2, 3, 4 ranks x (no emulated link,
fp32), (1 Gbit/s, fp32), (1 Gbit/s, bf16): 18 settings; `--quick` is the documented
subset `QUICK`. `TENSOR` (`plan validate --tensor`) are the tensor-parallel settings.

Nothing here was used to fit the cost model: the calibration is measured on all-reduces
alone (`plan validate` fits it first, or reads `--calibration`), and the profiles on one
rank, so every configuration is held out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """A model with its data, as config sections, profiled at `micro_batch_size`."""

    label: str
    sections: dict[str, dict[str, Any]] = field(hash=False)
    micro_batch_size: int

    @property
    def name(self) -> str:
        return str(self.sections["model"]["name"])


MODELS = {
    "mlp-wide": ModelSpec("mlp-wide", {
        "model": {"name": "mlp", "hidden": 1024, "depth": 6},
        "data": {"dataset": "synthetic", "synthetic_shape": [784], "synthetic_samples": 512,
                 "augment": False}}, 32),
    "resnet20": ModelSpec("resnet20", {
        "model": {"name": "resnet20"},
        "data": {"dataset": "synthetic", "synthetic_shape": [3, 32, 32],
                 "synthetic_samples": 512, "augment": False}}, 16),
}

#: (emulated link or "" for none, wire format)
WIRES = (("", "fp32"), ("bw=1gbit", "fp32"), ("bw=1gbit", "bf16"))


@dataclass(frozen=True)
class Setting:
    model: ModelSpec
    world_size: int
    link: str
    codec: str
    tensor: bool = False  # compare tensor-parallel meshes and data parallelism (`TENSOR`)

    @property
    def key(self) -> str:
        tp = "/tp" if self.tensor else ""
        return f"{self.model.label}/N{self.world_size}/{self.link or 'loopback'}/{self.codec}{tp}"


FULL = tuple(Setting(MODELS[m], n, link, codec)
             for m in MODELS for n in (2, 3, 4) for link, codec in WIRES)

#: five settings that cover both models, 2 to 4 ranks, both links and both formats
QUICK = tuple(s for s in FULL if s.key in {
    "mlp-wide/N2/loopback/fp32", "mlp-wide/N4/bw=1gbit/bf16", "mlp-wide/N3/bw=1gbit/fp32",
    "resnet20/N2/bw=1gbit/fp32", "resnet20/N4/loopback/fp32"})


#: `plan validate --tensor`: tiny models split by their own tp plans (mlp in column-row
#: pairs, gpt-tiny by heads and MLP pairs) on 2 and 4 ranks, each setting's candidates
#: every tp x dp mesh of its world and data parallelism (`candidates.tensor_candidates`)
TENSOR_MODELS = {
    "mlp": ModelSpec("mlp", {
        "model": {"name": "mlp", "hidden": 256, "depth": 3},
        "data": {"dataset": "synthetic", "synthetic_shape": [64], "synthetic_samples": 512,
                 "augment": False}}, 32),
    "gpt-tiny": ModelSpec("gpt-tiny", {
        "model": {"name": "gpt-tiny"},
        "data": {"dataset": "stdlib-text", "augment": False}}, 8),
}
TENSOR = (*(Setting(TENSOR_MODELS[m], n, "", "fp32", True)
            for m in TENSOR_MODELS for n in (2, 4)),
          Setting(TENSOR_MODELS["gpt-tiny"], 2, "bw=1gbit", "bf16", True))


def select(settings: tuple[Setting, ...], only: str | None) -> tuple[Setting, ...]:
    """The settings whose key contains every comma-separated part of `only`."""
    if not only:
        return settings
    parts = [p.strip() for p in only.split(",") if p.strip()]
    chosen = tuple(s for s in settings if all(p in s.key for p in parts))
    if not chosen:
        raise ConfigError(f"--only {only!r} matches no configuration; keys look like "
                          f"{settings[0].key} (the model, N and the rank count, the link and the codec, "
                          f"joined by slashes)")
    return chosen
