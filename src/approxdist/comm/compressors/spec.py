"""Compressor spec strings -> one compressor per tensor, with errors that name the fix.

| spec | compressor | collective |
|---|---|---|
| `powersgd:<r>` | PowerSGD rank r, error feedback, warm start | all-reduce |
| `topk:<ratio>` | top-k with error feedback | all-gather |
| `randomk:<ratio>` | random-k, shared seed, error feedback | all-reduce |
| `qsgd:<s>` | QSGD, s levels, unbiased | all-gather |
| `terngrad` | TernGrad, unbiased | all-gather |
| `sign+ef` | scaled sign with error feedback (EF-SignSGD) | all-gather |
| `signsgd` | signSGD with majority vote | all-gather |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from approxdist.comm.compressors.base import Collective, Compressor
from approxdist.comm.compressors.powersgd import PowerSGD, parse_rank
from approxdist.comm.compressors.qsgd import QSGD, parse_levels
from approxdist.comm.compressors.randomk import RandomK
from approxdist.comm.compressors.sign import MajorityVote, ScaledSign
from approxdist.comm.compressors.sparse import parse_ratio
from approxdist.comm.compressors.stream import named_seed
from approxdist.comm.compressors.terngrad import TernGrad
from approxdist.comm.compressors.topk import TopK
from approxdist.errors import SpecError
from approxdist.registry import Registry

#: seeds of per-worker random streams are spread by this factor (QSGD, TernGrad)
WORKER_STRIDE = 1_000_003


@dataclass(frozen=True)
class Where:
    """Which tensor (`name`) of which worker a compressor is built for, in a run seeded
    `seed` (the run's seed, `train.seed`): the one place its random streams are seeded."""

    shape: tuple[int, ...]
    name: str = ""
    seed: int = 0
    worker: int = 0
    device: torch.device | None = None

    @property
    def shared_seed(self) -> int:
        """What every worker draws alike for this tensor (random-k's indices, PowerSGD's
        first Q): the run's seed and the tensor's name, hashed (`stream.named_seed`), in
        [0, 2**32); two tensors of a run draw apart."""
        return named_seed(self.seed, self.name)

    @property
    def own_seed(self) -> int:
        """A stream of this worker's own for this tensor (unbiased quantisers must not share
        draws between workers, nor between tensors)."""
        return self.shared_seed * WORKER_STRIDE + self.worker


@dataclass(frozen=True)
class Family:
    """One compressor name: its form, what it is, and how to build it from the parameter."""

    form: str
    meaning: str
    collective: Collective
    build: Callable[[str | None, Where], Compressor]
    check: Callable[[str | None], object]


def _no_param(name: str) -> Callable[[str | None], None]:
    def check(text: str | None) -> None:
        if text is not None:
            raise SpecError(f"{name} takes no parameter, got {name}:{text}; write {name}")
    return check


COMPRESSORS: Registry[Family] = Registry("compressor", SpecError)
COMPRESSORS.add("powersgd", Family(
    "powersgd:<r>", "PowerSGD rank r (error feedback, warm start); all-reduce",
    "all-reduce",
    lambda t, w: PowerSGD(parse_rank(t), w.shape, seed=w.shared_seed, name=w.name, device=w.device),
    parse_rank))
COMPRESSORS.add("topk", Family(
    "topk:<ratio>", "the largest ratio * n values + int32 indices (error feedback); all-gather",
    "all-gather",
    lambda t, w: TopK(parse_ratio("topk", t), w.shape, device=w.device),
    lambda t: parse_ratio("topk", t)))
COMPRESSORS.add("randomk", Family(
    "randomk:<ratio>", "ratio * n values at shared random indices (error feedback); all-reduce",
    "all-reduce",
    lambda t, w: RandomK(parse_ratio("randomk", t), w.shape, seed=w.shared_seed, device=w.device),
    lambda t: parse_ratio("randomk", t)))
COMPRESSORS.add("qsgd", Family(
    "qsgd:<s>", "QSGD, s levels, stochastic rounding, unbiased; all-gather",
    "all-gather",
    lambda t, w: QSGD(parse_levels(t), w.shape, seed=w.own_seed, device=w.device),
    parse_levels))
COMPRESSORS.add("terngrad", Family(
    "terngrad", "TernGrad: 2 bits a value, max-norm scale, unbiased; all-gather",
    "all-gather",
    lambda t, w: TernGrad(w.shape, seed=w.own_seed, device=w.device), _no_param("terngrad")))
COMPRESSORS.add("sign+ef", Family(
    "sign+ef", "EF-SignSGD: 1 bit a value, mean-magnitude scale, error feedback; all-gather",
    "all-gather",
    lambda t, w: ScaledSign(w.shape, device=w.device), _no_param("sign+ef")))
COMPRESSORS.add("signsgd", Family(
    "signsgd", "signSGD with majority vote: 1 bit a value; all-gather",
    "all-gather",
    lambda t, w: MajorityVote(w.shape, device=w.device), _no_param("signsgd")))

#: one example spec of each compressor (benchmarks, docs)
DEFAULT_COMPRESSORS = ("powersgd:2", "topk:0.01", "randomk:0.01", "qsgd:16", "terngrad",
                       "sign+ef", "signsgd")


def _split(spec: str) -> tuple[Family, str | None]:
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"compressor spec must be a non-empty string, got {spec!r}; "
                        f"e.g. powersgd:2 or topk:0.01")
    name, sep, param = spec.strip().lower().partition(":")
    return COMPRESSORS.get(name), (param if sep else None)


def is_compressor(spec: str) -> bool:
    """Whether `spec` names a compressor (rather than a codec)."""
    return isinstance(spec, str) and spec.strip().lower().partition(":")[0] in COMPRESSORS


def check_compressor(spec: str) -> Collective:
    """The collective `spec` needs; `SpecError` naming the value and a fix if it is invalid."""
    family, param = _split(spec)
    family.check(param)
    return family.collective


def compressor_forms() -> list[str]:
    """Every compressor's form (`powersgd:<r>`, `topk:<ratio>`, ...), for one-line errors."""
    return [COMPRESSORS.get(n).form for n in COMPRESSORS]


def summed_names() -> list[str]:
    """The forms of the all-reduce compatible compressors."""
    return [COMPRESSORS.get(n).form for n in COMPRESSORS
            if COMPRESSORS.get(n).collective == "all-reduce"]


def get_compressor(spec: str, where: Where) -> Compressor:
    """A new compressor for one tensor of one worker (`where`), with fresh state."""
    family, param = _split(spec)
    return family.build(param, where)


def compressor_specs_help() -> str:
    """One line per compressor form, for `--help` texts and docs."""
    return "\n".join(f"  {COMPRESSORS.get(n).form:<18} {COMPRESSORS.get(n).meaning}"
                     for n in COMPRESSORS)
