"""A multi-layer perceptron: flatten, `depth` hidden blocks (Linear + ReLU), a classifier."""

from __future__ import annotations

import math

from torch import nn


def mlp(input_shape: tuple[int, ...], classes: int, hidden: int = 256, depth: int = 3,
        dropout: float = 0.0) -> nn.Sequential:
    n_in = math.prod(input_shape)
    blocks: list[nn.Module] = []
    for i in range(depth):
        layers: list[nn.Module] = [nn.Flatten()] if i == 0 else []
        layers += [nn.Linear(n_in if i == 0 else hidden, hidden), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        blocks.append(nn.Sequential(*layers))
    head: list[nn.Module] = [nn.Flatten()] if depth == 0 else []
    blocks.append(nn.Sequential(*head, nn.Linear(hidden if depth else n_in, classes)))
    return nn.Sequential(*blocks)


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The linear layers in column-then-row pairs (Megatron-LM's MLP): the first of each
    pair splits its outputs, the second its inputs, one all-reduce each way per pair; an
    odd last layer stays whole."""
    linears = [f"{i}.{j}" for i, block in enumerate(model.children())
               for j, layer in enumerate(block.children()) if isinstance(layer, nn.Linear)]
    pairs = len(linears) // 2 * 2
    return {path: ("colwise" if k % 2 == 0 else "rowwise")
            for k, path in enumerate(linears[:pairs])}
