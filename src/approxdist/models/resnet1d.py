"""A 1-D residual network for signals such as MNIST-1D, built like the CIFAR ResNets.

Blocks: stem (conv k=5, BN, ReLU), 3 groups of n residual blocks (widths w, 2w, 4w; the
first block of groups 2 and 3 halves the length, with a 1x1-conv projection shortcut),
head (global average pool, linear). Each residual block is one element of the
`nn.Sequential`, so a pipeline can cut it at any block boundary, as with `resnet20`.
"""

from __future__ import annotations

from torch import nn

from approxdist.models.resnet import BasicBlock


class BasicBlock1d(BasicBlock):
    """The CIFAR ResNets' `BasicBlock` over signals: two k=3 conv + BN layers with a
    residual connection (projection when shapes change); its own name in profiles."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__(c_in, c_out, stride, shortcut="B", dims=1)


def resnet1d(input_shape: tuple[int, ...], classes: int, width: int = 16,
             blocks_per_group: int = 1) -> nn.Sequential:
    c_in = input_shape[0]
    blocks: list[nn.Module] = [nn.Sequential(nn.Conv1d(c_in, width, 5, 1, 2, bias=False),
                                             nn.BatchNorm1d(width), nn.ReLU())]
    c = width
    for group, c_out in enumerate((width, 2 * width, 4 * width)):
        for i in range(blocks_per_group):
            blocks.append(BasicBlock1d(c, c_out, 2 if group > 0 and i == 0 else 1))
            c = c_out
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c, classes)))
    return nn.Sequential(*blocks)
