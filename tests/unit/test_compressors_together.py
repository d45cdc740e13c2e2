"""`Together`: a bucket's all-reduce compatible exchanges as one equals each member's own."""

from __future__ import annotations

import torch

from approxdist.comm.compressors import Where, get_compressor
from approxdist.comm.compressors.together import Member, Together
from tests.helpers.lockstep import lockstep

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
        gen = torch.Generator().manual_seed(5)
        together = [_together(spec, w) for w in range(WORKERS)]
        alone = [[get_compressor(spec, Where(s, f"p{i}", worker=w)) if len(s) > 1 else None
                  for i, s in enumerate(SHAPES)] for w in range(WORKERS)]
        for _ in range(STEPS):
            grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(WORKERS)]
            sent = [0] * WORKERS
            shares = [torch.full((together[0].numel,), float("nan")) for _ in range(WORKERS)]
            got = lockstep(together, [torch.cat([g.reshape(-1) for g in gs]) for gs in grads],
                           sent, shares)
            for i, shape in enumerate(SHAPES):
                pair = [grads[w][i] for w in range(WORKERS)]
                comps = [alone[w][i] for w in range(WORKERS)]
                n = torch.Size(shape).numel()
                own = [torch.empty(n) for _ in range(WORKERS)]
                want = lockstep(comps, pair, shares=own) if comps[0] is not None \
                    else [sum(pair[1:], pair[0].clone()).div_(WORKERS)] * WORKERS
                at = sum(torch.Size(s).numel() for s in SHAPES[:i])
                for w in range(WORKERS):
                    part = got[w][at:at + n].view(shape)
                    assert torch.equal(part, want[w]), (spec, i, w)
                    # what AdaPrec measures: each member's contribution; exact: the values
                    share = own[w] if comps[0] is not None else pair[w].reshape(-1)
                    assert torch.equal(shares[w][at:at + n], share), (spec, i, w)
            assert sent == [together[0].wire_bytes()] * WORKERS


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
