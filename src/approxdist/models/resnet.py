"""CIFAR-style ResNet-(6n+2) of He et al. 2016 ("Deep Residual Learning", Sec. 4.2).

Blocks: a stem (3x3 conv, 16 channels, BN, ReLU), then 3 groups of n BasicBlocks with
16, 32, 64 channels (the first block of groups 2 and 3 halves the resolution), then a
head (global average pool, linear). Every BasicBlock is one element of the returned
`nn.Sequential`, so seed 000's cuts "after the first residual block" or "the middle
block" are block indices. Shortcuts where the shape changes:
- option A (the paper's CIFAR choice, default): identity on a stride-2 subsampled input,
  extra channels zero-padded; no parameters;
- option B: 1x1 convolution with stride 2, then batch norm (projection).
Any input size works (the head pools globally): 8x8 digits, 28x28 MNIST, 32x32 CIFAR.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


class PadShortcut(nn.Module):
    """Option A: subsample by `stride` and zero-pad channels from `c_in` to `c_out`."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.extra = c_out - c_in
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        lo = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, lo, self.extra - lo))


#: convolution and batch norm per number of spatial dimensions (images 2, signals 1)
_LAYERS: dict[int, tuple[type[nn.Conv1d | nn.Conv2d], type[nn.BatchNorm1d | nn.BatchNorm2d]]] = {
    1: (nn.Conv1d, nn.BatchNorm1d), 2: (nn.Conv2d, nn.BatchNorm2d)}


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with a residual connection (`dims` = 1: k=3 over a
    signal; its shortcut where the shape changes is always the projection)."""

    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: str, dims: int = 2) -> None:
        super().__init__()
        conv, norm = _LAYERS[dims]
        self.conv1 = conv(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = norm(c_out)
        self.conv2 = conv(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = norm(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            if shortcut == "A" and dims == 2:
                self.shortcut = PadShortcut(c_in, c_out, stride)
            else:
                self.shortcut = nn.Sequential(conv(c_in, c_out, 1, stride, bias=False),
                                              norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Stem(nn.Sequential):
    """First conv layer with batch norm and ReLU."""

    def __init__(self, c_in: int, width: int) -> None:
        super().__init__(nn.Conv2d(c_in, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU())


class Head(nn.Sequential):
    """Global average pooling and the classifier."""

    def __init__(self, c_in: int, classes: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))


def resnet_cifar(depth: int, input_shape: tuple[int, ...], classes: int, width: int = 16,
                 shortcut: str = "A") -> nn.Sequential:
    assert (depth - 2) % 6 == 0, depth
    n = (depth - 2) // 6
    blocks: list[nn.Module] = [Stem(input_shape[0], width)]
    c_in = width
    for group, c_out in enumerate((width, 2 * width, 4 * width)):
        for i in range(n):
            stride = 2 if group > 0 and i == 0 else 1
            blocks.append(BasicBlock(c_in, c_out, stride, shortcut))
            c_in = c_out
    blocks.append(Head(c_in, classes))
    model = nn.Sequential(*blocks)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def tp_plan(model: nn.Module) -> dict[str, str]:
    """Seed 003's split by channel, in every residual block: the first convolution's
    output channels (its batch norm per channel with them), the second's input channels
    (its partial sums summed: one all-reduce each way per block); the stem, the second
    batch norm, the shortcut and the head stay whole."""
    plan: dict[str, str] = {}
    for i, block in enumerate(model.children()):
        if isinstance(block, BasicBlock):
            plan.update({f"{i}.conv1": "channel_out", f"{i}.bn1": "channel_norm",
                         f"{i}.conv2": "channel_in"})
    return plan
