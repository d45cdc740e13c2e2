"""The codec's error on the update (`comm.update_error`): against direct computation, with
error feedback telescoping to the residuals, and the poison at about sqrt(2)."""

from __future__ import annotations

import math

import pytest
import torch

from approxdist.comm.codecs import get_codec
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.comm.update_error import UpdateError, merge, relative, sent_values

LAYOUT = [("a", 0, 300), ("b", 300, 100)]


def _grads(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(400, generator=gen) for _ in range(steps)]


def test_error_per_slice_equals_the_roundtrips_summed_over_steps() -> None:
    codec = get_codec("fp8-e5m2")
    probe = UpdateError(LAYOUT, 400, torch.device("cpu"))
    grads = _grads(3)
    for g in grads:  # two fragments, as two threads would observe them
        for lo, hi in ((0, 250), (250, 400)):
            probe.observe(lo, g[lo:hi], sent_values(g[lo:hi], codec, None))
    e = sum(codec.roundtrip(g.clone()).double() - g.double() for g in grads)
    s = sum(g.double() for g in grads)
    sums = probe.sums()
    assert sums["a"][:2] == pytest.approx((float(e[:300].square().sum()),
                                           float(s[:300].square().sum())))
    assert sums["b"][:2] == pytest.approx((float(e[300:].square().sum()),
                                           float(s[300:].square().sum())))
    assert 0.01 < relative(sums) < 0.1  # fp8-e5m2: 2 mantissa bits


def test_with_error_feedback_the_error_is_what_the_residual_still_holds() -> None:
    codec = get_codec("table1")
    fb = ErrorFeedback(LAYOUT, 400)
    probe = UpdateError(LAYOUT, 400, torch.device("cpu"))
    r0 = fb.flat.clone()
    for g in _grads(5):
        x = g.clone()
        fb.compensate(x, 0, codec)
        probe.observe(0, g, sent_values(x, codec, fb.flat))
    # sum of sent - sum of exact = r_0 - r_T: feedback's later give-back counts as given
    e = (r0 - fb.flat).double()
    assert probe.sums()["a"][0] == pytest.approx(float(e[:300].square().sum()), rel=1e-6)


def test_the_sign_dropping_poison_is_about_sqrt2_and_exact_sends_are_zero() -> None:
    poison = get_codec("bits:s0e8m7")
    one, four = (UpdateError(LAYOUT, 400, torch.device("cpu")) for _ in range(2))
    exact = UpdateError(LAYOUT, 400, torch.device("cpu"))
    for k, g in enumerate(_grads(4)):
        if k == 0:
            one.observe(0, g, sent_values(g, poison, None))
        four.observe(0, g, sent_values(g, poison, None))
        exact.observe(0, g, None)
    assert 1.2 < relative(one.sums()) < 1.6  # sqrt(2): half the energy flips sign
    # biased: its error adds up over steps while noise in the exact sum partly cancels
    assert relative(four.sums()) > relative(one.sums())
    assert relative(exact.sums()) == 0.0 and exact.sums()["a"][1] > 0


def test_merge_adds_per_name_and_relative_handles_empty() -> None:
    merged = merge([{"a": (1.0, 4.0, 2)}, {"a": (3.0, 12.0, 2), "b": (0.0, 1.0, 1)}])
    assert merged == {"a": (4.0, 16.0, 2), "b": (0.0, 1.0, 1)}
    assert relative(merged) == pytest.approx(math.sqrt(4 / 17))
    assert relative({}) == 0.0 and relative({"a": (1.0, 0.0, 1)}) == math.inf
