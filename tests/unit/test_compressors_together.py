"""`Together`: a bucket's all-reduce compatible exchanges as one equals each member's own."""

from __future__ import annotations

import torch

from approxdist.comm.compressors import Where, get_compressor
from approxdist.comm.compressors.together import Member, Together
from tests.helpers.lockstep import check_bundle_steps, lockstep

WORKERS = 3
STEPS = 3
#: PowerSGD on a matrix and a conv weight, an exact vector between them
SHAPES = ((12, 20), (7,), (6, 3, 3, 3))


def _together(spec: str, worker: int) -> Together:
    members, at = [], 0
    for i, shape in enumerate(SHAPES):
        comp = get_compressor(spec, Where(shape, f"p{i}", worker=worker)) if len(shape) > 1 \
            else None
        members.append(Member(f"p{i}", at, torch.Size(shape), comp))  # type: ignore[arg-type]
        at += torch.Size(shape).numel()
    return Together(members)


def test_together_equals_each_member_alone_bit_for_bit() -> None:
    """Worker-order sums of concatenated messages are the members' own sums, value by value;
    the exact member is the plain mean; residuals and warm-start Q follow each member."""
    for spec in ("powersgd:2", "randomk:0.25"):
        alone = [[get_compressor(spec, Where(s, f"p{i}", worker=w)) if len(s) > 1 else None
                  for i, s in enumerate(SHAPES)] for w in range(WORKERS)]
        check_bundle_steps([_together(spec, w) for w in range(WORKERS)], alone, SHAPES, STEPS,
                           seed=5)


def test_together_writes_into_out_and_sends_one_message_a_round() -> None:
    comp = _together("powersgd:2", 0)
    grad = torch.randn(comp.numel, generator=torch.Generator().manual_seed(1))
    expected = lockstep([_together("powersgd:2", 0)], [grad.clone()])[0]
    exchange = comp.exchange(grad, 1, out=grad)
    rounds = [next(exchange)]
    try:
        while True:
            rounds.append(exchange.send(rounds[-1].clone()))
    except StopIteration as stop:
        result = stop.value
    # P of both matrices with the exact vector, then their Q: (12 + 7 + 6) x 2 + 7 values
    assert [r.numel() for r in rounds] == [2 * 12 + 7 + 2 * 6, 2 * 20 + 2 * 27]
    assert result.data_ptr() == grad.data_ptr() and torch.equal(grad, expected)
