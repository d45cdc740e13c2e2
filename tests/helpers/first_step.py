"""The first training step of `approxdist train --parallel single` as the product takes it.

The CLI's own parser and `train_cmd.resolve` make the config from the command's flags,
`init_from_env` the context on the asked device, `engine_for` the single-process engine
(the model from the seed, moved to the device, and its SGD) and the engine's `train_step`
takes the first mini-batch of epoch 1 (`ShardedBatches`, as the trainer draws it) at the
optimiser's configured rate. What backward wrote into each parameter's `.grad` is caught by
a hook before the optimiser reads it; the initial model (fp32, on the CPU), the batch and
the weights after the step come back with it, for `step_oracle.step_reference`. Hooks on
the model's leaf layers also record what each one computed (its input and output, and the
gradient backward brought to its output), for `op_oracle`: hooks only copy, the step's
numbers are the product's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from approxdist.cli.main import build_parser
from approxdist.cli.train_cmd import resolve
from approxdist.data import ShardedBatches, load_dataset
from approxdist.launch.context import init_from_env
from approxdist.train.build import engine_for

#: the run `tests/gpu/test_cuda_train.py` checks (an MLP on the digits: no convolution)
MLP = ("--model", "mlp", "--epochs", "1", "--seed", "3")


@dataclass(frozen=True)
class FirstStep:
    """The model before the step (fp32, CPU), the batch (CPU), the step's gradients and the
    weights after the optimiser's step by parameter name (CPU), with the device they were
    computed on."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    grads: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    device: torch.device
    #: each leaf layer's call in forward order, as the device computed it
    ops: list[Op]


@dataclass
class Op:
    """One leaf layer's call: its name, input, output and the gradient of the loss with
    respect to its output (None where backward brought none, e.g. a layer of the inputs)."""

    name: str
    inp: torch.Tensor
    out: torch.Tensor
    grad_out: torch.Tensor | None = None


def first_step(device: str, *flags: str) -> FirstStep:
    """One step of `approxdist train --parallel single --device DEVICE` with `MLP` and
    `flags`, through the engine `train` runs."""
    args = build_parser().parse_args(["train", *MLP, *flags, "--parallel", "single",
                                      "--device", device])
    cfg, _, _ = resolve(args)
    ctx = init_from_env(cfg.train.device, cfg.train.timeout_s)
    data = load_dataset(cfg.data)
    engine, _ = engine_for(cfg, ctx, data)
    try:
        engine.start()
        start = copy.deepcopy(engine.module).cpu()
        caught: dict[str, torch.Tensor] = {}
        hooks = [p.register_post_accumulate_grad_hook(_catch(caught, name))
                 for name, p in engine.module.named_parameters()]
        ops: list[Op] = []
        hooks += [layer.register_forward_hook(_record(ops, name))
                  for name, layer in engine.module.named_modules() if not list(layer.children())]
        batches = ShardedBatches(data, cfg.data.batch_size, *engine.shard, cfg.train.seed,
                                 cfg.data.augment and engine.feeds_inputs)
        x, y = next(iter(batches.epoch(0)))
        engine.train_step(x.to(ctx.device), y.to(ctx.device), batches.local_batch)
        for hook in hooks:
            hook.remove()
        after = {name: p.detach().cpu().clone() for name, p in engine.module.named_parameters()}
    finally:
        engine.close()
    return FirstStep(start, x, y, caught, after, ctx.device, ops)


def _catch(into: dict[str, torch.Tensor], name: str) -> Callable[[torch.Tensor], None]:
    """A hook that copies parameter `name`'s gradient to the CPU once backward wrote it."""
    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        into[name] = p.grad.detach().cpu().clone()
    return hook


def _record(into: list[Op], name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...],
                                                    torch.Tensor], None]:
    """A forward hook that appends the call to `into` and, once backward reaches the output,
    the gradient there."""
    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        op = Op(name, args[0].detach().cpu().clone(), out.detach().cpu().clone())
        into.append(op)
        if out.requires_grad:
            out.register_hook(lambda g: setattr(op, "grad_out", g.detach().cpu().clone()))
    return hook
