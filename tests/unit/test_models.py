"""Models: output shapes on every input size, block boundaries, ResNet depth and shortcuts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from approxdist.config.schema import ModelConfig
from approxdist.errors import ModelError
from approxdist.models import MODELS, build_model
from approxdist.models.resnet import BasicBlock

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


@pytest.mark.parametrize("name", ["resnet20", "alexnet", "mlp"])
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(ModelConfig(name=name), shape, 7)
    assert isinstance(model, nn.Sequential)
    assert model(torch.randn(3, *shape)).shape == (3, 7)


@pytest.mark.parametrize(("depth", "n"), [(20, 3), (32, 5), (44, 7), (56, 9), (110, 18)])
def test_resnet_blocks_are_residual_blocks(depth: int, n: int) -> None:
    model = build_model(ModelConfig(name=f"resnet{depth}"), (3, 32, 32), 10)
    assert len(model) == 3 * n + 2  # stem + residual blocks + head
    assert sum(isinstance(b, BasicBlock) for b in model) == 3 * n
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert convs == depth - 1  # 6n + 1 convolutions (+ 1 linear = depth), option A


def test_blocks_compose_at_any_cut() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="resnet20"), (1, 8, 8), 10).eval()
    x = torch.randn(4, 1, 8, 8)
    full = model(x)
    for cut in range(1, len(model)):
        assert torch.equal(model[cut:](model[:cut](x)), full)


def test_shortcut_b_has_projections() -> None:
    a = build_model(ModelConfig(name="resnet20", shortcut="A"), (3, 32, 32), 10)
    b = build_model(ModelConfig(name="resnet20", shortcut="B"), (3, 32, 32), 10)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(b) > count(a)


def test_unknown_and_mismatched() -> None:
    valid = "alexnet, gpt-mini, gpt-small, gpt-tiny, mlp, resnet110"
    with pytest.raises(ModelError, match=f"unknown model 'vgg'; valid: {valid}.*module:function"):
        build_model(ModelConfig(name="vgg"), (3, 32, 32), 10)
    with pytest.raises(ModelError, match="needs image input"):
        build_model(ModelConfig(name="resnet20"), (40,), 10)
    assert "resnet56" in MODELS


def test_resnet1d_on_signals() -> None:
    model = build_model(ModelConfig(name="resnet1d", depth=2), (1, 40), 10)
    assert len(model) == 3 * 2 + 2
    assert model(torch.randn(5, 1, 40)).shape == (5, 10)
    with pytest.raises(ModelError, match="needs signal input"):
        build_model(ModelConfig(name="resnet1d"), (1, 8, 8), 10)
