"""Error feedback: the residual carries each step's quantization error into the next; one
implementation for `DataParallel`'s buckets and the DDP comm hook."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.codecs import get_codec
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.data_parallel.ddp_hook import HookState
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext

G = torch.randn(2000, generator=torch.Generator().manual_seed(0))
LAYOUT = [("w", 0, 1500), ("b", 1500, 500)]


def test_sum_of_sent_plus_residual_is_sum_of_inputs() -> None:
    """Exactly, but for fp32's rounding: each step rounds g + r, x - Q(x) and the running
    sum once each, by at most 2^-24 of the rounded value."""
    codec = get_codec("table2")
    ef = ErrorFeedback(LAYOUT)
    sent = torch.zeros_like(G)
    bound = torch.zeros_like(G)
    for _ in range(20):
        x = G.clone()
        ef.compensate(x, 0, codec)  # x now holds g + r: what the wire encodes
        sent += codec.decode(codec.encode(x))
        bound += 2.0 ** -24 * (x.abs() + ef.flat.abs() + sent.abs())
    assert bool(((sent + ef.flat - 20 * G).abs() <= bound).all())
    plain_err = (codec.decode(codec.encode(G)) - G).abs().mean()
    assert float((sent / 20 - G).abs().mean()) < 0.2 * float(plain_err)


def test_fragments_compensate_their_own_range_only() -> None:
    codec = get_codec("bits:s1e8m0")
    whole, parts = ErrorFeedback(LAYOUT), ErrorFeedback(LAYOUT)
    x = G.clone()
    whole.compensate(x, 0, codec)
    y = G.clone()
    for start, stop in ((0, 700), (700, 2000)):  # two threads, two fragments
        parts.compensate(y[start:stop], start, codec)
    assert torch.equal(x, y) and torch.equal(whole.flat, parts.flat)
    assert whole.residual_norm() > 0
    whole.reset()
    assert whole.residual_norm() == 0.0


def test_residuals_travel_by_name_into_another_layout() -> None:
    codec = get_codec("bits:s0e2+2m0")
    a = ErrorFeedback(LAYOUT)
    a.compensate(G.clone(), 0, codec)
    b = ErrorFeedback([("b", 0, 500), ("w", 500, 1500), ("new", 2000, 7)])  # another bucket cut
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.flat[:500], a.flat[1500:]) and torch.equal(b.flat[500:2000], a.flat[:1500])
    assert not b.flat[2000:].any()  # a name without a saved residual starts from zero
    with pytest.raises(ConfigError, match="residual of 'w' has 1500 values but the parameter has 3"):
        ErrorFeedback([("w", 0, 3)]).load_state_dict(a.state_dict())


def test_nonfinite_errors_are_not_carried() -> None:
    ef = ErrorFeedback([("w", 0, 3)])
    ef.compensate(torch.tensor([float("nan"), 1e6, 1.0]), 0, get_codec("fp16"))
    assert bool(torch.isfinite(ef.flat).all())


def test_ddp_hook_keeps_residuals_per_parameter_across_a_bucket_rebuild() -> None:
    """DDP rebuilds its buckets after the first step: the hook's feedback follows the names."""
    w, b = torch.zeros(1500), torch.zeros(500)
    state = HookState(DistContext(), {id(w): "w", id(b): "b"}, codec="bits:s0e2+2m0",
                      error_feedback=True)
    try:
        codec = get_codec("bits:s0e2+2m0")
        first = torch.cat([G[:1500], G[1500:]])
        state._compensate(first, [w, b], codec)
        saved = state.state_dict()["residuals"]
        assert set(saved) == {"w", "b"} and saved["w"].abs().sum() > 0
        rebuilt = torch.cat([G[1500:], G[:1500]])  # one bucket, the other order
        expect = rebuilt + torch.cat([saved["b"], saved["w"]])
        state._compensate(rebuilt, [b, w], codec)
        assert torch.equal(rebuilt, expect)
        padded = torch.zeros(2001)
        state._compensate(padded, [w, b], codec)  # padding: left alone
        assert not padded.any()
    finally:
        state.close()
