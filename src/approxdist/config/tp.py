"""The `[tp]` config section: tensor parallelism (`--parallel tensor`; docs/tensor_parallel.md).

`size` ranks split every layer the plan names (the mesh's `tp` axis; the world is `size`
times the data-parallel replicas, or times the pipeline's ranks: each stage split over
`size` ranks); 1 splits nothing (`--parallel tensor` makes it 2 unless given). `plan`
names how ("" = the model's own plan, a file of `path = style` lines, or the same
inline); `algorithm` is the all-reduce of the tp collectives (any of
`comm.collectives`); `sequence_parallel` splits the activations between the split layers
along the sequence (the model's own sequence-parallel plan; gpt models, `--parallel
tensor`). How the collectives travel is the `tp_fwd` and `tp_bwd` wires'
(`[wire.tp_fwd]`, `[wire.tp_bwd]`, `config/wire.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class TPConfig:
    """Tensor-parallel options; see docs/tensor_parallel.md."""

    size: int = 1
    plan: str = ""
    algorithm: str = "auto"
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or self.size < 1:
            raise ConfigError(f"tp.size = {self.size} must be >= 1 ranks per layer; e.g. --tp 2")
