"""`PackedBucket`: a bucket's bit-packed members in one kernel call a phase equal one exchange per member."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors import Compressor, Where, get_compressor
from approxdist.comm.compressors.base import GatherExchange
from approxdist.comm.compressors.gathered_together import GatheredTogether
from approxdist.comm.compressors.packed import Packed
from approxdist.comm.compressors.together import Member
from approxdist.kernels import kernel_status
from approxdist.kernels.bucket import BucketKernel
from tests.helpers.lockstep import lockstep

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"kernels unavailable: {kernel_status().detail}")

WORKERS = 3
#: compressed: a matrix, a 1-element tensor, an odd-length conv weight, a vector; one exact
SHAPES = ((12, 20), (1,), (5,), (3, 5, 7), (33,))
EXACT = 2
SPECS = ("sign+ef", "signsgd", "qsgd:7", "terngrad", "qsgd:300")


def _compressors(spec: str, worker: int) -> list[Compressor | None]:
    """Worker `worker`'s compressor of each tensor (None: exact), each with its own seed."""
    return [None if i == EXACT else
            get_compressor(spec, Where(s, f"p{i}", seed=i, worker=worker))
            for i, s in enumerate(SHAPES)]


def _bundle(comps: list[Compressor | None]) -> GatheredTogether:
    members, at = [], 0
    for i, (shape, comp) in enumerate(zip(SHAPES, comps, strict=True)):
        members.append(Member(f"p{i}", at, torch.Size(shape), comp))
        at += torch.Size(shape).numel()
    return GatheredTogether(members)


def _grads(step: int, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """Random gradients; step 1 gives one member zeros (no scale) and step 2 an infinity."""
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(WORKERS)]
    if step == 1:
        grads[0][1].zero_()
        grads[1][3].zero_()
    if step == 2:
        grads[2][0][3, 4] = float("inf")
    return grads


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns (NaNs compare by their bits)."""
    return t.contiguous().view(torch.int32)


def _bits_of(t: torch.Tensor) -> torch.Tensor:
    return _bits(t) if t.dtype == torch.float32 else t


def _finish(exchange: GatherExchange, gathered: list[Payload]) -> torch.Tensor:
    with pytest.raises(StopIteration) as stop:
        exchange.send(gathered)
    result: torch.Tensor = stop.value.value
    return result


@needs_kernels
@pytest.mark.parametrize("spec", SPECS)
def test_one_call_a_bucket_equals_one_exchange_per_member(spec: str) -> None:
    """Payload bytes, results and saved states (residuals, streams) of the bucket path are bit
    for bit those of each member's own exchange, over steps with and without a residual and
    with members that have no finite scale."""
    bundles = [_bundle(_compressors(spec, w)) for w in range(WORKERS)]
    alone = [_compressors(spec, w) for w in range(WORKERS)]
    assert all(b.packed is not None for b in bundles)
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        grads = _grads(step, gen)
        runs = [b.exchange(torch.cat([g.reshape(-1) for g in gs]), WORKERS)
                for b, gs in zip(bundles, grads, strict=True)]
        payloads = [next(r) for r in runs]
        own = [[None if c is None else c.exchange(g, WORKERS) for c, g in zip(cs, gs, strict=True)]
               for cs, gs in zip(alone, grads, strict=True)]
        parts = [[None if e is None else next(e) for e in es] for es in own]
        for w in range(WORKERS):
            expected = [grads[w][EXACT].view(torch.uint8)] + [p.data for p in parts[w] if p]
            assert torch.equal(payloads[w].data, torch.cat(expected)), (spec, step, w)
        got = [_finish(r, payloads) for r in runs]
        at = 0
        for i, shape in enumerate(SHAPES):
            n = torch.Size(shape).numel()
            for w in range(WORKERS):
                run, comp, theirs = own[w][i], alone[w][i], bundles[w].members[i].compressor
                if run is None or comp is None or theirs is None:
                    continue
                want = _finish(run, [p[i] for p in parts if p[i] is not None])
                assert torch.equal(_bits(got[w][at:at + n].view(shape)), _bits(want)), \
                    (spec, step, i, w)
                for key, value in comp.state_dict().items():
                    assert torch.equal(_bits_of(theirs.state_dict()[key]), _bits_of(value)), key
            at += n


@needs_kernels
def test_the_per_member_path_is_taken_where_the_kernels_cannot_run() -> None:
    """A member with its kernels off, or values not fp32, leave the bucket path (None) to
    each member's own; top-k, not bit-packed, has none."""
    bundle = _bundle(_compressors("sign+ef", 0))
    packed = bundle.packed
    assert packed is not None
    flat = torch.randn(bundle.numel)
    assert packed.outgoing(flat.double(), None) is None
    assert packed.outgoing(flat[:-1], None) is None  # too short: each member's own error
    member = bundle.gathered[0].compressor
    assert isinstance(member, Packed)
    member.codes.use_kernels = False
    assert packed.outgoing(flat, None) is None
    assert not packed.combine([torch.zeros(bundle.wire_bytes(), dtype=torch.uint8)],
                              torch.empty(bundle.numel))
    member.codes.use_kernels = True
    spread = torch.zeros(2 * bundle.wire_bytes(), dtype=torch.uint8)[::2]  # not contiguous
    assert not packed.combine([spread], torch.empty(bundle.numel))
    assert packed.combine([spread.contiguous()], torch.empty(bundle.numel))
    assert _bundle(_compressors("topk:0.5", 0)).packed is None


def test_the_fallback_gives_the_same_results_as_the_bucket_path() -> None:
    """With every member's kernels off (the torch reference) the bundle's results equal those
    of the default path, bucket kernels or not."""
    gen = torch.Generator().manual_seed(11)
    for spec in ("sign+ef", "qsgd:7"):
        fast = [_bundle(_compressors(spec, w)) for w in range(WORKERS)]
        slow = [_bundle(_compressors(spec, w)) for w in range(WORKERS)]
        for b in slow:
            for m in b.gathered:
                assert isinstance(m.compressor, Packed)
                m.compressor.codes.use_kernels = False
        for _ in range(2):
            flats = [torch.randn(fast[0].numel, generator=gen) for _ in range(WORKERS)]
            for a, b in zip(lockstep(fast, flats), lockstep(slow, [f.clone() for f in flats]),
                            strict=True):
                assert torch.equal(a, b), spec


def test_a_copied_bucket_encodes_the_members_it_saves() -> None:
    """Pickled (a run's config to its ranks) or deep-copied, the bucket path still holds the
    very compressors whose states the engine saves, and gives the original's results."""
    bundle = _bundle(_compressors("qsgd:7", 0))
    flat = torch.randn(bundle.numel, generator=torch.Generator().manual_seed(2))
    for copied in (pickle.loads(pickle.dumps(bundle)), copy.deepcopy(bundle)):
        assert copied.packed is not None
        assert [id(c) for c in copied.packed.comps] == [id(m.compressor) for m in copied.gathered]
        assert torch.equal(lockstep([copied], [flat])[0], lockstep([bundle], [flat])[0])
        bundle = _bundle(_compressors("qsgd:7", 0))  # the same first step again


def test_without_the_kernels_each_member_takes_its_own_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the library cannot be built (no compiler, `APPROXDIST_KERNELS=off`) the bucket
    path answers None and the exchange is each member's own, results unchanged."""
    gen = torch.Generator().manual_seed(4)
    flats = [torch.randn(_bundle(_compressors("terngrad", 0)).numel, generator=gen)
             for _ in range(WORKERS)]
    want = lockstep([_bundle(_compressors("terngrad", w)) for w in range(WORKERS)], flats)
    monkeypatch.setattr(BucketKernel, "create", staticmethod(lambda: None))
    bundles = [_bundle(_compressors("terngrad", w)) for w in range(WORKERS)]
    assert all(b.packed is not None and b.packed.outgoing(f, None) is None
               for b, f in zip(bundles, flats, strict=True))
    for got, expected in zip(lockstep(bundles, flats), want, strict=True):
        assert torch.equal(got, expected)
