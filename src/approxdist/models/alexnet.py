"""A small AlexNet-like CNN (Krizhevsky et al. 2012, the model of seeds 001 and 002), scaled down.

Five conv blocks (64, 192, 384, 256, 256 channels; 3x3 kernels so small inputs work),
max-pooling after blocks 1, 2 and 5 only while the feature map is at least 2 pixels,
an adaptive pool to at most 2x2, then three fully-connected blocks with dropout.
"""

from __future__ import annotations

from torch import nn


def _conv(c_in: int, c_out: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, 1, 1), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def alexnet_small(input_shape: tuple[int, ...], classes: int, hidden: int = 512,
                  dropout: float = 0.5) -> nn.Sequential:
    c, h, w = input_shape
    size = min(h, w)
    blocks: list[nn.Module] = []
    c_in = c
    for i, c_out in enumerate((64, 192, 384, 256, 256)):
        pool = i in (0, 1, 4) and size >= 4
        blocks.append(_conv(c_in, c_out, pool))
        size = size // 2 if pool else size
        c_in = c_out
    side = min(2, size)
    blocks.append(nn.Sequential(nn.AdaptiveMaxPool2d(side), nn.Flatten(), nn.Dropout(dropout),
                                nn.Linear(c_in * side * side, hidden), nn.ReLU()))
    blocks.append(nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU()))
    blocks.append(nn.Linear(hidden, classes))
    return nn.Sequential(*blocks)
