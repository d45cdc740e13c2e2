"""Each tensor's random streams, by the one rule of `Where` (docs/compressors.md, "Random
streams"): from the run's seed and the tensor's name, shared by the workers where they must
agree (random-k's indices, PowerSGD's first Q) and the worker's own for the quantisers."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.compressors import Where, get_compressor
from approxdist.comm.compressors.powersgd import PowerSGD
from approxdist.comm.compressors.randomk import RandomK
from approxdist.comm.compressors.spec import WORKER_STRIDE

SHAPE = (16, 24)
SEED = 5
SHARED = ("randomk:0.1", "powersgd:2")
OWN = ("qsgd:16", "terngrad")


def first_draws(spec: str, where: Where) -> torch.Tensor:
    """What `spec` built for `where` draws first: random-k's indices, PowerSGD's first Q, or
    the quantisers' message (scale and codes) of one fixed gradient."""
    comp = get_compressor(spec, where)
    if isinstance(comp, RandomK):
        return comp.indices()
    if isinstance(comp, PowerSGD):
        return comp.state["q"].clone()
    return comp.message(torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("spec", SHARED + OWN)
def test_two_same_shape_tensors_of_one_worker_draw_apart(spec: str) -> None:
    a, b = (first_draws(spec, Where(SHAPE, name, SEED, worker=1))
            for name in ("0.weight", "1.weight"))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("spec", SHARED + OWN)
def test_one_tensor_on_two_workers_draws_alike_only_where_they_must_agree(spec: str) -> None:
    a, b = (first_draws(spec, Where(SHAPE, "0.weight", SEED, worker=w)) for w in range(2))
    assert torch.equal(a, b) == (spec in SHARED)


@pytest.mark.parametrize("spec", SHARED + OWN)
def test_another_run_seed_draws_otherwise(spec: str) -> None:
    a, b = (first_draws(spec, Where(SHAPE, "0.weight", seed)) for seed in (SEED, SEED + 1))
    assert not torch.equal(a, b)


def test_a_tensors_seeds_are_a_stable_hash_of_seed_and_name() -> None:
    """The same numbers in every process (Python's `hash()` of a string is salted per
    process; these are crc32 and mix32, fixed here)."""
    where = Where(SHAPE, "0.weight", SEED, worker=3)
    assert where.shared_seed == 3933887940
    assert where.own_seed == 3933887940 * WORKER_STRIDE + 3
