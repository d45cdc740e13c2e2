"""Compressors against plain references written from their papers, one process.

Each reference below is the paper's formula applied to N simulated workers' gradients
over a few steps (error feedback kept per worker); the compressors are driven through
`lockstep`, which combines their messages as the collective would (sum in worker order,
or gather + decode + mean / vote). Deterministic compressors match bit for bit; the
stochastic ones draw from the same counter-based stream as their reference.
"""

from __future__ import annotations

import math

import pytest
import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors import (
    DEFAULT_COMPRESSORS,
    Gathered,
    Where,
    check_compressor,
    get_compressor,
    is_compressor,
    run_alone,
)
from approxdist.comm.compressors.ordered import ordered_sum
from approxdist.comm.compressors.stream import step_key, uniform
from approxdist.errors import ConfigError, SpecError
from tests.helpers.lockstep import lockstep

SHAPE = (24, 40)
N = 3
STEPS = 3
SEED = 5


def grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(SHAPE, generator=gen) for _ in range(N)]


def run(spec: str) -> list[list[torch.Tensor]]:
    """Every step's per-worker results of `spec` on N workers."""
    comps = [get_compressor(spec, Where(SHAPE, seed=SEED, worker=w)) for w in range(N)]
    return [lockstep(comps, grads(s)) for s in range(STEPS)]


def mean_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0].clone()
    for p in parts[1:]:
        total = total + p
    return total / len(parts)


def with_feedback(compress) -> list[list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """References of the error-feedback compressors: p = g + e, c = C(p), e = p - c; mean of c."""
    errors = [torch.zeros(SHAPE).reshape(-1) for _ in range(N)]
    out = []
    for s in range(STEPS):
        sent = []
        for w, g in enumerate(grads(s)):
            p = g.reshape(-1) + errors[w]
            c = compress(p, s)
            errors[w] = p - c
            sent.append(c)
        out.append(mean_in_order(sent).view(SHAPE))
    return out


def assert_all_workers(results: list[list[torch.Tensor]], reference: list[torch.Tensor]) -> None:
    for step, (per_worker, ref) in enumerate(zip(results, reference, strict=True)):
        for w, got in enumerate(per_worker):
            assert torch.equal(got, ref), f"step {step} worker {w}"


def test_topk_with_feedback_equals_reference() -> None:
    k = int(0.05 * math.prod(SHAPE))

    def topk(p: torch.Tensor, _: int) -> torch.Tensor:
        keep = torch.argsort(p.abs(), descending=True)[:k]
        c = torch.zeros_like(p)
        c[keep] = p[keep]
        return c

    assert_all_workers(run("topk:0.05"), with_feedback(topk))


def test_randomk_shares_indices_and_sums_in_compressed_form() -> None:
    n = math.prod(SHAPE)
    k = int(0.1 * n)
    # one stream, the same on every worker: seeded by the tensor's `Where.shared_seed`
    gen = torch.Generator().manual_seed(Where(SHAPE, seed=SEED).shared_seed)
    picks = [torch.randperm(n, generator=gen)[:k] for _ in range(STEPS)]

    def randomk(p: torch.Tensor, step: int) -> torch.Tensor:
        c = torch.zeros_like(p)
        c[picks[step]] = p[picks[step]]
        return c

    assert_all_workers(run("randomk:0.1"), with_feedback(randomk))


def test_scaled_sign_with_feedback_equals_reference() -> None:
    def scaled_sign(p: torch.Tensor, _: int) -> torch.Tensor:  # ||p||_1 in the fixed order
        return ordered_sum(p.abs()) / p.numel() * torch.where(p < 0, -1.0, 1.0)

    assert_all_workers(run("sign+ef"), with_feedback(scaled_sign))


def test_signsgd_is_the_majority_vote() -> None:
    ref = []
    for s in range(STEPS):
        votes = sum(torch.where(g < 0, -1.0, 1.0) for g in grads(s))
        ref.append(torch.sign(torch.as_tensor(votes)))
    assert_all_workers(run("signsgd"), ref)


def terngrad_ref(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Wen et al. (2017), eq. 2: s * sign(g) * b, b ~ Bernoulli(|g| / s), s = max |g|
    (b = 1 where u s < |g|)."""
    s = g.abs().max()
    return s * torch.sign(g) * (u * s < g.abs())


def qsgd_ref(v: torch.Tensor, u: torch.Tensor, s: int) -> torch.Tensor:
    """Alistarh et al. (2017), section 3.1: ||v|| sign(v_i) xi_i(v, s) with xi = (l + b) / s;
    ||v|| the root of the squares summed in the wire's fixed order (as sign+ef's scale)."""
    norm = ordered_sum(v * v).sqrt()
    a = s * v.abs() / norm
    low = a.floor()
    return norm * torch.sign(v) * (low + (u < a - low)) / s


def stochastic_ref(quantise) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Each worker draws from its own stream (`Where.own_seed`: the tensor's seed times a
    stride plus the worker), step s's draws keyed by (that seed, s)."""
    out = []
    for s in range(STEPS):
        seeds = [Where(SHAPE, seed=SEED, worker=w).own_seed for w in range(N)]
        parts = [quantise(g.reshape(-1), uniform(step_key(seeds[w], s), g.numel()))
                 for w, g in enumerate(grads(s))]
        out.append(mean_in_order(parts).view(SHAPE))
    return out


def test_terngrad_equals_reference() -> None:
    assert_all_workers(run("terngrad"), stochastic_ref(terngrad_ref))


def test_qsgd_equals_reference() -> None:
    ref = stochastic_ref(lambda v, u: qsgd_ref(v, u, 16))
    for per_worker, r in zip(run("qsgd:16"), ref, strict=True):
        for got in per_worker:  # the same levels; the norm / s product rounds differently
            torch.testing.assert_close(got, r, rtol=2e-6, atol=0)


def z2_bound(p: torch.Tensor, draws: int) -> tuple[torch.Tensor, float]:
    """Mask of the random coordinates and the std of the mean of their z^2 over `draws`.

    A coordinate is scale * (l + B), B ~ Bernoulli(p); its mean over T draws has variance
    scale^2 p q / T, so z^2 = (mean - x)^2 / (scale^2 p q / T) has mean 1 and variance
    2 + (1 - 6pq) / (T p q) (the binomial's excess kurtosis); averaged over the masked
    coordinates its variance is that sum over their count squared."""
    pq = p * (1 - p)
    mask = pq > 1e-3
    var = (2 + (1 - 6 * pq[mask]) / (draws * pq[mask])).sum() / mask.sum() ** 2
    return mask, float(var.sqrt())


@pytest.mark.parametrize("spec", ["qsgd:4", "terngrad"])
def test_unbiased_within_the_bound_from_their_variance(spec: str) -> None:
    x = torch.randn(400, generator=torch.Generator().manual_seed(1))
    comp = get_compressor(spec, Where((400,), seed=2))
    draws = 1500
    mean = torch.zeros(400, dtype=torch.float64)
    for _ in range(draws):
        mean += run_alone(comp, x).double()
    mean /= draws
    if spec == "terngrad":
        scale = x.abs().max().double()
        p = x.abs().double() / scale
    else:
        scale = torch.linalg.vector_norm(x).double() / 4
        a = x.abs().double() / scale
        p = a - a.floor()
    mask, std = z2_bound(p, draws)
    z2 = ((mean - x.double())[mask] ** 2 / (scale**2 * p[mask] * (1 - p[mask]) / draws))
    assert abs(float(z2.mean()) - 1) < 5 * std, (float(z2.mean()), std)
    fixed = ~mask & ((p < 1e-9) | (p > 1 - 1e-9))  # no randomness: exact up to rounding
    torch.testing.assert_close(mean[fixed], x.double()[fixed], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", DEFAULT_COMPRESSORS)
def test_messages_hold_the_stated_bytes(spec: str) -> None:
    comps = [get_compressor(spec, Where(SHAPE, worker=w)) for w in range(2)]
    sent: list[int] = []
    lockstep(comps, grads(0)[:2], sent)
    assert sent == [comps[0].wire_bytes()] * 2
    assert comps[0].bytes_per_value() == comps[0].wire_bytes() / math.prod(SHAPE)


def test_bytes_per_value_of_each_form() -> None:
    n = 1 << 20
    def per_value(spec: str, shape: tuple[int, ...] = (n,)) -> float:
        return get_compressor(spec, Where(shape)).bytes_per_value()
    assert per_value("topk:0.01") == pytest.approx(0.08, rel=1e-3)      # 8 bytes a kept value
    assert per_value("randomk:0.01") == pytest.approx(0.04, rel=1e-3)   # values only
    assert per_value("qsgd:16") == pytest.approx(6 / 8, rel=1e-4)       # 33 codes: 6 bits
    assert per_value("terngrad") == pytest.approx(2 / 8, rel=1e-4)
    assert per_value("sign+ef") == pytest.approx(1 / 8, rel=1e-4)
    assert per_value("signsgd") == 1 / 8
    assert per_value("powersgd:2", (1024, 1024)) == 4 * 2 * 2048 / (1024 * 1024)


@pytest.mark.parametrize("spec", DEFAULT_COMPRESSORS)
def test_state_resumes_bit_for_bit(spec: str) -> None:
    first = get_compressor(spec, Where(SHAPE, seed=3))
    for s in range(2):
        run_alone(first, grads(s)[0])
    second = get_compressor(spec, Where(SHAPE, seed=3))
    second.load_state_dict(first.state_dict())
    for s in range(2, 4):
        assert torch.equal(run_alone(first, grads(s)[0]), run_alone(second, grads(s)[0]))
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key


def test_a_state_of_another_compressor_is_one_line() -> None:
    state = get_compressor("topk:0.1", Where(SHAPE)).state_dict()
    with pytest.raises(ConfigError, match=r"qsgd:16 state has entries \['residual'\].*'steps'"):
        get_compressor("qsgd:16", Where(SHAPE)).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"shape \(960,\), expected \(10,\)"):
        get_compressor("topk:0.1", Where((10,))).load_state_dict(state)


@pytest.mark.parametrize(("spec", "value", "fix"), [
    ("topk:2", "'2'", "topk:0.01"), ("randomk:0", "'0'", "randomk:0.01"),
    ("topk", "no ratio", "topk:0.01"), ("powersgd:0", "'0'", "powersgd:2"),
    ("powersgd:x", "'x'", "powersgd:2"), ("qsgd:1", "'1'", "use terngrad"),
    ("qsgd:1e9", "'1e9'", "qsgd:16"), ("terngrad:4", "terngrad:4", "write terngrad"),
    ("lowrank:2", "'lowrank'", "valid: powersgd, qsgd"),
])
def test_bad_specs_are_one_line_naming_the_value_and_a_fix(spec: str, value: str,
                                                           fix: str) -> None:
    with pytest.raises(SpecError) as err:
        check_compressor(spec)
    text = str(err.value)
    assert "\n" not in text and value in text and fix in text, text


def test_powersgd_on_a_vector_names_it_and_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"'fc\.bias' of shape \(10,\).*--codec-rule '\*\.bias=fp32'"):
        get_compressor("powersgd:2", Where((10,), name="fc.bias"))


def test_specs_tell_compressors_from_codecs() -> None:
    assert all(is_compressor(s) for s in DEFAULT_COMPRESSORS)
    assert not any(is_compressor(s) for s in ("fp32", "bf16", "bits:s0e2+2m0", "table4"))


@pytest.mark.parametrize("spec", ["topk:0.1", "qsgd:16", "terngrad", "sign+ef", "signsgd"])
def test_payloads_decode_at_any_offset_of_a_receive_buffer(spec: str) -> None:
    comp = get_compressor(spec, Where(SHAPE, seed=1))
    assert isinstance(comp, Gathered)
    payload = comp.encode(grads(0)[0].reshape(-1))
    shifted = torch.empty(payload.wire_bytes + 3, dtype=torch.uint8)[3:]  # not 4-byte aligned
    shifted.copy_(payload.data)
    assert torch.equal(comp.decode(Payload(shifted, payload.shape)), comp.decode(payload))


@pytest.mark.parametrize("spec", DEFAULT_COMPRESSORS)
def test_the_spec_states_the_collective_its_compressor_needs(spec: str) -> None:
    assert check_compressor(spec) == get_compressor(spec, Where(SHAPE)).collective


@pytest.mark.parametrize("spec", [s for s in DEFAULT_COMPRESSORS if s != "powersgd:2"])
def test_one_message_unpacked_by_a_receivers_copy_equals_the_exchange(spec: str) -> None:
    """A push (`message`, then a receiver's `unpack` and `aggregate`) gives what two workers'
    exchange gives, and leaves the sender in the state the exchange leaves it in."""
    senders = [get_compressor(spec, Where(SHAPE, worker=w)) for w in range(2)]
    receivers = [get_compressor(spec, Where(SHAPE, worker=w)) for w in range(2)]
    twins = [get_compressor(spec, Where(SHAPE, worker=w)) for w in range(2)]
    for s in range(STEPS):
        pair = grads(s)[:2]
        messages = [c.message(g) for c, g in zip(senders, pair)]
        assert [m.numel() for m in messages] == [senders[0].wire_bytes()] * 2
        assert all(m.dtype == torch.uint8 for m in messages)
        pushed = receivers[0].aggregate([r.unpack(m) for r, m in zip(receivers, messages)])
        assert torch.equal(pushed, lockstep(twins, pair)[0].reshape(-1))
        for sender, twin in zip(senders, twins):
            for key, value in twin.state_dict().items():
                assert torch.equal(sender.state_dict()[key], value), key


def test_powersgd_sends_two_messages_a_step() -> None:
    comp = get_compressor("powersgd:2", Where(SHAPE))
    assert comp.rounds == 2
    with pytest.raises(NotImplementedError, match="no single message"):
        comp.unpack(torch.zeros(8, dtype=torch.uint8))
