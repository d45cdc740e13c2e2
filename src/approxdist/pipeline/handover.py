"""Tensors handed between two stages of one rank (ZB-V's chunks P-1 and P): in memory, no
bytes, no codec, since nothing crosses a network."""

from __future__ import annotations

from typing import Any

import torch


class Handover:
    """Tensors between two stages of one rank, by (direction, receiving stage, micro-batch)."""

    def __init__(self) -> None:
        self.box: dict[tuple[str, int, int], Any] = {}

    def receipt(self, key: tuple[str, int, int]) -> Handed:
        return Handed(self.box, key)


class Handed:
    """A receive from a stage of the same rank: the tensor its send left in the box."""

    def __init__(self, box: dict[tuple[str, int, int], Any], key: tuple[str, int, int]) -> None:
        self.box, self.key = box, key

    def wait(self) -> torch.Tensor:
        return self.box.pop(self.key)
