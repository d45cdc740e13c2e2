"""Fused kernels of QSGD, TernGrad, the sign methods and top-k: the torch reference's bytes,
decoded values, sums and residuals bit for bit, and the counter-based stream both draw from."""

from __future__ import annotations

import ctypes
import pickle

import pytest
import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors import Compressor, Where, get_compressor
from approxdist.comm.compressors.ordered import CHUNK, LANES, ordered_sum
from approxdist.comm.compressors.packed import Packed
from approxdist.comm.compressors.stream import GOLDEN, MASK, mix32, step_key, uniform
from approxdist.comm.compressors.topk import TopK
from approxdist.kernels import kernel_status
from approxdist.kernels.compress import CompressKernel, sum_chunks
from approxdist.kernels.table import TableKernel
from tests.helpers.lockstep import lockstep

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"C kernels unavailable: {kernel_status().detail}")

#: code widths 3, 4, 6, 9 (QSGD), 2 (TernGrad), 1 (signs); top-k
SPECS = ["qsgd:2", "qsgd:7", "qsgd:16", "qsgd:200", "terngrad", "sign+ef",
         "signsgd", "topk:0.01", "topk:0.3"]
#: lengths around the kernels' 2048-value blocks and every sub-byte group size
LENGTHS = [0, 1, 3, 7, 8, 9, 2047, 2048, 2049, 5003]
WORLD = 3


def values(n: int, seed: int) -> torch.Tensor:
    """Normal values over many magnitudes, with zeros of both signs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 3)
    x[: min(n, 2)] = torch.tensor([0.0, -0.0])[: min(n, 2)]
    return x


def use_kernels(comp: Compressor, fused: bool, lib: ctypes.CDLL | None = None) -> None:
    """Make `comp` use its kernels or its torch ops; `lib` instead of the cached build."""
    encoder = None if lib is None else CompressKernel(lib)
    if isinstance(comp, TopK):
        comp.use_kernels = fused
        if fused and encoder is not None:
            comp._kernels.get(lambda: encoder)
        return
    assert isinstance(comp, Packed)
    comp.codes.use_kernels = fused
    if fused and lib is not None:
        decoder = TableKernel(lib, comp.codes.width)
        comp.codes._encoder.get(lambda: encoder)
        comp.codes._decoder.get(lambda: decoder)


def run_workers(spec: str, n: int, fused: bool, lib: ctypes.CDLL | None = None,
                world: int = WORLD, steps: int = 2) -> list[torch.Tensor]:
    """Each worker's message bytes, their decodings by a receiver, the exchange results and
    the compressors' states, over `steps` steps of `world` workers."""
    def make(worker: int) -> Compressor:
        comp = get_compressor(spec, Where((n,), seed=7, worker=worker))
        use_kernels(comp, fused, lib)
        return comp
    senders, workers = [make(w) for w in range(world)], [make(w) for w in range(world)]
    receiver = make(0)
    out: list[torch.Tensor] = []
    for step in range(steps):
        xs = [values(n, 10 * step + w) for w in range(world)]
        messages = [c.message(x) for c, x in zip(senders, xs)]
        out += messages + [receiver.unpack(m) for m in messages] + lockstep(workers, xs)
        out += [v for c in workers for v in c.state_dict().values()]
    return out


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(expected), what
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: output {i} {a.dtype} {b.dtype}"
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), \
            f"{what}: output {i} differs"


@needs_kernels
@pytest.mark.parametrize("spec", SPECS)
def test_kernels_equal_the_torch_reference_bit_for_bit(spec: str) -> None:
    for n in LENGTHS[spec.startswith("topk"):]:  # top-k keeps at least one value
        assert_same(run_workers(spec, n, True), run_workers(spec, n, False), f"{spec} n={n}")


@needs_kernels
def test_the_kernels_do_run() -> None:
    comp = get_compressor("qsgd:16", Where((64,)))
    assert isinstance(comp, Packed)
    x = values(64, 1)
    assert comp.codes.encoder(x) is not None
    assert comp.codes.decoder(comp.encode(x)) is not None


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_topk_ties_go_to_the_lower_index_on_any_thread_count(threads: int) -> None:
    """Integer values: many equal magnitudes of both signs, split over the threads' ranges;
    the oracle is a stable descending sort of the magnitudes."""
    n = 4 * (1 << 17) + 77
    x = torch.randint(-20, 21, (n,), generator=torch.Generator().manual_seed(threads)).float()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ratio in ("0.001", "0.2", "1"):
            fused, ops = get_compressor(f"topk:{ratio}", Where((n,))), \
                get_compressor(f"topk:{ratio}", Where((n,)))
            assert isinstance(fused, TopK) and isinstance(ops, TopK)
            ops.use_kernels = False
            k = fused.k
            oracle = torch.sort(x.abs(), descending=True, stable=True).indices[:k].sort().values
            sent = fused.encode(x).data
            assert torch.equal(sent, ops.encode(x).data), ratio
            assert torch.equal(sent[4 * k:].view(torch.int32).long(), oracle), ratio
            assert torch.equal(sent[: 4 * k].view(torch.float32), x[oracle]), ratio
    finally:
        torch.set_num_threads(old)


def test_a_zero_or_non_finite_gradient_sends_level_zero() -> None:
    for x in (torch.zeros(100), torch.full((100,), float("inf")), torch.full((100,), float("nan"))):
        for spec, zero in (("qsgd:16", 16), ("terngrad", 0)):
            fused, ops = get_compressor(spec, Where((100,))), get_compressor(spec, Where((100,)))
            assert isinstance(fused, Packed) and isinstance(ops, Packed)
            ops.codes.use_kernels = False
            sent = fused.message(x)
            assert torch.equal(sent, ops.message(x)), spec
            codes, _ = fused.codes.unpack(Payload(sent, torch.Size([100])))
            assert bool((codes == zero).all()), (spec, x[0])


@needs_kernels
def test_the_ordered_sum_is_the_kernels_and_within_its_rounding_bound() -> None:
    """C and torch ops add in the same order; each sum within (additions on the longest path)
    * 2^-24 of the float64 sum (all terms are magnitudes)."""
    kernel = CompressKernel.create()
    assert kernel is not None
    for n in LENGTHS + [CHUNK * 5 + 17]:
        x = values(n, n)
        residual = x.clone()
        got = kernel.feedback_sum(None, residual, torch.empty(sum_chunks(n)))
        want = ordered_sum(x.abs())
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"n={n}"
        exact = float(x.double().abs().sum())
        depth = CHUNK // LANES + 4 + max(sum_chunks(n) - 1, 0).bit_length()
        assert abs(float(want) - exact) <= depth * 2.0**-24 * exact, f"n={n}"
        assert torch.equal(residual, x)  # only read without a gradient


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_the_squares_sum_is_the_ordered_sum_on_any_thread_count(threads: int) -> None:
    """QSGD's squared norm by the kernel, split over the threads, has the bits of torch ops'
    `ordered_sum(x * x)`: lengths around the lanes, chunks and thread ranges, squares that
    underflow and sums that overflow (inf either way); within (additions on the longest
    path + 1 for the square) * 2^-24 of the float64 sum where finite."""
    kernel = CompressKernel.create()
    assert kernel is not None
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in LENGTHS + [CHUNK * 5 + 17, 3 * (1 << 17) + 13]:
            for scale in (1.0, 1e-22, 1e19):
                x = values(n, n) * scale
                got, want = kernel.square_sum(x), ordered_sum(x * x)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (n, scale)
                if scale == 1.0:
                    exact = float((x.double() ** 2).sum())
                    depth = 1 + CHUNK // LANES + 4 + max(sum_chunks(n) - 1, 0).bit_length()
                    assert abs(float(got) - exact) <= depth * 2.0**-24 * exact, f"n={n}"
    finally:
        torch.set_num_threads(old)


def test_the_stream_is_the_hash_of_seed_step_and_index() -> None:
    """torch's int64 emulation against plain integer arithmetic (i * GOLDEN wraps from i = 2)."""
    key = step_key(12345678901, 3)
    for n in (1, 17, 5003):
        want = [(mix32((key + i * GOLDEN) & MASK) >> 8) * 2.0**-24 for i in range(n)]
        assert torch.equal(uniform(key, n), torch.tensor(want, dtype=torch.float32))
    assert len({step_key(5, 0), step_key(5, 1), step_key(6, 0), step_key(5 + (1 << 32), 0)}) == 4


def test_the_stream_is_uniform_within_its_sampling_error() -> None:
    """16 bins of 2^20 draws: each bin's count within 5 standard deviations of n / 16."""
    n, bins = 1 << 20, 16
    u = uniform(step_key(3, 0), n)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.bincount((u * bins).long(), minlength=bins).double()
    std = (n * (1 / bins) * (1 - 1 / bins)) ** 0.5
    assert float((counts - n / bins).abs().max()) < 5 * std, counts
    pairs = (u[:-1] - 0.5) * (u[1:] - 0.5)  # neighbouring draws: no correlation
    assert abs(float(pairs.double().mean())) < 5 * (1 / 12) / (n - 1) ** 0.5


def test_a_compressor_with_kernels_pickles_and_still_encodes() -> None:
    comp = get_compressor("terngrad", Where((300,), seed=1))
    x = values(300, 2)
    comp.message(x)  # resolves the kernels
    again = pickle.loads(pickle.dumps(comp))
    ops = pickle.loads(pickle.dumps(comp))
    assert isinstance(ops, Packed)
    ops.codes.use_kernels = False
    assert torch.equal(again.message(x), ops.message(x))


@needs_kernels
def test_topk_floor_from_a_misleading_sample_falls_back_to_every_value() -> None:
    """topk.c counts only values at or above a floor estimated from a strided sample; here the
    sample holds only the large values (every 16th), too few for k, so it must count all."""
    n = 1 << 18
    x = values(n, 5) * 1e-3
    x[::16] = 100.0 + values(n // 16, 6).abs()
    for ratio in ("0.1", "0.01"):
        fused, ops = get_compressor(f"topk:{ratio}", Where((n,))), \
            get_compressor(f"topk:{ratio}", Where((n,)))
        assert isinstance(fused, TopK) and isinstance(ops, TopK)
        use_kernels(ops, False)
        assert torch.equal(fused.encode(x).data, ops.encode(x).data), ratio
        for step in range(2):  # error feedback: gradient plus residual in the first pass
            assert torch.equal(fused.outgoing(x).data, ops.outgoing(x).data), (ratio, step)
            assert torch.equal(fused.state["residual"], ops.state["residual"]), (ratio, step)


@needs_kernels
def test_topk_on_small_tensors_selects_as_the_torch_ops() -> None:
    """Below 65536 values topk.c finds the k-th largest pattern by three small histograms
    (11, 10, 10 bits) instead of the two large ones: ties of integer values, patterns that
    share their top bits (values near 1.0) and a constant tensor, with error feedback,
    against the torch path and a stable sort; and across the size where the method changes."""
    gen = torch.Generator().manual_seed(11)
    cases = {"ties": torch.randint(-20, 21, (5003,), generator=gen).float(),
             "near one": 1.0 + torch.rand(40000, generator=gen) * 1e-5,
             "constant": torch.full((4096,), -0.25),
             "below": values((1 << 16) - 1, 12), "at": values(1 << 16, 13)}
    for name, x in cases.items():
        n = x.numel()
        for ratio in ("0.01", "0.3", "1"):
            fused, ops = get_compressor(f"topk:{ratio}", Where((n,))), \
                get_compressor(f"topk:{ratio}", Where((n,)))
            assert isinstance(fused, TopK) and isinstance(ops, TopK)
            use_kernels(ops, False)
            oracle = torch.sort(x.abs(), descending=True, stable=True).indices[:fused.k]
            sent = fused.encode(x).data
            assert torch.equal(sent, ops.encode(x).data), (name, ratio)
            assert torch.equal(sent[4 * fused.k:].view(torch.int32).long(),
                               oracle.sort().values), (name, ratio)
            for step in range(2):  # error feedback: gradient plus residual made first
                assert torch.equal(fused.outgoing(x).data, ops.outgoing(x).data), (name, step)
                assert torch.equal(fused.state["residual"], ops.state["residual"]), (name, step)
