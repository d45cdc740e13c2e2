"""Fused weight-gradient accumulation (`pipeline.accumulate`) against plain autograd."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from approxdist.config.pipeline import FUSE_CHOICES, PipelineConfig
from approxdist.errors import ConfigError
from approxdist.pipeline.accumulate import (
    MIN_WEIGHTS,
    MODES,
    WeightGradFusion,
    _LinearAccumulate,
)
from approxdist.pipeline.stage import StageCompute


def _net(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16, bias=bias), nn.ReLU(), nn.Linear(16, 16, bias=bias),
                         nn.Tanh(), nn.Linear(16, 5, bias=bias))


def _accumulate(net: nn.Module, xs: list[torch.Tensor], fusion: WeightGradFusion | None
                ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Backward of every micro-batch in turn; the parameter and input gradients."""
    inputs = []
    for x in xs:
        x = x.clone().requires_grad_(True)
        if fusion is not None:
            with fusion.active():
                out = net(x)
        else:
            out = net(x)
        (out.square().mean() * 0.5).backward()
        inputs.append(x.grad)
    return {n: p.grad.clone() for n, p in net.named_parameters()}, inputs


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(6, 12), (3, 4, 12)])
def test_fused_gradients_equal_autograd_over_microbatches(bias: bool, shape: tuple[int, ...]
                                                          ) -> None:
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(shape, generator=gen) for _ in range(5)]
    plain, plain_in = _accumulate(_net(bias), xs, None)
    net = _net(bias)
    fusion = WeightGradFusion(net, min_weights=0)
    assert len(fusion.layers) == 3 and fusion.weights == 12 * 16 + 16 * 16 + 16 * 5
    fused, fused_in = _accumulate(net, xs, fusion)
    assert fused.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], atol=1e-6, rtol=1e-5)
        assert fused[name].shape == dict(net.named_parameters())[name].shape
    for a, b in zip(fused_in, plain_in):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_fused_nodes_only_inside_active() -> None:
    net = _net()
    fusion = WeightGradFusion(net, min_weights=0)
    x = torch.randn(2, 12)
    assert "LinearAccumulate" not in type(net[0](x).grad_fn).__name__
    with fusion.active():
        assert type(net[0](x).grad_fn).__name__ == "_LinearAccumulateBackward"
        with torch.no_grad():
            assert net[0](x).grad_fn is None
    fusion.remove()
    assert "forward" not in vars(net[0])
    with fusion.active():  # nothing left to fuse
        assert "LinearAccumulate" not in type(net[0](x).grad_fn).__name__


def test_hooked_frozen_and_subclassed_layers_keep_plain_autograd() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    net = nn.Sequential(nn.Linear(4, 4), Scaled(4, 4), nn.Linear(4, 4))
    seen: list[str] = []
    net[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append("hook"))
    net[2].weight.requires_grad_(False)
    fusion = WeightGradFusion(net, min_weights=0)
    assert fusion.layers == [net[0], net[2]]  # a subclass with its own forward is left alone
    with fusion.active():
        net(torch.randn(3, 4)).sum().backward()
    assert seen == ["hook"]  # the hooked weight went through AccumulateGrad
    assert net[2].weight.grad is None and net[2].bias.grad is not None


def test_update_between_forward_and_backward_is_refused() -> None:
    net = _net()
    fusion = WeightGradFusion(net, min_weights=0)
    with fusion.active():
        out = net(torch.randn(2, 12))
    with torch.no_grad():
        net[0].weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_deepcopy_of_a_fused_module_runs_its_own_weights() -> None:
    net = _net()
    WeightGradFusion(net, min_weights=0)
    twin = copy.deepcopy(net)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert twin(torch.randn(2, 12)).abs().sum() == 0


def test_stage_compute_fuses_large_layers_by_default_and_close_restores() -> None:
    net = nn.Sequential(nn.Linear(1024, MIN_WEIGHTS // 1024), nn.ReLU(),
                        nn.Linear(MIN_WEIGHTS // 1024, 10))
    stage = StageCompute(net, is_first=True, is_last=False, loss_fn=nn.functional.cross_entropy)
    assert stage.fusion is not None and stage.fusion.layers == [net[0]]  # "auto": big ones
    stage.close()
    assert stage.fusion is None and "forward" not in vars(net[0])
    every = StageCompute(_net(), is_first=True, is_last=False,
                         loss_fn=nn.functional.cross_entropy, fuse_accumulation="all")
    assert every.fusion is not None and len(every.fusion.layers) == 3
    off = StageCompute(_net(), is_first=True, is_last=False,
                       loss_fn=nn.functional.cross_entropy, fuse_accumulation="off")
    assert off.fusion is None


def test_bad_fuse_setting_is_a_config_error() -> None:
    assert tuple(MODES) == FUSE_CHOICES  # the config's choices are the stage's modes
    with pytest.raises(ConfigError, match="pipeline.fuse_accumulation = 'yes' is not one of: "
                                          "auto, all, off"):
        PipelineConfig(fuse_accumulation="yes")
    with pytest.raises(ConfigError, match="fuse_accumulation = True is not one of"):
        StageCompute(_net(), is_first=True, is_last=False, loss_fn=nn.functional.cross_entropy,
                     fuse_accumulation=True)  # type: ignore[arg-type]


def test_double_backward_is_refused_not_silently_wrong() -> None:
    w = nn.Parameter(torch.randn(3, 3))
    x = torch.randn(2, 3, requires_grad=True)
    out = _LinearAccumulate.apply(x, w, None)
    with pytest.raises(RuntimeError, match="create_graph=True.*--fuse-accumulation off"):
        torch.autograd.grad(out.sum(), x, create_graph=True)
