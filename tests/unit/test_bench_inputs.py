"""What the benchmarks feed a model: images with a class, or byte tokens with the next one."""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.config.schema import ModelConfig
from approxdist.data.text import VOCAB
from approxdist.models import build_model
from approxdist.models.bench_inputs import SEQ_LEN, bench_input


def test_gpt_models_get_tokens_and_the_next_token_loss() -> None:
    inputs = bench_input("gpt-tiny", (3, 32, 32))
    assert inputs.tokens and inputs.shape == (SEQ_LEN,) and inputs.classes == VOCAB
    x, y = inputs.sample(3, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, SEQ_LEN) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # each label is the next input token
    model = build_model(ModelConfig(name="gpt-tiny"), inputs.shape, inputs.classes)
    out = model(x)
    assert out.shape == (3, SEQ_LEN, VOCAB)
    assert torch.allclose(inputs.loss(out, y), F.cross_entropy(out.transpose(1, 2), y))


def test_other_models_get_the_bench_shape_and_a_class_each() -> None:
    inputs = bench_input("resnet20", (3, 32, 32))
    x, y = inputs.sample(5, torch.Generator().manual_seed(0))
    assert not inputs.tokens and x.shape == (5, 3, 32, 32) and y.shape == (5,)
    assert int(y.max()) < 10
