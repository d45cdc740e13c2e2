"""Error feedback: the residual carries each step's quantization error into the next."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.codecs import get_codec
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.errors import CodecError

G = torch.randn(2000, generator=torch.Generator().manual_seed(0))


def test_sum_of_decoded_plus_residual_is_sum_of_inputs() -> None:
    ef = ErrorFeedback(get_codec("table2"))
    sent = torch.zeros_like(G)
    for _ in range(20):
        payload, decoded = ef.encode("w", G)
        assert torch.equal(decoded, ef.codec.decode(payload))
        sent += decoded
    assert torch.allclose(sent + ef.residuals["w"], 20 * G, atol=1e-3)
    plain = get_codec("table2")
    plain_err = (plain.decode(plain.encode(G)) - G).abs().mean()
    assert float((sent / 20 - G).abs().mean()) < 0.2 * float(plain_err)


def test_input_is_not_modified_and_keys_are_separate() -> None:
    x = G.clone()
    ef = ErrorFeedback(get_codec("bits:s1e8m0"))
    ef.encode("a", x)
    ef.encode("b", x[:10])
    assert torch.equal(x, G)
    assert set(ef.residuals) == {"a", "b"} and ef.residual_norm() > 0
    ef.reset("a")
    assert set(ef.residuals) == {"b"}
    ef.reset()
    assert ef.residuals == {} and ef.residual_norm() == 0.0


def test_state_dict_round_trip_continues_identically() -> None:
    a = ErrorFeedback(get_codec("bits:s0e2+2m0"))
    a.encode("w", G)
    b = ErrorFeedback(get_codec("bits:s0e2+2m0"))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.encode("w", G)[1], b.encode("w", G)[1])
    assert torch.equal(a.residuals["w"], b.residuals["w"])


def test_wrong_codec_state_and_shape_change() -> None:
    ef = ErrorFeedback(get_codec("fp16"))
    ef.encode("w", G)
    with pytest.raises(CodecError, match="saved for codec 'fp16'"):
        ErrorFeedback(get_codec("bf16")).load_state_dict(ef.state_dict())
    with pytest.raises(CodecError, match="residuals"):
        ErrorFeedback(get_codec("fp16")).load_state_dict({"codec": "fp16"})
    _, decoded = ef.encode("w", G[:5])  # a rebuilt bucket: starts from zero
    assert torch.equal(decoded, G[:5].half().float())


def test_nonfinite_errors_are_not_carried() -> None:
    ef = ErrorFeedback(get_codec("fp16"))
    ef.encode("w", torch.tensor([float("nan"), 1e6, 1.0]))
    assert bool(torch.isfinite(ef.residuals["w"]).all())
