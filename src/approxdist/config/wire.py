"""The one wire type and the `[wire]` section: how each traffic class crosses the network.

Every traffic class of every mode is a `Wire`: its codec (a codec spec,
docs/codecs.md; on gradient wires also per-parameter `rules` and the `times` file the
`fastest` codec picks from, seed 004), the bit errors its link may add (`channel`,
"Channel spec"), and whether what a lossy codec dropped is kept and sent with the next
step (`error_feedback`). The `[wire]` section holds one per traffic class:

    [wire.grad]                  # data-parallel gradients (a hybrid's replicas too)
    codec = "bf16"
    error_feedback = true
    [wire.fwd]                   # pipeline activations
    codec = "bits:s0e2+2m0"
    channel = "ber:1e-3@5"
    [wire.tp_fwd]                # tensor-parallel forward all-reduces
    codec = "fp8-e5m2"

`--set wire.push.codec=bf16` sets one key; the flags (`--codec`, `--fwd-codec`, ...) set
the wire of the run's mode. Syntax is checked here; the names against the registries of
the parts where they are built (`approxdist.train.parts`). Error feedback is not offered
on pipeline activations or their gradients (docs/architecture.md, "Pieces that exist
once"); the tensor-parallel wires offer it as a study variable.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from approxdist.config.adaprec import candidates_of
from approxdist.errors import ConfigError

#: the traffic classes, with what travels on each
TRAFFIC: dict[str, str] = {
    "grad": "data-parallel gradients, a hybrid's replica all-reduce too",
    "fwd": "pipeline activations, stage to stage",
    "bwd": "pipeline activation gradients, stage to stage",
    "push": "parameter-server gradients, worker to server",
    "pull": "parameter-server parameters, server to worker",
    "tp_fwd": "tensor-parallel forward collectives (a row-parallel layer's partial sums)",
    "tp_bwd": "tensor-parallel backward collectives (a column-parallel layer's input gradients)",
}
#: the wires that carry gradients: per-parameter rules and AdaPrec live only there
GRADIENT_WIRES = ("grad", "push")


@dataclass(frozen=True)
class Wire:
    """One traffic class: codec, bit errors, error feedback (and a gradient wire's rules)."""

    codec: str = "fp32"
    channel: str = ""                 # "" or "none": no bit errors
    error_feedback: bool = False
    rules: tuple[str, ...] = ()       # PATTERN=CODEC per parameter, first match wins
    times: str = ""                   # `bench allreduce --json` rows for the `fastest` codec

    def __post_init__(self) -> None:
        if not self.codec:
            raise ConfigError("a wire's codec is empty; e.g. fp32, bf16 or bits:s0e2+2m0")
        if self.channel == "none":  # the channel spec's word for no bit errors
            object.__setattr__(self, "channel", "")

    @property
    def has_channel(self) -> bool:
        return self.channel not in ("", "none")

    @property
    def adaptive(self) -> bool:
        """AdaPrec chooses this wire's codec during training (`adaprec:<candidates>`)."""
        return candidates_of(self.codec) is not None


#: the exact wire: fp32, no bit errors (every wire's default)
EXACT = Wire()


@dataclass(frozen=True)
class WireConfig:
    """The `[wire]` section: one `Wire` per traffic class (`TRAFFIC`), each `EXACT` unless set."""

    grad: Wire = EXACT
    fwd: Wire = EXACT
    bwd: Wire = EXACT
    push: Wire = EXACT
    pull: Wire = EXACT
    tp_fwd: Wire = EXACT
    tp_bwd: Wire = EXACT

    def __post_init__(self) -> None:
        for name in ("fwd", "bwd", "pull", "tp_fwd", "tp_bwd"):
            w = getattr(self, name)
            # a tensor-parallel wire may keep residuals (a study variable: Rudakov et al.
            # 2024 report it does not help model-parallel training)
            keys = ("rules", "times") if name.startswith("tp_") else \
                ("error_feedback", "rules", "times")
            extra = [k for k in keys if getattr(w, k)]
            if extra or w.adaptive:
                what = extra[0] if extra else f"codec = {w.codec!r}"
                raise ConfigError(
                    f"wire.{name}.{what.split(' ')[0]}: error feedback, per-parameter rules "
                    f"and AdaPrec are for gradient wires ({', '.join(GRADIENT_WIRES)}); a "
                    f"residual of {TRAFFIC[name].split(',')[0]} would belong to other samples "
                    f"or values next step; drop it")

    def wire(self, name: str) -> Wire:
        if name not in TRAFFIC:
            raise ConfigError(f"wire {name!r} is not one of: {', '.join(TRAFFIC)}")
        return getattr(self, name)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(WireConfig))
