"""`GatheredTogether`: a bucket's all-gather exchanges as one equals each member's own."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.compressors import Compressor, Gathered, Where, get_compressor
from approxdist.comm.compressors.gathered_together import GatheredTogether
from approxdist.comm.compressors.together import Member
from approxdist.errors import ConfigError
from tests.helpers.lockstep import check_bundle_steps, lockstep

WORKERS = 3
STEPS = 3
#: two matrices and a conv weight, exact vectors between them (odd sizes: payloads that
#: do not end on a 4-byte boundary)
SHAPES = ((12, 20), (7,), (6, 3, 3, 3), (5,), (9, 11))
GATHERED = ("topk:0.1", "qsgd:7", "qsgd:300", "terngrad", "sign+ef", "signsgd")


def _members(spec: str, worker: int) -> list[Member]:
    members, at = [], 0
    for i, shape in enumerate(SHAPES):
        comp = get_compressor(spec, Where(shape, f"p{i}", worker=worker)) if len(shape) > 1 \
            else None
        members.append(Member(f"p{i}", at, torch.Size(shape), comp))
        at += torch.Size(shape).numel()
    return members


def _alone(spec: str, worker: int) -> list[Compressor | None]:
    return [get_compressor(spec, Where(s, f"p{i}", worker=worker)) if len(s) > 1 else None
            for i, s in enumerate(SHAPES)]


@pytest.mark.parametrize("spec", GATHERED)
def test_gathered_together_equals_each_member_alone_bit_for_bit(spec: str) -> None:
    """Each member's part of the one payload is its own payload, its result its own
    exchange's; the exact members are the worker-order mean; residuals and streams follow
    each member over the steps; what AdaPrec measures is each member's contribution."""
    check_bundle_steps([GatheredTogether(_members(spec, w)) for w in range(WORKERS)],
                       [_alone(spec, w) for w in range(WORKERS)], SHAPES, STEPS, seed=7)


def test_the_payload_is_the_exact_bytes_then_each_members_payload() -> None:
    """One payload a step: the exact vectors' own bytes, then each member's payload in
    member order, byte for byte what that member alone sends; the result goes into `out`."""
    spec = "qsgd:7"
    comp, members = GatheredTogether(_members(spec, 0)), _alone(spec, 0)
    grad = torch.randn(comp.numel, generator=torch.Generator().manual_seed(3))
    expected = lockstep([GatheredTogether(_members(spec, 0))], [grad.clone()])[0]
    parts = list(grad.split([torch.Size(s).numel() for s in SHAPES]))
    exchange = comp.exchange(grad, 1, out=grad)
    payload = next(exchange)
    exact = torch.cat([parts[1], parts[3]]).view(torch.uint8)
    own = [c.outgoing(p.view(s)).data for c, p, s in zip(members, parts, SHAPES)
           if isinstance(c, Gathered)]
    assert torch.equal(payload.data, torch.cat([exact, *own]))
    assert payload.data.numel() == comp.wire_bytes()
    with pytest.raises(StopIteration) as stop:
        exchange.send([payload])
    assert stop.value.value.data_ptr() == grad.data_ptr() and torch.equal(grad, expected)


def test_members_of_two_specs_or_a_summed_one_are_refused() -> None:
    mixed = [Member("a", 0, torch.Size((4, 4)), get_compressor("topk:0.5", Where((4, 4), "a"))),
             Member("b", 16, torch.Size((4, 4)), get_compressor("signsgd", Where((4, 4), "b")))]
    with pytest.raises(ConfigError, match="one compressor spec"):
        GatheredTogether(mixed)
    summed = [Member("a", 0, torch.Size((4, 4)), get_compressor("powersgd:1", Where((4, 4))))]
    with pytest.raises(ConfigError, match="by all-gather, but powersgd:1 does not"):
        GatheredTogether(summed)
