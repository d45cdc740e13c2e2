"""The settings of `approxdist plan validate`: calibration settings and a held-out set (pure, fixed).

A *setting* is a model on a world of local ranks joined by a link, with one wire format
for activations, their gradients and the replicas' all-reduce; in each setting several
plans are measured (`candidates`), so a configuration is a setting x a plan. The models
differ in what limits them: `mlp-wide` (6 x 1024-wide layers on 784 inputs) moves 24 MB
of gradients and 128 KiB per activation; `resnet20` holds 1 MB of parameters and moves
up to 1 MiB per activation, so data parallelism and pipelines trade places between them
and between links. The full set is every model x 2, 3, 4 ranks x (no emulated link,
fp32), (1 Gbit/s, fp32), (1 Gbit/s, bf16): 18 settings; `--quick` is the documented
subset `QUICK`. `TENSOR` (`plan validate --tensor`) are the tensor-parallel settings.

No configuration's step time fits the cost model (the calibration is measured on
all-reduces and the engine-overhead models alone), but `CALIBRATION` and `TENSOR` were
used while designing the model (about fifteen iterations of the cost model were judged
on them, and `ROUNDS` was chosen by the tau they gave): they are *calibration settings*.
`HELD_OUT` is a fresh set of models and sizes none of those uses (resnet56, the
AlexNet-like CNN at width 256, gpt-tiny at 4 sequences per micro-batch, MLPs of depth 4
and 8), fixed and committed before any of its results was looked at; its figures are the
headline (`plan validate --held-out`). `check_held_out` refuses a held-out setting whose
model is a calibration model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approxdist.errors import ConfigError
from approxdist.text import name_list


@dataclass(frozen=True)
class ModelSpec:
    """A model with its data, as config sections, profiled at `micro_batch_size`."""

    label: str
    sections: dict[str, dict[str, Any]] = field(hash=False)
    micro_batch_size: int

    @property
    def name(self) -> str:
        return str(self.sections["model"]["name"])


def synthetic(*shape: int) -> dict[str, Any]:
    """The data section of a model measured on 512 random samples of `shape`."""
    return {"dataset": "synthetic", "synthetic_shape": list(shape), "synthetic_samples": 512,
            "augment": False}


def text() -> dict[str, Any]:
    """The data section of a text model (the standard library's text)."""
    return {"dataset": "stdlib-text", "augment": False}


def by_label(*specs: ModelSpec) -> dict[str, ModelSpec]:
    return {s.label: s for s in specs}


MODELS = by_label(
    ModelSpec("mlp-wide", {"model": {"name": "mlp", "hidden": 1024, "depth": 6},
                           "data": synthetic(784)}, 32),
    ModelSpec("resnet20", {"model": {"name": "resnet20"}, "data": synthetic(3, 32, 32)}, 16),
)

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
#: the settings used while designing the cost model (every one of `FULL`)
CALIBRATION = FULL

#: five settings that cover both models, 2 to 4 ranks, both links and both formats
QUICK = tuple(s for s in FULL if s.key in {
    "mlp-wide/N2/loopback/fp32", "mlp-wide/N4/bw=1gbit/bf16", "mlp-wide/N3/bw=1gbit/fp32",
    "resnet20/N2/bw=1gbit/fp32", "resnet20/N4/loopback/fp32"})


#: `plan validate --tensor`: tiny models split by their own tp plans (mlp in column-row
#: pairs, gpt-tiny by heads and MLP pairs) on 2 and 4 ranks, each setting's candidates
#: every tp x dp mesh of its world and data parallelism (`candidates.tensor_candidates`)
TENSOR_MODELS = by_label(
    ModelSpec("mlp", {"model": {"name": "mlp", "hidden": 256, "depth": 3},
                      "data": synthetic(64)}, 32),
    ModelSpec("gpt-tiny", {"model": {"name": "gpt-tiny"}, "data": text()}, 8),
)
TENSOR = (*(Setting(TENSOR_MODELS[m], n, "", "fp32", True)
            for m in TENSOR_MODELS for n in (2, 4)),
          Setting(TENSOR_MODELS["gpt-tiny"], 2, "bw=1gbit", "bf16", True))


#: models and sizes no calibration setting (nor the engine-overhead runs) uses
HELD_OUT_MODELS = by_label(
    ModelSpec("resnet56", {"model": {"name": "resnet56"}, "data": synthetic(3, 32, 32)}, 8),
    ModelSpec("alexnet-w256", {"model": {"name": "alexnet", "hidden": 256, "dropout": 0.0},
                               "data": synthetic(3, 32, 32)}, 16),
    ModelSpec("gpt-tiny-b4", {"model": {"name": "gpt-tiny"}, "data": text()}, 4),
    ModelSpec("mlp-d4", {"model": {"name": "mlp", "hidden": 768, "depth": 4},
                         "data": synthetic(784)}, 32),
    ModelSpec("mlp-d8", {"model": {"name": "mlp", "hidden": 384, "depth": 8},
                         "data": synthetic(784)}, 32),
)
#: two settings per held-out model, spread over 2-4 ranks, both links and both formats
HELD_OUT = tuple(Setting(HELD_OUT_MODELS[m], n, link, codec) for m, n, link, codec in (
    ("resnet56", 2, "", "fp32"), ("resnet56", 4, "bw=1gbit", "fp32"),
    ("alexnet-w256", 3, "", "fp32"), ("alexnet-w256", 2, "bw=1gbit", "bf16"),
    ("gpt-tiny-b4", 2, "", "fp32"), ("gpt-tiny-b4", 4, "bw=1gbit", "bf16"),
    ("mlp-d4", 3, "bw=1gbit", "fp32"), ("mlp-d4", 4, "", "fp32"),
    ("mlp-d8", 2, "bw=1gbit", "bf16"), ("mlp-d8", 3, "", "fp32")))


def check_held_out(held_out: tuple[Setting, ...],
                   calibration: tuple[ModelSpec, ...]) -> tuple[Setting, ...]:
    """`held_out`, refused where a setting's model (its sections and micro-batch) is one of
    the `calibration` models: a figure on it would not be held out."""
    for s in held_out:
        same = next((m for m in calibration if m.sections == s.model.sections
                     and m.micro_batch_size == s.model.micro_batch_size), None)
        if same is not None:
            raise ConfigError(f"held-out setting {s.key} uses model {same.label!r}, a "
                              f"calibration model; hold out another model or size (e.g. "
                              f"{', '.join(HELD_OUT_MODELS)})")
    return held_out


def select(settings: tuple[Setting, ...], only: str | None) -> tuple[Setting, ...]:
    """The settings whose key contains every comma-separated part of `only`."""
    if not only:
        return settings
    parts = name_list(only)
    chosen = tuple(s for s in settings if all(p in s.key for p in parts))
    if not chosen:
        raise ConfigError(f"--only {only!r} matches no configuration; keys look like "
                          f"{settings[0].key} (the model, N and the rank count, the link and the codec, "
                          f"joined by slashes)")
    return chosen
