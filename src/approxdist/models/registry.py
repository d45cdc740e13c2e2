"""Models by name, or a user's factory `package.module:function`; each builder adapts to
the input shape and class count."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from approxdist.config.schema import ModelConfig
from approxdist.errors import ModelError, unknown_name
from approxdist.models.alexnet import alexnet_small
from approxdist.models.factory import build_from_factory, is_factory
from approxdist.models.gpt import SIZES as GPT_SIZES
from approxdist.models.gpt import gpt
from approxdist.models.gpt import sequence_plan as gpt_sequence_plan
from approxdist.models.gpt import tp_plan as gpt_plan
from approxdist.models.mlp import mlp
from approxdist.models.mlp import tp_plan as mlp_plan
from approxdist.models.resnet import resnet_cifar
from approxdist.models.resnet import tp_plan as resnet_plan
from approxdist.models.resnet1d import resnet1d
from approxdist.registry import Registry

Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Sequential]
MODELS: Registry[Builder] = Registry("model", ModelError)


def _resnet(depth: int) -> Builder:
    def build(cfg: ModelConfig, shape: tuple[int, ...], classes: int) -> nn.Sequential:
        _need_image("resnet", shape)
        return resnet_cifar(depth, shape, classes, cfg.width, cfg.shortcut)

    return build


def _need_image(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ModelError(
            f"model {name} needs image input (C, H, W); the data set gives shape {list(shape)}; "
            "use --model mlp"
        )


for _depth in (20, 32, 44, 56, 110):
    MODELS.add(f"resnet{_depth}", _resnet(_depth))


def _alexnet(cfg: ModelConfig, shape: tuple[int, ...], classes: int) -> nn.Sequential:
    _need_image("alexnet", shape)
    return alexnet_small(shape, classes, hidden=cfg.hidden, dropout=cfg.dropout)


MODELS.add("alexnet", _alexnet)
MODELS.add("mlp", lambda cfg, shape, classes: mlp(shape, classes, cfg.hidden, cfg.depth,
                                                  cfg.dropout))


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """The model named by `cfg.name` as an `nn.Sequential` of blocks; a name
    `package.module:function` calls that function with `cfg.args` (`models.factory`)."""
    if is_factory(cfg.name):
        return build_from_factory(cfg.name, cfg.args, input_shape, classes)
    if cfg.name not in MODELS:
        raise ModelError(f"{unknown_name('model', cfg.name, MODELS.names())}; or your own "
                         f"package.module:function returning an nn.Sequential of blocks")
    return MODELS.get(cfg.name)(cfg, input_shape, classes)


def _resnet1d(cfg: ModelConfig, shape: tuple[int, ...], classes: int) -> nn.Sequential:
    if len(shape) != 2:
        raise ModelError(
            f"model resnet1d needs signal input (C, L); the data set gives shape {list(shape)}; "
            "use a 2-D model such as resnet20"
        )
    return resnet1d(shape, classes, cfg.width, cfg.depth)


MODELS.add("resnet1d", _resnet1d)


def _gpt(name: str) -> Builder:
    def build(cfg: ModelConfig, shape: tuple[int, ...], classes: int) -> nn.Sequential:
        if len(shape) != 1:
            raise ModelError(
                f"model {name} needs token sequences (T,); the data set gives shape "
                f"{list(shape)}; use --dataset stdlib-text"
            )
        return gpt(GPT_SIZES[name], vocab=classes, seq_len=shape[0], dropout=cfg.dropout)

    return build


for _name in GPT_SIZES:
    MODELS.add(_name, _gpt(_name))


#: each model family's own tensor-parallel plan (`tensor_parallel.plan`): layer path -> style
TP_PLANS: dict[str, Callable[[nn.Module], dict[str, str]]] = {
    **{name: gpt_plan for name in GPT_SIZES}, "mlp": mlp_plan, "resnet1d": resnet_plan,
    **{f"resnet{d}": resnet_plan for d in (20, 32, 44, 56, 110)},
}


def tp_plan_of(name: str) -> Callable[[nn.Module], dict[str, str]] | None:
    """The model's own tensor-parallel plan (None: a model without one, e.g. alexnet or a
    user's factory: it needs a plan file)."""
    return TP_PLANS.get(name)


#: the families with a sequence dimension and their sequence-parallel plan (`_seq` styles)
SEQUENCE_PLANS: dict[str, Callable[[nn.Module], dict[str, str]]] = {
    name: gpt_sequence_plan for name in GPT_SIZES}


def sequence_plan_of(name: str) -> Callable[[nn.Module], dict[str, str]] | None:
    """The model's own tensor-parallel plan with sequence parallelism (None: a model
    without a sequence dimension, or one that has no such plan)."""
    return SEQUENCE_PLANS.get(name)
