"""Compressors as AdaPrec candidates: parsing and bits, each compressor's contribution (what
`comm.update_error` measures), and its state parked across codec switches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from approxdist.adaptive.candidates import check_candidate_shapes, check_candidates, codec_bits
from approxdist.comm.compressors import DEFAULT_COMPRESSORS, Compressor, Where, get_compressor
from approxdist.comm.update_error import UpdateError
from approxdist.data_parallel.buckets import BucketPlan
from approxdist.data_parallel.compressed import reduce_compressed
from approxdist.data_parallel.reducer import BucketState
from approxdist.data_parallel.wire_state import Parked, collect, spread
from approxdist.errors import ConfigError
from tests.helpers.lockstep import lockstep

SHAPE = (12, 10)


def test_compressors_are_candidates_and_carry_their_bits() -> None:
    check_candidates(("fp32", "fp8-e5m2", "topk:0.01", "qsgd:7"), (), None)
    check_candidates(("fp32", "topk:0.01", "randomk:0.01", "terngrad"), (), None,
                     per_layer=True, algorithm="ring")
    assert codec_bits("topk:0.01") == pytest.approx(64 * 0.01, rel=0.01)  # value + index
    assert codec_bits("randomk:0.01") == pytest.approx(32 * 0.01, rel=0.01)  # shared indices
    assert codec_bits("qsgd:7") == pytest.approx(4, rel=0.001)  # 15 codes: 4 bits + a norm
    assert codec_bits("terngrad") == pytest.approx(2, rel=0.001)
    assert codec_bits("sign+ef") == pytest.approx(1, rel=0.001)
    assert codec_bits("signsgd") == 1.0
    assert codec_bits("fp8-e5m2") == 8.0
    assert codec_bits("powersgd:2") is None  # each matrix's own: r (n + m) / (n m)


@pytest.mark.parametrize("call, says", [
    (lambda: check_candidates(("fp32", "topk:0.01"), (), None, algorithm="native"),
     "AdaPrec candidate 'topk:0.01': topk:0.01 needs all-gather"),
    (lambda: check_candidates(("fp32", "qsgd:7"), (), None, compressors=False),
     "'qsgd:7', a compressor: AdaPrec switches compressors on the data-parallel"),
    (lambda: check_candidates(("fp32", "powersgd:2"), (), None, per_layer=True),
     "adaprec.choose = 'layer' cannot weigh"),
    (lambda: check_candidates(("fp32", "topk:2"), (), None), "AdaPrec candidate 'topk:2'"),
    (lambda: check_candidate_shapes(nn.Linear(4, 3), ("fp32", "powersgd:2"), ()),
     "AdaPrec candidate 'powersgd:2': powersgd:2 cannot compress 'bias'"),
])
def test_a_candidate_the_wire_cannot_carry_is_one_line(call: Callable[[], object],
                                                       says: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(SHAPE, generator=gen) for _ in range(2)]


@pytest.mark.parametrize("spec", DEFAULT_COMPRESSORS)
def test_each_workers_share_makes_the_result_and_measuring_changes_nothing(spec: str) -> None:
    def workers() -> list[Compressor]:
        return [get_compressor(spec, Where(SHAPE, "w", seed=3, worker=i)) for i in range(2)]

    watched, plain = workers(), workers()
    for step in range(3):
        grads = _grads(step)
        old = [c.state.get("residual", torch.zeros(0)).clone() for c in watched]
        shares = [torch.full((120,), float("nan")) for _ in range(2)]
        got = lockstep(watched, [g.clone() for g in grads], shares=shares)
        want = lockstep(plain, [g.clone() for g in grads])
        for a, b in zip(got, want):  # the measurement draws nothing, changes nothing
            assert torch.equal(a, b), spec
        for a, b in zip(watched, plain):
            assert all(torch.equal(a.state[k], b.state[k]) for k in a.state), spec
        if spec == "signsgd":  # the vote of the workers' signs
            assert torch.equal(got[0].view(-1), (shares[0] + shares[1]).sign())
        else:  # their mean is the result: the share is what this worker contributes
            torch.testing.assert_close(got[0].view(-1), (shares[0] + shares[1]) / 2)
        if spec in ("topk:0.01", "randomk:0.01", "sign+ef"):  # g + r_old - r_new
            for g, r, c, s in zip(grads, old, watched, shares):
                torch.testing.assert_close(s, g.view(-1) + r - c.state["residual"])


def _bucket(codec: str, ef: bool = True) -> BucketState:
    param = nn.Parameter(torch.zeros(SHAPE))
    plan = BucketPlan(0, ("w",), (0,), (0,), (120,), codec)
    return BucketState(plan, [param], torch.device("cpu"), ef)


def test_a_compressors_state_is_parked_across_a_switch_and_a_restore_leaves_no_trace() -> None:
    topk = _bucket("topk:0.1")
    assert topk.compressor is not None
    assert collect([topk], Parked())["compressors"] == {}  # unused: its first state, no state
    lockstep([topk.compressor], [_grads(0)[0]])  # a residual now
    topk.compressor_used = True  # as the reducer marks it
    kept = topk.compressor.state_dict()["residual"]
    assert kept.abs().sum() > 0
    codec = _bucket("fp8-e5m2")  # switch: the residual parked, the codec's own comes back
    parked = spread([codec], {**collect([topk], Parked()),
                              "residuals": {"w": torch.ones(120)}})
    assert torch.equal(codec.residuals.flat, torch.ones(120))  # type: ignore[union-attr]
    assert torch.equal(parked.compressors["topk:0.1"]["w"]["residual"], kept)
    state = collect([codec], parked)
    back = _bucket("topk:0.1")  # and back: the same residual, the codec's now parked
    again = spread([back], state)
    assert torch.equal(back.compressor.state["residual"], kept)  # type: ignore[union-attr]
    assert torch.equal(again.residuals["w"], torch.ones(120)) and not again.compressors
    # a state from before top-k ever ran (a snapshot) puts the compressor back to new
    lockstep([back.compressor], [_grads(1)[0]])  # type: ignore[list-item]
    back.compressor_used = True
    gone = spread([back], {"residuals": {}, "compressors": {}})
    assert not back.compressor.state["residual"].any() and not gone.residuals  # type: ignore[union-attr]
    # a checkpoint of the older form (compressors by parameter) loads into the current one
    spread([back], {"residuals": {}, "compressors": {"w": {"residual": kept}}})
    assert torch.equal(back.compressor.state["residual"], kept)  # type: ignore[union-attr]


class _Alone:
    """The collectives of a group of one: a sum is the message, a gather its bytes."""

    world_size = 1

    def __call__(self, message: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return message


@pytest.mark.parametrize("spec", DEFAULT_COMPRESSORS)
def test_the_reducer_probe_sees_each_compressors_share(spec: str) -> None:
    probe = UpdateError([("w", 0, 120)], 120, torch.device("cpu"))
    comp, twin = (get_compressor(spec, Where(SHAPE, "w", seed=3)) for _ in range(2))
    want_e, want_g = torch.zeros(120, dtype=torch.float64), torch.zeros(120, dtype=torch.float64)
    for step in range(3):
        g = _grads(step)[0]
        share = torch.empty(120)
        lockstep([twin], [g.clone()], shares=[share])
        reduce_compressed(comp, g.clone(), _Alone(), _Alone(), "mean", probe)  # type: ignore[arg-type]
        want_e += share.double() - g.view(-1).double()
        want_g += g.view(-1).double()
    e, s, n = probe.sums()["w"]
    assert n == 120 and s == pytest.approx(float(want_g.square().sum()))
    assert e == pytest.approx(float(want_e.square().sum())) and e > 0, spec
